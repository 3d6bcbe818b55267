"""torch_xla's `torch_xla.experimental` package: experimental APIs land here as submodules."""

from .eager import eager_mode as eager_mode
from .eager import eager_mode_context as eager_mode_context
from .eager import is_eager_mode as is_eager_mode
