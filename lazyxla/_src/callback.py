"""torch_xla.experimental.callback: run a callback once a tensor's device buffer is ready.

A pending tensor is executed first (asynchronously, its own graph: the callback is for *that*
value); a waiter thread blocks on the buffer and then calls the callback, off the caller's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import jax
import torch

from . import graph
from .ir import DEVICE_DATA
from .tensor import is_lazy, read, state


def _on_ready(tensor: torch.Tensor, fn: Callable[[], None]) -> None:
    if not is_lazy(tensor):
        raise TypeError(
            f"on_ready_callback: expected a lazyxla tensor, got a {tensor.device} tensor"
        )
    s = state(tensor)
    if s.is_pending:
        graph.sync_states([s], wait=False)
    node = read(s)[0]
    array = node.data if node.op == DEVICE_DATA else None

    def wait() -> None:
        if array is not None:
            jax.block_until_ready(array)
        fn()

    threading.Thread(target=wait, name="lazyxla-on-ready", daemon=True).start()


def on_ready_callback(tensor: torch.Tensor, callback: Callable[[torch.Tensor], None]) -> None:
    """Call `callback(tensor)` (on another thread) once `tensor`'s buffer is ready."""
    _on_ready(tensor, lambda: callback(tensor))


def on_ready_event(tensor: torch.Tensor) -> threading.Event:
    """A `threading.Event` set once `tensor`'s buffer is ready."""
    event = threading.Event()
    _on_ready(tensor, event.set)
    return event
