"""torch_xla's `torch_xla.backends`: the default matmul/convolution precision for 32-bit inputs.

`set_mat_mul_precision('default' | 'high' | 'highest')` sets JAX's default matmul precision (the
executables compiled at the old precision are dropped); `get_mat_mul_precision()` reads it back.
"""

from .._src.backends import _WARNING_MESSAGE as _WARNING_MESSAGE
from .._src.backends import get_mat_mul_precision as get_mat_mul_precision
from .._src.backends import logger as logger
from .._src.backends import set_mat_mul_precision as set_mat_mul_precision

__all__ = ["get_mat_mul_precision", "set_mat_mul_precision"]
