"""The top-level `lazyxla.*` functions (torch_xla's `torch_xla.*`)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from . import analysis, graph, ir, random_state, runtime
from .analysis import GraphSummary
from .config import FLAGS
from .tensor import DEVICE_TYPE, state


def device(index: int | None = None) -> torch.device:
    """The lazyxla device (`jax:0` unless `index` is given); always carries an explicit index."""
    return torch.device(DEVICE_TYPE, 0 if index is None else index)


def devices() -> list[torch.device]:
    return [torch.device(DEVICE_TYPE, i) for i in range(device_count())]


def device_count() -> int:
    return len(runtime.jax_devices())


def real_devices() -> list[str]:
    """The PJRT devices behind `devices()`, named as torch_xla names them (`CPU:0`)."""
    return [f"{d.platform.upper()}:{d.id}" for d in runtime.jax_devices()]


def sync(wait: bool = False, reset_scope: bool = True) -> None:
    """Run the pending graph of all live lazy tensors; afterwards they hold device data.

    `reset_scope` is torch_xla's: the step ends the scopes `xp.Trace` opened, and, as in
    torch_xla, raises after running the step if one is still open (Note [Trace scopes]);
    anything but a bool is refused.
    """
    _sync(wait, reset_scope)


def _sync(wait: bool = False, reset_scope: bool = True, cause: str | None = None) -> None:
    if not isinstance(reset_scope, bool):
        raise TypeError(f"sync(reset_scope=...) takes a bool, got {reset_scope!r}")
    graph.sync(wait=wait, cause=cause)
    if reset_scope:
        from . import profiler

        profiler.check_scopes_empty()


analysis.ENTRY_POINTS.add(sync.__code__)


def manual_seed(seed: int) -> None:
    """Seed the device RNG (also done by `torch.manual_seed`)."""
    random_state.manual_seed(seed)


@contextlib.contextmanager
def step() -> Iterator[None]:
    """A region that is one step: pending work is synced on entry and the step's graph on exit.

    Like `torch_xla.step()`, the entry sync keeps work recorded before the region out of the step's
    graph. If the body raises, the exit sync still runs (its own errors are dropped).

    Example:
        >>> with lazyxla.step():
        ...     loss = model(x).sum(); loss.backward(); opt.step()
    """
    sync()
    try:
        yield
    except BaseException:
        _sync_after_error()
        raise
    sync()


def _sync_after_error() -> None:
    """A step whose body raised still ends with a sync (counted as `MarkStep`), as torch_xla's
    `step()` / `compile()` do in their `finally`; an error of that sync is dropped: the body's
    error is the one to report (the failing tensors keep theirs, Note [Failed graphs])."""
    try:
        sync()
    except Exception:
        pass


# --- graph identity ------------------------------------------------------------------------------


def _capture(tensors: Sequence[torch.Tensor] | None) -> graph.Capture:
    states = None if tensors is None else [state(t) for t in tensors]
    return graph.Capture(graph.pending_states(states))


def _expand(part: Any) -> Any:
    if isinstance(part, tuple):
        return (ir._desc_list[part[0]], part[1])
    return ir._desc_list[part]


def graph_hash(tensors: Sequence[torch.Tensor] | None = None) -> bytes:
    """A 16-byte hash of the pending graph computing `tensors` (all live tensors if None).

    Built from the same data-free key as the compile cache (see Note [Graph hashing]): new data
    gives the same hash, a new shape or op a different one.
    """
    return _key_hash(_capture(tensors).key)


def _key_hash(key: tuple) -> bytes:
    return hashlib.md5(repr(([_expand(p) for p in key[0]], key[1:])).encode()).digest()


# --- compile -------------------------------------------------------------------------------------


class _Compile(contextlib.ContextDecorator):
    """The object `compile()` returns: a context manager that is also a decorator."""

    def __init__(
        self,
        name: str | None,
        full_graph: bool,
        max_different_graphs: int | None,
        trace_once: bool = False,
    ):
        self.trace_once = trace_once
        self.name = name
        self.full_graph = full_graph
        self.max_different_graphs = max_different_graphs
        self.graphs: dict[bytes, GraphSummary] = {}
        self._saved: list[bool] = []
        self._eager: list[Any] = []  # eager mode is suspended inside the region (Note [Eager mode])

    def __call__(self, f: Callable[..., Any]) -> Callable[..., Any]:
        if self.name is None:
            self.name = getattr(f, "__name__", None) or str(f)
        body = f
        if self.trace_once:  # See Note [Trace once]: dynamo's guards decide when to retrace
            import torch

            body = torch.compile(f, backend="lazyxla", options={"sync": False})
        return functools.wraps(f)(super().__call__(body))

    def __enter__(self) -> _Compile:
        # pending work from before the region is not part of the compiled graph
        with analysis.graph_name(f"{self.name}_clear_pending" if self.name else None):
            _sync(cause=analysis.COMPILE_CLEAR)
        self._saved.append(graph._allow_execution)
        from . import eager

        self._eager.append(eager.suspended())
        self._eager[-1].__enter__()
        if self.full_graph:
            graph.set_allow_execution(False)
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        graph.set_allow_execution(self._saved.pop())
        self._eager.pop().__exit__(None, None, None)
        if exc_type is not None:
            _sync_after_error()
            return
        if self.max_different_graphs is not None:
            self._count_graph()
        with analysis.graph_name(self.name):
            _sync(cause=analysis.COMPILE)

    def _count_graph(self) -> None:
        cap = _capture(None)
        h = _key_hash(cap.key)
        if h in self.graphs:
            return
        summary = GraphSummary(cap)
        if len(self.graphs) >= self.max_different_graphs:
            last = next(reversed(self.graphs.values()))
            raise RuntimeError(
                f"{self.name or 'the compiled region'} produced {len(self.graphs) + 1} different "
                f"graphs, exceeding max_different_graphs={self.max_different_graphs}: "
                f"{summary.diff(last)}. Keep shapes static (pad inputs, drop the last partial "
                "batch) or raise max_different_graphs."
            )
        self.graphs[h] = summary


def compile(
    f: Callable[..., Any] | None = None,
    full_graph: bool = False,
    name: str | None = None,
    max_different_graphs: int | None = None,
    trace_once: bool = False,
) -> Any:
    """Trace `f` (or a `with` block) into one graph, as `torch_xla.compile`.

    Pending work is synced on entry; the region's graph is synced on exit.

    Args:
        f: the function to compile. If None, the result is a context manager that is also a
            decorator (`@lazyxla.compile()` or `with lazyxla.compile():`).
        full_graph: if True, anything that forces an execution inside the region (`.item()`,
            `.cpu()`, `print(t)`) raises `ExecutionNotAllowed` (a `RuntimeError`) instead of
            silently splitting the graph.
        name: the name used in errors; defaults to `f.__name__`.
        max_different_graphs: raise a `RuntimeError`, naming what changed, once the region has
            produced more distinct graphs than this (a shape that changes every step recompiles
            every step).
        trace_once: skip Python tracing after the first call (lazyxla's extension, for
            functions only). `f` runs under `torch.compile(backend="lazyxla")`: dynamo's guards
            check every input, parameter and piece of Python state the step reads (shapes,
            dtypes, devices, attribute values, globals), and only a failed guard retraces;
            each FX graph is replayed as one node of the step's graph, still synced once on
            exit. What it assumes is what torch.compile assumes: the step's Python side
            effects are ones dynamo can see (no data-dependent Python control flow on tensor
            values without a graph break; `.item()` or `print` inside break the graph and
            those parts run normally). `loss.backward()` is a graph break: the backward graph
            is still traced once, through AOTAutograd.

    Returns:
        The wrapped function, or the context manager / decorator if `f` is None.

    Example:
        >>> @lazyxla.compile(full_graph=True)
        ... def train_step(x, y):
        ...     loss = loss_fn(model(x), y); loss.backward(); opt.step(); return loss
    """
    c = _Compile(name, full_graph, max_different_graphs, trace_once)
    if f is None and trace_once:
        return _TraceOnceDecorator(c)
    return c if f is None else c(f)


class _TraceOnceDecorator:
    """`@lazyxla.compile(trace_once=True)`: only a decorator (a `with` block has no frame)."""

    def __init__(self, c: _Compile) -> None:
        self._c = c

    def __call__(self, f: Callable[..., Any]) -> Callable[..., Any]:
        return self._c(f)

    def __enter__(self) -> None:
        raise TypeError("trace_once=True compiles a function: use it as a decorator or wrapper")

    def __exit__(self, *exc: Any) -> None:
        return None


def launch(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    start_method: str = "spawn",
    debug_single_process: bool = False,
) -> None:
    """Run `fn(ordinal, *args)` in one process per device, as `torch_xla.launch`.

    On CPU that is `CPU_NUM_DEVICES` processes (see `launch.local_process_count`); under torchrun
    (each process already started) `fn(LOCAL_RANK, *args)` runs here. `debug_single_process=True`
    runs `fn(0, *args)` in this process. Only the `spawn` start method exists: a forked child
    would inherit JAX's runtime threads.
    """
    from . import launch as _launch

    if start_method not in ("spawn", "forkserver"):
        raise ValueError(
            f"start_method={start_method!r}: lazyxla starts fresh interpreters (spawn); "
            "fork would copy JAX's runtime threads into the children"
        )
    if os.environ.get("WORLD_SIZE") or os.environ.get("LAZYXLA_NUM_PROCESSES"):
        from . import distributed

        fn(distributed.local_rank(), *args)
        return
    _launch.spawn(fn, args, 1 if debug_single_process else None)


# --- environment ---------------------------------------------------------------------------------


def _write_metrics_file(path: str) -> None:
    from .metrics import metrics_report

    with open(path, "a") as f:
        f.write(metrics_report())


def apply_environment() -> None:
    """Act on torch_xla's environment variables that need an action at import.

    `XLA_USE_SPMD=1` enters SPMD mode; `XLA_METRICS_FILE=path` writes the metrics report there at
    exit.
    """
    if FLAGS.use_spmd:
        from . import runtime_api

        runtime_api.use_spmd()
    if FLAGS.metrics_file:
        atexit.register(_write_metrics_file, FLAGS.metrics_file)
