"""Eager mode: every op on a lazyxla tensor runs at once, as its own cached executable.

# Note [Eager mode]
torch_xla's eager mode (`torch_xla.experimental.eager_mode(True)`) executes each op as it is
called instead of recording a graph; only `torch_xla.compile` regions are traced into one graph.
lazyxla does it with a `TorchDispatchMode` pushed while eager mode is on: the op is recorded as
usual (below the mode, by the PrivateUse1 kernel), then the pending values of the lazy tensors it
touched (its outputs, and its arguments, which in-place ops write; a view's base with the view)
are synced. Their inputs are device data, so each graph is that one op, keyed like any graph: the
second time an op runs with the same shapes and dtypes it is a cache hit (`CachedCompile`), never
a new compile. Each sync dispatches asynchronously (`wait=False`), as torch_xla's eager ops do.
A `lazyxla.compile` / `torch_xla.compile` region suspends eager mode (its ops form one graph,
synced at the region's end), and so does tracing by dynamo. The mode costs nothing when eager
mode is off (it is not on the mode stack).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import analysis, graph, metrics
from .tensor import is_lazy, state

# As torch_xla's eager mode names them: a sync() in eager mode records no CompileTime/ExecuteTime.
_EAGER_NAMES = {"CompileTime": "EagerOpCompileTime", "ExecuteTime": "EagerOpExecuteTime"}


# Process-wide, not per thread: the autograd engine runs a region's backward ops on its own
# device thread, which carries the dispatch mode (torch propagates it) but not Python's TLS.
_suspend_count = 0
_suspend_lock = threading.Lock()


def _suspended() -> int:
    return _suspend_count


def _collect(v: Any, out: list[Any]) -> None:
    if isinstance(v, torch.Tensor):
        if is_lazy(v):
            out.append(v)
    elif isinstance(v, list | tuple):
        for x in v:
            _collect(x, out)


class _EagerMode(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if _suspended() or torch.compiler.is_compiling():
            return result
        tensors: list[torch.Tensor] = []
        _collect(result, tensors)
        _collect(args, tensors)
        if kwargs:
            _collect(list(kwargs.values()), tensors)
        _run_now(tensors)
        return result


def _run_now(tensors: list[torch.Tensor]) -> None:
    """Sync the pending values of `tensors` (and their views' bases) as eager ops."""
    if not tensors:
        return
    states, seen = [], set()
    for t in tensors:
        s = state(t)
        for x in (s, s.base):
            if x is not None and id(x) not in seen:
                seen.add(id(x))
                states.append(x)
    pending = graph.pending_states(states)
    if pending:
        with metrics.renamed(_EAGER_NAMES):
            graph.sync_states(pending, wait=False, cause=analysis.QUIET)


def ran_outside_dispatch(tensors: list[torch.Tensor]) -> None:
    """For ops recorded without the dispatcher (`xm.optimization_barrier_`): in eager mode they
    run at once too."""
    if _mode is not None and not _suspended() and not torch.compiler.is_compiling():
        _run_now(tensors)


_mode: _EagerMode | None = None


def eager_mode(enable: bool) -> None:
    """Turn eager mode on (each op runs at once) or off (ops are recorded until a sync)."""
    global _mode
    if enable and _mode is None:
        graph.sync()  # what was recorded before runs as one graph, not op by op
        _mode = _EagerMode()
        _mode.__enter__()
    elif not enable and _mode is not None:
        mode, _mode = _mode, None
        mode.__exit__(None, None, None)


def is_eager_mode() -> bool:
    """True while eager mode is on."""
    return _mode is not None


@contextlib.contextmanager
def eager_mode_context(enable: bool) -> Iterator[bool]:
    """Eager mode on or off inside the block; yields the previous setting."""
    saved = is_eager_mode()
    eager_mode(enable)
    try:
        yield saved
    finally:
        eager_mode(saved)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Record ops inside the block even in eager mode (a compiled region)."""
    global _suspend_count
    with _suspend_lock:
        _suspend_count += 1
    try:
        yield
    finally:
        with _suspend_lock:
            _suspend_count -= 1
