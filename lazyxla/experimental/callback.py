"""torch_xla's `torch_xla.experimental.callback`: callbacks when a tensor's buffer is ready."""

from .._src.callback import on_ready_callback as on_ready_callback
from .._src.callback import on_ready_event as on_ready_event

__all__ = ["on_ready_callback", "on_ready_event"]
