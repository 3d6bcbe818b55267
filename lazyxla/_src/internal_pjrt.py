"""torch_xla._internal.pjrt: run a function once per device and collect the results.

`run_multiprocess(fn, *args)` runs `fn(*args)` in one new process per local device (lazyxla's
launcher, the same one `xmp.spawn` uses) and returns `{ordinal: result}`; results travel back
pickled through files. As torch_xla's, it starts a process also for one device, so process-wide
state (a default process group, the runtime) starts fresh each call; `fn` must be picklable.
"""

from __future__ import annotations

import functools
import os
import pickle
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar

from . import launch, runtime_api

R = TypeVar("R")


class _Collect:
    """Picklable: run `fn` in a child and write its result to `<dir>/<ordinal>.pkl`."""

    def __init__(self, fn: Callable[[], Any], out_dir: str) -> None:
        self.fn, self.out_dir = fn, out_dir

    def __call__(self, index: int) -> None:
        result = self.fn()
        ordinal = runtime_api.global_ordinal()
        with open(os.path.join(self.out_dir, f"{ordinal}.pkl"), "wb") as f:
            pickle.dump(result, f)


def run_multiprocess(
    fn: Callable[..., R], *args: Any, start_method: str = "spawn", **kwargs: Any
) -> dict[int, R]:
    """`{ordinal: fn(*args, **kwargs)}` over one process per local device."""
    if start_method not in ("spawn", "forkserver"):
        raise ValueError(f"start_method={start_method!r}: lazyxla starts fresh interpreters")
    call = functools.partial(fn, *args, **kwargs)
    n = launch.local_process_count()
    with tempfile.TemporaryDirectory(prefix="lazyxla-pjrt-") as out:
        launch.spawn_processes(_Collect(call, out), (), n)
        results = {}
        for name in os.listdir(out):
            with open(os.path.join(out, name), "rb") as f:
                results[int(name.split(".")[0])] = pickle.load(f)
    if sorted(results) != list(range(n)):
        raise RuntimeError(
            f"run_multiprocess: results from ordinals {sorted(results)}, not 0..{n - 1}"
        )
    return dict(sorted(results.items()))


class _SpawnFn:
    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args

    def __call__(self) -> None:
        self.fn(runtime_api.global_ordinal(), *self.args)


def spawn(
    fn: Callable[..., Any], nprocs: int | None = None, start_method: str = "spawn", args: tuple = ()
) -> None:
    """`fn(ordinal, *args)` on every device (`nprocs` 1 or None, as torch_xla accepts)."""
    if nprocs not in (None, 1):
        raise ValueError(
            f"Unsupported nprocs ({nprocs}). Please use nprocs=1 or None (default); set "
            "CPU_NUM_DEVICES to choose how many devices (processes) to use"
        )
    if nprocs == 1:
        fn(0, *args)
        return
    run_multiprocess(_SpawnFn(fn, *args), start_method=start_method)
