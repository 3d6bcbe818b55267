"""torch_xla's `torch_xla.experimental.xla_quantized_matmul`: the `torch.ops.xla.quantized_matmul`
op (defined on import) and `XlaQuantizedLinear` (see Note [Quantized matmul])."""

from lazyxla._src.quantized_matmul import XlaQuantizedLinear as XlaQuantizedLinear
from lazyxla._src.quantized_matmul import _quantize_tensor as _quantize_tensor
from lazyxla._src.quantized_matmul import quantized_matmul as quantized_matmul

__all__ = ["XlaQuantizedLinear", "quantized_matmul"]
