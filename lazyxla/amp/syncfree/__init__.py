"""torch_xla's `torch_xla.amp.syncfree`: `step(found_inf=t)` skips on device."""

from ..._src.amp import SGD as SGD
from ..._src.amp import Adam as Adam
from ..._src.amp import AdamW as AdamW

__all__ = ["SGD", "Adam", "AdamW"]
