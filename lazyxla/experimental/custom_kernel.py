"""torch_xla's `torch_xla.experimental.custom_kernel`: memory-efficient attention kernels.

`flash_attention` runs a blockwise (online-softmax) kernel on CPU and the kernel JAX offers on
GPU/TPU; see Note [Blockwise attention] in `lazyxla/_src/attention.py`.
`repeat_with_fixed_output_size` is `repeat_interleave` with a static length.
"""

from .._src.attention import BLOCK_K as BLOCK_K
from .._src.attention import flash_attention as flash_attention
from .._src.fixed_repeat import repeat_with_fixed_output_size as repeat_with_fixed_output_size

__all__ = ["BLOCK_K", "flash_attention", "repeat_with_fixed_output_size"]
