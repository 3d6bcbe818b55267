"""torch_xla's `torch_xla.core.xla_builder` (`xb`): JAX functions and Op-builder functions as
ops of the lazy graph.

`call_jax(f, args, kwargs)` records `f` as one op (Note [call_jax] in
`lazyxla/_src/jax_interop.py`); `Op`, `Type` and `Shape` are torch_xla's op builder, over
`jax.lax` (Note [Op builder] in `lazyxla/_src/op_builder.py`). `create_placeholder_tensor` makes a
tensor with no buffer, for staging out graphs (Note [Placeholder tensors]).
"""

from .._src.jax_interop import _CACHE as _JAX_TO_XLA_COMPUTATION_CACHE
from .._src.jax_interop import cache_size as _jax_to_xla_computation_cache_elements
from .._src.jax_interop import call_jax as call_jax
from .._src.op_builder import XLA_PT_TYPE_MAP as _XLA_PT_TYPE_MAP
from .._src.op_builder import Computation as Computation
from .._src.op_builder import Op as Op
from .._src.op_builder import Shape as Shape
from .._src.op_builder import Type as Type
from .._src.op_builder import create_computation as create_computation
from .._src.op_builder import create_placeholder_tensor as create_placeholder_tensor
from .._src.op_builder import get_computation_hlo as get_computation_hlo
from .._src.op_builder import tensor_shape as tensor_shape
from .._src.op_builder import xla_computation_as_func as xla_computation_as_func

__all__ = [
    "_JAX_TO_XLA_COMPUTATION_CACHE",
    "_XLA_PT_TYPE_MAP",
    "_jax_to_xla_computation_cache_elements",
    "Computation",
    "Op",
    "Shape",
    "Type",
    "call_jax",
    "create_computation",
    "create_placeholder_tensor",
    "get_computation_hlo",
    "tensor_shape",
    "xla_computation_as_func",
]
