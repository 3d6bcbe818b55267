"""torch_xla's `torch_xla.experimental.deprecation`: deprecated aliases that warn once."""

from .._src.deprecation import deprecated as deprecated
from .._src.deprecation import mark_deprecated as mark_deprecated
from .._src.deprecation import register_deprecated as register_deprecated

__all__ = ["deprecated", "mark_deprecated", "register_deprecated"]
