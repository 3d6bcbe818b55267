"""Counters and metrics with torch_xla's names and report format.

A *counter* is an integer (`UncachedCompile`, `xla::add`, `aten::nonzero`). A *metric* is a series
of
samples (`CompileTime` in nanoseconds, `TensorsGraphSize` as a count, `InboundData` in bytes). The
report
layout matches `torch_xla.debug.metrics.metrics_report()` (see `shared/golden/`): the lazy-core
group first,
then the runtime group, each sorted by name.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import math
import queue
import threading
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from .config import FLAGS

_MAX_SAMPLES = 1024
_PERCENTILES = (0.01, 0.05, 0.10, 0.20, 0.50, 0.80, 0.90, 0.95, 0.99)

# Names that torch_xla reports in its second (runtime / computation client) group.
_RUNTIME_GROUP = frozenset(
    {
        "CompileTime",
        "ExecuteTime",
        "ExecuteReplicatedTime",
        "InboundData",
        "OutboundData",
        "TransferFromDeviceTime",
        "TransferToDeviceTime",
        "CreateCompileHandles",
        "CreateDataHandles",
        "MarkStep",
    }
)

# Unit of each metric; anything not listed is a plain number.
_TIME = "time"
_BYTES = "bytes"
_NUMBER = "number"
_UNITS = {
    "CompileTime": _TIME,
    "ExecuteTime": _TIME,
    "EagerOpCompileTime": _TIME,
    "EagerOpExecuteTime": _TIME,
    "TensorToData": _TIME,
    "LazyTracing": _TIME,
    "TransferToDeviceTime": _TIME,
    "TransferFromDeviceTime": _TIME,
    "InboundData": _BYTES,
    "OutboundData": _BYTES,
}


class _Metric:
    __slots__ = ("samples", "total", "accumulator")

    def __init__(self) -> None:
        self.samples: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=_MAX_SAMPLES
        )
        self.total = 0
        self.accumulator = 0.0


_lock = threading.Lock()
_counters: dict[str, int] = {}
_metrics: dict[str, _Metric] = {}


def counter_inc(name: str, value: int = 1) -> None:
    """Add `value` to counter `name` (created on first use)."""
    _counters[name] = _counters.get(name, 0) + value


def metric_add(name: str, value: float) -> None:
    """Record one sample of metric `name` (under its eager-mode name inside `renamed`)."""
    name = _renamed(name)
    with _lock:
        m = _metrics.get(name)
        if m is None:
            m = _metrics[name] = _Metric()
        m.samples.append((time.time(), float(value)))
        m.total += 1
        m.accumulator += value


class _ThreadRenames(threading.local):
    # A class default: a missing thread-local attribute costs ~1.5 us (an AttributeError).
    renames: dict[str, str] = {}  # (read, and replaced; never written in place)


_tls = _ThreadRenames()
# Names a mode records under (SPMD mode: an execution is torch_xla's ExecuteReplicatedTime).
mode_renames: dict[str, str] = {}


def _renamed(name: str) -> str:
    """`name` as recorded now: eager mode's name inside `renamed`, else the mode's."""
    name = mode_renames.get(name, name)
    renames = _tls.renames
    return renames.get(name, name) if renames else name


class renamed:
    """Record metrics under other names inside the block (eager mode's `EagerOpCompileTime`...)."""

    __slots__ = ("names", "saved")

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def __enter__(self) -> renamed:
        self.saved = _tls.renames
        _tls.renames = {**self.saved, **self.names}
        return self

    def __exit__(self, *exc: object) -> None:
        _tls.renames = self.saved


# Note [ExecuteTime]
# An execution is dispatched asynchronously: the call returns when XLA has queued the work, long
# before the results exist (0.15 ms recorded for a 1.4 s graph). `ExecuteTime` is the time from
# dispatch until the outputs are ready. torch_xla records it in a completion callback of its C++
# runtime, which costs the caller nothing. From Python the only exact equivalent is a thread that
# waits on each execution's outputs, and it costs the caller dearly on a small CPU: the thread
# takes the GIL when an execution is queued and again when it finishes, ~0.16 ms of the caller's
# time per execution on 2 cores (a compiled decoding step, three executions a token: 4.10 ms a
# token with the thread, 3.25 without). So lazyxla records a sample when it *sees* the outputs
# ready, at the points where it looks anyway: when it waits for results (a value read, a transfer
# to the host, `sync(wait=True)`, `wait_device_ops`), before each later execution, and when
# metrics are read or cleared (which wait for the executions still running, so a report after a
# sync always includes that sync's execution). Where the program waits for an execution the
# sample is its exact time; otherwise it is an upper bound, up to the next of those points (an
# asynchronous training loop: at most one step late). LAZYXLA_EXACT_EXECUTE_TIME=1 keeps a
# waiting thread for exact samples at that cost (`_ReadyTimer`).
class _ReadyTimer:
    """The exact clock: a background thread waits on each execution's outputs."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[str, int, Any] | None] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.start_lock = threading.Lock()

    def add(self, name: str, t0: int, arrays: Any) -> None:
        if self.thread is None:
            with self.start_lock:
                if self.thread is None:
                    self.thread = threading.Thread(
                        target=self._run, name="lazyxla-execute-timer", daemon=True
                    )
                    self.thread.start()
                    atexit.register(self.close)
        self.queue.put((name, t0, arrays))

    def _run(self) -> None:
        import jax

        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                name, t0, arrays = item
                try:
                    jax.block_until_ready(arrays)
                except Exception:  # a failed or deleted (donated) output: it is done either way
                    pass
                metric_add(name, time.perf_counter_ns() - t0)
            finally:
                self.queue.task_done()

    def drain(self) -> None:
        if self.thread is not None and threading.current_thread() is not self.thread:
            self.queue.join()

    def close(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            self.queue.put(None)
            self.thread.join(timeout=60)


def _is_done(probe: Any) -> bool:
    try:
        return probe.is_deleted() or probe.is_ready()
    except Exception:  # a failed execution's output: it is done either way
        return True


class _SeenReady:
    """The default clock: executions in flight, each timed when its outputs are next seen ready
    (Note [ExecuteTime]). One output stands for all: an execution's outputs are ready together."""

    def __init__(self) -> None:
        self.items: list[tuple[str, int, Any]] = []  # (metric, dispatch time, an output)
        self.waits_at_exit = False

    def add(self, name: str, t0: int, arrays: Any) -> None:
        if not self.waits_at_exit:
            # An execution still running at interpreter exit must finish before the runtime is
            # torn down under it (that crashed the process). Registered after the runtime
            # started, so it runs before the runtime's own exit handler.
            self.waits_at_exit = True
            atexit.register(self.drain)
        probe = next((a for a in arrays if not a.is_deleted()), None)
        if probe is None:  # no output to wait on: done with the call
            metric_add(name, time.perf_counter_ns() - t0)
        else:
            self.items.append((name, t0, probe))

    def observe(self) -> None:
        """Record the executions whose outputs are ready now, without waiting."""
        items, self.items = self.items, []
        now = time.perf_counter_ns()
        for item in items:
            if _is_done(item[2]):
                metric_add(item[0], now - item[1])
            else:
                self.items.append(item)

    def drain(self) -> None:
        """Wait for every execution in flight and record it."""
        items, self.items = self.items, []
        for name, t0, probe in items:
            if not _is_done(probe):
                with contextlib.suppress(Exception):  # (a failed execution is done too)
                    probe.block_until_ready()
            metric_add(name, time.perf_counter_ns() - t0)


_ready_timer = _ReadyTimer()
_seen_ready = _SeenReady()


def time_when_ready(name: str, t0: int, arrays: Any) -> None:
    """Record `now - t0` as a sample of `name` once `arrays` (an execution's outputs) are ready
    (Note [ExecuteTime])."""
    name = _renamed(name)
    if FLAGS.exact_execute_time:
        _ready_timer.add(name, t0, arrays)
    else:
        _seen_ready.add(name, t0, arrays)


def observe_executions() -> None:
    """Record the executions in flight that are finished now (call where the caller has waited
    for results anyway; cheap when nothing is in flight)."""
    if _seen_ready.items:
        _seen_ready.observe()


# Hot paths that time in aggregate (a kernel's tracing time) flush their totals here before any
# metric is read or cleared.
flush_hooks: list[Any] = []


def metric_add_many(name: str, total: float, count: int) -> None:
    """Record `count` samples of `name` summing to `total`, kept as one sample of their mean."""
    if count:
        metric_add(name, total / count)
        m = _metrics[_renamed(name)]
        m.total += count - 1
        m.accumulator += total - total / count


def wait_for_samples() -> None:
    """Wait until every outstanding `time_when_ready` sample is recorded."""
    for hook in flush_hooks:
        hook()
    _seen_ready.drain()
    _ready_timer.drain()


class timed:
    """Context manager recording the elapsed wall time of its body as a sample, in nanoseconds."""

    __slots__ = ("name", "t0")

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> timed:
        self.t0 = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        metric_add(self.name, time.perf_counter_ns() - self.t0)


def counter_value(name: str) -> int | None:
    """The counter's value, or None if it was never incremented since the last clear."""
    return _counters.get(name)


def _ordered(names: Iterable[str]) -> list[str]:
    names = list(names)
    first = sorted(n for n in names if n not in _RUNTIME_GROUP)
    second = sorted(n for n in names if n in _RUNTIME_GROUP)
    return first + second


def counter_names() -> list[str]:
    return _ordered(n for n, v in _counters.items() if v)


def metric_names() -> list[str]:
    wait_for_samples()
    return _ordered(n for n, m in _metrics.items() if m.total)


class MetricData(NamedTuple):
    total_samples: int
    accumulator: float
    samples: tuple[tuple[float, float], ...]


def metric_data(name: str) -> MetricData | None:
    """`(total_samples, accumulator, ((timestamp, value), ...))`, as torch_xla returns it."""
    wait_for_samples()
    m = _metrics.get(name)
    if m is None or not m.total:
        return None
    return MetricData(m.total, m.accumulator, tuple(m.samples))


def clear_counters() -> None:
    _counters.clear()


def clear_metrics() -> None:
    wait_for_samples()
    with _lock:
        _metrics.clear()


def clear_all() -> None:
    clear_counters()
    clear_metrics()


# --- formatting, matching torch_xla's HumanReadable* helpers -------------------------------------


def format_duration(ns: float) -> str:
    """`164749084` → `164ms749.084us`; `5450` → `005.450us`."""
    us_total = ns / 1000.0
    parts = []
    for unit, size, width in (("d", 86400e6, 1), ("h", 3600e6, 2), ("m", 60e6, 2), ("s", 1e6, 2)):
        if us_total >= size or parts:
            q = int(us_total // size)
            us_total -= q * size
            parts.append(f"{q:0{width}d}{unit}")
    ms = int(us_total // 1000)
    if ms or parts:
        us_total -= ms * 1000
        parts.append(f"{ms:03d}ms")
    parts.append(f"{us_total:07.3f}us")
    return "".join(parts)


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.2f}{unit}"
        n /= 1024.0
    raise AssertionError("unreachable")


def _fmt(name: str, value: float) -> str:
    unit = _UNITS.get(name, _NUMBER)
    if unit == _TIME:
        return format_duration(value)
    if unit == _BYTES:
        return format_bytes(value)
    return f"{value:.2f}"


def _percentile(sorted_values: list[float], q: float) -> float:
    idx = min(len(sorted_values) - 1, int(math.floor(q * len(sorted_values))))
    return sorted_values[idx]


def _metric_block(name: str, m: _Metric) -> list[str]:
    lines = [
        f"Metric: {name}",
        f"  TotalSamples: {m.total}",
        f"  Accumulator: {_fmt(name, m.accumulator)}",
    ]
    samples = list(m.samples)
    if len(samples) > 1:
        span = samples[-1][0] - samples[0][0]
        if span > 0:
            value_sum = sum(v for _, v in samples[1:])
            lines.append(f"  ValueRate: {_fmt(name, value_sum / span)} / second")
            lines.append(f"  Rate: {(len(samples) - 1) / span:.6g} / second")
    values = sorted(v for _, v in samples)
    pct = "; ".join(f"{int(q * 100)}%={_fmt(name, _percentile(values, q))}" for q in _PERCENTILES)
    lines.append(f"  Percentiles: {pct}")
    return lines


def _report(metric_filter: list[str] | None, counter_filter: list[str] | None) -> str:
    wait_for_samples()
    lines: list[str] = []
    if metric_filter is None or counter_filter is None:
        mnames, cnames = metric_names(), counter_names()
        for group in (False, True):
            for n in mnames:
                if (n in _RUNTIME_GROUP) == group:
                    lines.extend(_metric_block(n, _metrics[n]))
            for n in cnames:
                if (n in _RUNTIME_GROUP) == group:
                    lines.extend((f"Counter: {n}", f"  Value: {_counters[n]}"))
    else:
        # A filtered report keeps the order the caller asked for, as torch_xla's does.
        for n in metric_filter:
            m = _metrics.get(n)
            if m is not None and m.total:
                lines.extend(_metric_block(n, m))
        fallbacks = sorted(n for n in _counters if n.startswith("aten::"))
        for n in [*counter_filter, *fallbacks]:
            if _counters.get(n):
                lines.extend((f"Counter: {n}", f"  Value: {_counters[n]}"))
    return "\n".join(lines) + ("\n" if lines else "")


def metrics_report() -> str:
    """Every metric and counter, in torch_xla's report format."""
    return _report(None, None)


def short_metrics_report(
    counter_names: list[str] | None = None, metric_names: list[str] | None = None
) -> str:
    """The metrics a user looks at first, plus every CPU fallback counter (`aten::*`)."""
    if metric_names is None:
        metric_names = [
            "CompileTime",
            "ExecuteTime",
            "ExecuteReplicatedTime",
            "TransferToDeviceTime",
            "TransferFromDeviceTime",
        ]
    if counter_names is None:
        counter_names = ["CachedCompile", "MarkStep"]
    return _report(metric_names, counter_names)


# `aten::*` counters of value reads, counted under torch_xla's fallback name (torch_xla runs them on
# its CPU fallback) although no op runs on the CPU here.
READS_NOT_FALLBACKS = frozenset({"aten::_local_scalar_dense"})


def executed_fallback_ops() -> list[str]:
    """torch_xla's list of the ops that went through its CPU fallback since the last clear: the
    counter names (`aten::nonzero`, `aten::repeat_interleave.Tensor`), `.item()`'s
    `aten::_local_scalar_dense` included, as torch_xla counts it."""
    return sorted(n for n, v in _counters.items() if v and n.startswith("aten::"))


def cpu_fallback_ops() -> list[str]:
    """The ops that ran on the CPU since the last clear (`nonzero`, `repeat_interleave.Tensor`):
    `executed_fallback_ops()` without its prefix and without value reads, which run no op."""
    return [n[len("aten::") :] for n in executed_fallback_ops() if n not in READS_NOT_FALLBACKS]
