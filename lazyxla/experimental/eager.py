"""torch_xla's `torch_xla.experimental.eager`: eager mode on/off (Note [Eager mode])."""

from .._src.eager import eager_mode as eager_mode
from .._src.eager import eager_mode_context as eager_mode_context
from .._src.eager import is_eager_mode as is_eager_mode

__all__ = ["eager_mode", "eager_mode_context", "is_eager_mode"]
