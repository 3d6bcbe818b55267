"""torch_xla's `torch_xla.amp.autocast_mode`."""

from .._src.amp import autocast as autocast

__all__ = ["autocast"]
