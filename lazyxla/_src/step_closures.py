"""Step closures: callbacks that run after the next sync (`xm.add_step_closure`).

torch_xla runs the closures registered during a step right after that step's graph is executed, so
a closure that reads a tensor (`loss.item()`) finds device data instead of forcing an execution in
the middle of tracing. Closures registered with `run_async=True` run, in order, on one background
thread; an exception raised by one of them is re-raised by the next sync, as torch_xla does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_lock = threading.Lock()
_pending: list[tuple[Callable[..., Any], tuple[Any, ...], bool]] = []
_async_pool: ThreadPoolExecutor | None = None
_async_futures: list[Future[Any]] = []
_async_error: BaseException | None = None


def add(closure: Callable[..., Any], args: Sequence[Any] = (), run_async: bool = False) -> None:
    """Register `closure(*args)` to run after the next sync."""
    with _lock:
        _pending.append((closure, tuple(args), run_async))


def pending_count() -> int:
    with _lock:
        return len(_pending)


def _run_async(closure: Callable[..., Any], args: tuple[Any, ...]) -> None:
    global _async_error
    try:
        closure(*args)
    except BaseException as e:  # stored, re-raised on the caller's thread by the next sync
        _async_error = e


def _raise_async_error() -> None:
    global _async_error
    err, _async_error = _async_error, None
    if err is not None:
        raise RuntimeError(f"an asynchronous step closure raised: {err!r}") from err


def run_pending() -> None:
    """Run (or, for async ones, schedule) every closure registered so far; called by `sync`.

    The list is taken before running, so a closure may register closures (or sync) itself.
    """
    global _async_pool
    _raise_async_error()
    with _lock:
        todo = _pending[:]
        _pending.clear()
    _async_futures[:] = [f for f in _async_futures if not f.done()]
    for closure, args, run_async in todo:
        if run_async:
            if _async_pool is None:
                _async_pool = ThreadPoolExecutor(1, thread_name_prefix="lazyxla-step-closure")
            _async_futures.append(_async_pool.submit(_run_async, closure, args))
        else:
            closure(*args)


def wait_async() -> None:
    """Block until every scheduled asynchronous closure has finished; re-raise a failure."""
    while _async_futures:
        _async_futures.pop(0).result()
    _raise_async_error()
