"""torch_xla's `torch_xla.distributed.xla_multiprocessing` (`xmp`): one process per device."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from .._src import distributed
from .._src import launch as _launch


def spawn(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    nprocs: int | None = None,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
) -> None:
    """Run `fn(ordinal, *args)` in `nprocs` processes (default: one per device).

    Unlike torch_xla, any `nprocs` is accepted (torch_xla takes 1 or None). `join=False` and
    `daemon=True` are refused: the launcher must watch its children to stop them all when one
    fails.
    """
    if not join or daemon:
        raise ValueError(
            "xmp.spawn(join=False / daemon=True) is not supported: lazyxla's launcher waits for "
            "its processes so that one failure stops them all"
        )
    if start_method not in ("spawn", "forkserver"):
        raise ValueError(
            f"start_method={start_method!r}: lazyxla starts fresh interpreters (spawn); fork "
            "would copy JAX's runtime threads into the children"
        )
    _launch.spawn(fn, args, nprocs)


class MpModelWrapper:
    """Holds a CPU model; `to(device)` moves it (torch_xla's host-memory saver for `fork`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model

    def to(self, device: Any) -> torch.nn.Module:
        return self._model.to(device)


class MpSerialExecutor:
    """Run a function in one process at a time, in ordinal order (e.g. a dataset download)."""

    _ids = itertools.count()

    def __init__(self) -> None:
        self._id = next(self._ids)
        self._calls = itertools.count()

    def run(self, fn: Callable[[], Any]) -> Any:
        call = next(self._calls)
        me = distributed.process_index()
        result = None
        for turn in range(distributed.process_count()):
            if turn == me:
                result = fn()
            distributed.barrier(f"serial/{self._id}/{call}/{turn}")
        return result


__all__ = ["MpModelWrapper", "MpSerialExecutor", "spawn"]
