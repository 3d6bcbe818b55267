"""torch_xla's `torch_xla.amp`: autocast, a sync-free GradScaler, sync-free optimizers."""

from .._src.amp import GradScaler as GradScaler
from .._src.amp import autocast as autocast
from . import syncfree as syncfree

__all__ = ["GradScaler", "autocast", "syncfree"]
