"""Sync: capture the pending graph of live tensors, find or compile its executable, run it, bind
results.

# Note [Graph hashing]
The cache key of a graph is built at sync time from the post-order of the nodes reachable from the
roots. Each node contributes its descriptor id (op, static arguments, output specs; interned once at
record time, see ir.py) and the post-order *positions* of its inputs; leaves contribute only their
spec (and sharding). Array data and lifted scalar values are inputs of the jitted function, never
part of the key, so new data or a new learning rate reuses the executable. Numbering inputs by
position is what tells `(a-b)+(b-a)` from `(a-b)+(a-b)` when `a` and `b` have the same spec: a hash
built from specs alone would collide. Each lifted scalar is its own argument (Note [Scalars are
arguments]).
"""

from __future__ import annotations

import collections
import functools
import gc
import math
import os
import time
import warnings
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np
import torch

from . import (
    analysis,
    collectives,
    exe_cache,
    metrics,
    runtime,
    sharding,
    step_closures,
)
from .config import FLAGS
from .donation import DONATE, donation_marked, donation_mask, paired_root_order
from .donation import alias_with_buffer_donor as _alias_with_buffer_donor
from .ir import DEVICE_DATA, SCALAR, Node, device_data, post_order
from .lower import Program
from .runtime import jnp_dtype
from .sharding import is_spmd as spmd
from .sharding import output_sharding
from .tensor import STATE_FILL_OPS, HostState, LazyState, bind_data, live_states, read

# Note [Memory maps of executables]
# Every kernel XLA:CPU compiles is mapped into the process on its own (~15 memory maps for a
# graph of four ops, more for larger ones), and Linux caps a process's maps (vm.max_map_count,
# 65530 by default). A thousand cached executables of mid-sized graphs reach the cap, and the next
# compile's mapping fails inside LLVM: a segmentation fault, no Python error (pytorch/xla's
# test_python_ops.py crashed so after ~800 compiles). So the cache is also bounded by the maps
# the process holds: past 60 % of the cap, least recently used executables are dropped (their
# maps go with them) until it holds about half.
_MAPS_HIGH, _MAPS_LOW = 0.6, 0.5


def _map_limit() -> int | None:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None  # not Linux: no such limit to keep under


def _map_count() -> int:
    with open("/proc/self/maps", "rb") as f:
        return sum(1 for _ in f)


class GraphCache:
    """In-memory map from graph key to compiled executable, least recently used evicted first.

    Bounded (XLA_COMPILATION_CACHE_SIZE, torch_xla's name and default, 1024): a program that makes
    thousands of distinct graphs must not hold every executable until the compiler runs out of
    memory, nor the process's memory maps (Note [Memory maps of executables]). An evicted graph
    that comes back compiles again (counted as UncachedCompile).
    """

    map_limit = _map_limit()

    def __init__(self) -> None:
        self.entries: collections.OrderedDict[tuple, Any] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: tuple) -> Any:
        exe = self.entries.get(key)
        if exe is not None:
            self.entries.move_to_end(key)
        return exe

    def put(self, key: tuple, exe: Any) -> None:
        self.entries[key] = exe
        while len(self.entries) > max(1, FLAGS.compilation_cache_size):
            self._evict()
        if self.map_limit is not None:
            self._keep_maps_under(self.map_limit)

    def _evict(self) -> None:
        self.entries.popitem(last=False)
        metrics.counter_inc("CompilationCacheEvict")

    def _keep_maps_under(self, limit: int) -> None:
        maps = _map_count()
        while maps > _MAPS_HIGH * limit and len(self.entries) > 1:
            # maps per cached executable, on average: drop enough of the oldest to reach LOW
            per_entry = max(1.0, maps / len(self.entries))
            n = min(len(self.entries) - 1, math.ceil((maps - _MAPS_LOW * limit) / per_entry))
            for _ in range(max(1, n)):
                self._evict()
            gc.collect()  # (an executable held in a reference cycle keeps its maps)
            maps = _map_count()

    def clear(self) -> None:
        self.entries.clear()


CACHE = GraphCache()
_allow_execution = True
# The executable the last sync ran (lazyxla.debug.memory_analysis() reads its memory stats).
last_executable: Any = None


class ExecutionNotAllowed(RuntimeError):
    pass


def set_allow_execution(allow: bool) -> None:
    global _allow_execution
    _allow_execution = allow


# Note [Scalars are arguments]
# Each lifted Python scalar is its own 0-d argument of the executable, as each is its own device
# data in torch_xla. Packed into one vector per dtype (one transfer), every use would read its
# element at a constant offset, and XLA fuses that slice into the consumer: the fused kernels of
# identical layers or parameters (an optimizer's update of each of a model's weights) then differ
# by that offset alone, and XLA:CPU, which compiles each distinct kernel once, compiled hundreds
# (a 16-layer decoder's AdamW step: 380 kernels, 5.7 s). As arguments, they share kernels. The
# cost is the executable call's per-argument conversion, ~3 us a scalar on this CPU, ~0.5 us for a
# value passed as a device array (Note [Scalars seen again], runtime.py). Unpacking the vector
# first, behind an optimization barrier, keeps the kernels shared but makes each element's slice
# a kernel of its own, again distinct by offset: 200 slices compiled in 1.5 s, and the 16-layer
# decoder's first compile went from 3.9 to 7.1 s.


def _scalar_vector(values: list[Any], dt: np.dtype) -> np.ndarray:
    """Lifted Python scalars as one vector of `dt`, each rounded as eager rounds it.

    c10's Half (and BFloat16) convert from float, so eager turns a Python float into float16 in
    two steps, double -> float -> half; numpy rounds double -> half in one, and differs where the
    float32 step lands on a half-way point (1 + 2**-11 + 2**-40: eager 1.0, numpy 1.000977).
    ml_dtypes' bfloat16 already goes through float32.
    """
    if dt == np.float16:
        with np.errstate(over="ignore"):  # out of range: inf, as eager's cast gives
            return np.asarray(values, np.float32).astype(np.float16)
    if dt.kind in "iu":
        try:
            return np.asarray(values, dtype=dt)
        except OverflowError:
            # A Python int out of the tensor's range (`uint8_tensor.add_(-1)`): eager wraps it
            # modulo 2**bits, as C++ converts it; numpy refuses.
            bits = dt.itemsize * 8
            unsigned = np.dtype(f"u{dt.itemsize}")
            return np.asarray([int(v) % (1 << bits) for v in values], unsigned).view(dt)
    return np.asarray(values, dtype=dt)


# Note [Roots in graph order]
# A sync's roots are the live pending tensors, walked in creation order (a stable post-order), then
# numbered in the order the walk reached their values. Creation order alone would make two steps
# of one training loop different graphs: step 1 creates the optimizer state after the gradients,
# step 2 the gradients after the state (zero_grad dropped them), so the same outputs came in
# another order (a second compile). The walk reaches the state and the gradients through the
# parameters' updates, in the same order in both steps.


def _fill_data(n: Node, shared: bool = False) -> Node:
    """A fill as a device data leaf holding its values: a state's first fill (Note [A state's
    first value is data]), or with `shared` a small fill passed as data, its array shared through
    the device data cache (Note [Fills passed as data])."""
    spec = n.specs[0]
    value = STATE_FILL_OPS[n.op]
    if shared:
        return device_data(runtime.filled(value, spec.shape, spec.dtype), spec)
    # An upload, not jnp.zeros: that compiles a program per shape (counted as compiles)
    values = torch.full(spec.shape, value, dtype=spec.dtype)
    return device_data(runtime.host_to_device(values, copy=False), spec)


class Capture:
    """A pending graph, numbered: its key, its inputs, and where its outputs go."""

    def __init__(self, states: list[LazyState], donate: bool = False, full: bool = False) -> None:
        # Nodes are keyed by themselves (they hash by identity), not by id(): a sync walks every
        # pending node, and an id() call per visit was a tenth of its Python time.
        root_index: dict[tuple[Node, int], int] = {}
        root_values: list[tuple[Node, int]] = []
        self.bindings: list[tuple[LazyState, int]] = []
        out_shardings: list[Any] = []
        for s in states:
            v = s.value
            r = root_index.get(v)
            if r is None:
                r = root_index[v] = len(root_values)
                root_values.append(v)
                ann = s.sharding
                out_shardings.append(getattr(ann, "named", None))
            self.bindings.append((s, r))
        self.out_shardings = tuple(out_shardings)  # See Note [Sharding]
        self.root_values = root_values
        # Note [A state's first value is data] in tensor.py: such a fill is a data leaf.
        fills = set() if spmd() else {s.fill for s in states if s.fill is not None}
        stop = fills.__contains__ if fills else None
        nodes = post_order([n for n, _ in root_values], stop)
        pos: dict[Node, int] = {}
        parts: list[Any] = []
        data: list[jax.Array] = []
        scalars: dict[np.dtype, list[Any]] = {}
        scalar_order: list[np.dtype] = []
        self.fill_data: dict[int, Node] = {}  # a state's first fill's id -> its data node
        for i, n in enumerate(nodes):
            pos[n] = i
            if n.op == DEVICE_DATA:
                data.append(n.data)
                parts.append(n.desc)
            elif n.op == SCALAR:
                dt = jnp_dtype(n.specs[0].dtype)
                scalars.setdefault(dt, []).append(n.data)
                scalar_order.append(dt)
                parts.append(n.desc)
            elif fills and n in fills:
                d = self.fill_data[id(n)] = _fill_data(n)
                data.append(d.data)
                parts.append(d.desc)
            elif len(n.inputs) == 1:  # (most nodes: spelled out, no comprehension's frame)
                ((x, k),) = n.inputs
                parts.append((n.desc, ((pos[x], k),)))
            elif n.inputs:
                parts.append((n.desc, tuple([(pos[x], k) for x, k in n.inputs])))
            else:
                parts.append(n.desc)
        if len(root_values) > 1:  # Note [Roots in graph order]
            order = sorted(
                range(len(root_values)),
                key=lambda r: (pos[root_values[r][0]], root_values[r][1]),
            )
            if any(r != i for i, r in enumerate(order)):
                self._reorder_roots(order)
        self.nodes = nodes
        self.pos = pos
        # Marked donors count in a full sync, or while torch_xla's buffer donor config is on
        # (Note [Buffer donor config] in dynamo.py); a hash or a partial sync ignores them.
        marked = (
            donation_marked[0] and any(n.meta == DONATE for n in nodes if n.op == DEVICE_DATA)
        ) and (full or _alias_with_buffer_donor())
        self.donate: tuple[bool, ...] = ()
        if donate or marked:
            data_nodes = self.data_nodes()
            self.donate = donation_mask(data_nodes, self.root_values)
            if any(self.donate):  # Note [Donated buffers pair with their updates]
                order = paired_root_order(data_nodes, self.donate, self.root_values, self.fill_data)
                if order is not None:
                    self._reorder_roots(order)
        self.roots = [(pos[n], k) for n, k in self.root_values]
        self.checked = FLAGS.check_indices  # Note [Checked indices]
        self.key = (tuple(parts), tuple(self.roots), self.out_shardings, self.donate)
        if self.checked:
            self.key += ("checked indices",)
        self.data = sharding.align_device_order(data, nodes, out_shardings) if spmd() else data
        # numpy 0-d values in node order (each a numpy scalar: typed, not a weak Python number)
        rounded = {dt: iter(_scalar_vector(v, dt)) for dt, v in scalars.items()}
        self.scalars = [next(rounded[dt]) for dt in scalar_order]
        # Note [Cross-process collectives]: such a graph runs as one program over all processes.
        self.replicas = collectives.active() and collectives.has_collectives(nodes)

    def _reorder_roots(self, order: list[int]) -> None:
        """Make the outputs come in `order` (root indices)."""
        new_index = [0] * len(order)
        for i, r in enumerate(order):
            new_index[r] = i
        self.root_values = [self.root_values[r] for r in order]
        self.out_shardings = tuple(self.out_shardings[r] for r in order)
        self.bindings = [(s, new_index[r]) for s, r in self.bindings]

    def data_nodes(self) -> list[Node]:
        """The data leaves, in the order of the executable's data arguments."""
        fill_data = self.fill_data
        if not fill_data:
            return [n for n in self.nodes if n.op == DEVICE_DATA]
        return [
            fill_data.get(id(n), n) for n in self.nodes if n.op == DEVICE_DATA or id(n) in fill_data
        ]

    def program(self) -> Program:
        leaves = frozenset(self.fill_data)
        pos = {id(n): i for n, i in self.pos.items()}
        return Program(self.nodes, pos, self.roots, self.out_shardings, leaf_ids=leaves)

    def args(self) -> tuple:
        """The executable's arguments: (donated data, kept data, scalars) or (data, scalars)."""
        scalars = self.scalars
        if scalars and not self.replicas and not spmd():  # Note [Scalars seen again]
            scalars = runtime.KEPT_SCALARS.arrays(scalars)
        if not any(self.donate):
            args: tuple = (self.data, scalars)
        else:
            donated = [a for a, d in zip(self.data, self.donate) if d]
            kept = [a for a, d in zip(self.data, self.donate) if not d]
            args = (donated, kept, scalars)
        return collectives.globalize(args) if self.replicas else args

    def function(self) -> Any:
        run = self.program().function()
        if self.checked:
            run = _checked(run)
        if self.replicas:
            run = collectives.across_processes(run)
        if not any(self.donate):
            return jax.jit(run)
        mask = self.donate

        def split_run(donated: list, kept: list, scalars: list) -> list:
            it_d, it_k = iter(donated), iter(kept)
            return run([next(it_d) if d else next(it_k) for d in mask], scalars)

        return jax.jit(split_run, donate_argnums=(0,))


def pending_states(tensors_states: Iterable[LazyState] | None) -> list[LazyState]:
    """The states a sync runs: all live pending ones except failed ones (Note [Failed graphs]),
    or the given ones (a read retries a failed tensor)."""
    if tensors_states is None:
        return [
            s
            for s in live_states()
            if (s.base is None or s.seen == s.base.version)
            and type(s) is not HostState  # (Note [SPMD virtual device])
            and s.value[0].op != DEVICE_DATA
            and s.failed is None
        ]
    candidates = list(tensors_states)
    for s in candidates:
        read(s)  # refresh stale views before capture
    return [s for s in candidates if s.value[0].op != DEVICE_DATA]


def compile_capture(cap: Capture, cause: str = analysis.VALUE_ACCESS) -> Any:
    """The executable for `cap`, from the cache or freshly compiled (counted either way).
    `cause`: why the graph runs, for PT_XLA_DEBUG_LEVEL (analysis.py)."""
    exe = CACHE.get(cap.key)
    if exe is not None:
        metrics.counter_inc("CachedCompile")
        return exe
    metrics.counter_inc("UncachedCompile")
    debug = analysis.level() if cause is not analysis.QUIET else 0
    if cause is not analysis.QUIET:
        analysis.count_compile(cap)  # Note [Recompiles at one line]
    if debug:
        analysis.compilation(cap, cause)
    with metrics.timed("CompileTime"):
        exe = _compile(cap)
    metrics.counter_inc("CreateCompileHandles")
    largest = max(
        (math.prod(n.specs[k].shape) * n.specs[k].dtype.itemsize for n, k in cap.root_values),
        default=0,
    )
    runtime.check_fits(exe, largest)  # Note [Out of memory before running]
    # torch_xla compiles through StableHLO when XLA_STABLEHLO_COMPILE is set (read at each compile)
    # and counts it; JAX always lowers to StableHLO, so here the flag only turns the count on.
    if os.environ.get("XLA_STABLEHLO_COMPILE", "0").lower() in ("1", "true"):
        metrics.counter_inc("StableHloCompile")
    if debug:
        analysis.post_compilation(cap, exe)
    CACHE.put(cap.key, exe)
    _freeze_long_lived()
    return exe


def _compile(cap: Capture) -> Any:
    """`cap`'s executable: from the persistent cache's graph index if it is there (Note
    [Executables on disk by graph key]), else lowered and compiled (and indexed)."""
    from . import runtime_api

    cache_dir = runtime_api._cache_path
    key = exe_cache.digest(cap) if cache_dir is not None else None
    if key is not None:
        exe = exe_cache.load(cache_dir, key)
        if exe is not None:
            metrics.counter_inc("PersistentCacheHit")
            return exe
    lowered = _lower(cap)
    if cap.replicas:
        collectives.check_same_program(lowered)
    exe = lowered.compile()
    if key is not None and not runtime_api._cache_readonly:
        exe_cache.store(cache_dir, key, exe)
    return exe


def sync_states(
    states: list[LazyState] | None, wait: bool = False, cause: str | None = None
) -> None:
    """Execute the pending values of `states` (all live tensors if None) and bind their data.
    `cause`: why, for PT_XLA_DEBUG_LEVEL (default: a user sync, or a read of a value).

    A graph that fails to compile or run loses nothing: the tensors that fail on their own are
    marked failed (a read retries them), every other one gets its value, and the error is raised
    here (Note [Failed graphs])."""
    pending = pending_states(states)
    if states is None and pending:
        from . import manual

        pending = manual.without_open_regions(pending)
    if not pending:
        if wait and states is None:
            # Nothing to run: wait for what earlier syncs dispatched, as torch_xla's sync barrier
            # does (a loop of `sync()` closed by `sync(wait=True)` returned before its last step).
            jax.block_until_ready(live_device_arrays())
            metrics.observe_executions()
        return
    if not _allow_execution:
        raise ExecutionNotAllowed(
            "Unexpected execution happens inside the compiled function, exiting. "
            "Function execution is not allowed: an operation forced the pending graph to run "
            "inside a region compiled with full_graph=True (or after set_allow_execution(False))"
        )
    if cause is None:
        cause = analysis.USER_SYNC if states is None else analysis.VALUE_ACCESS
    try:
        _execute(pending, states is None and FLAGS.donate_buffers, cause, wait, states is None)
    except ExecutionNotAllowed:
        raise
    except Exception as err:
        _isolate(pending, err, cause)
        raise


# Note [One SPMD execution at a time on the CPU]
# XLA:CPU runs the per-device parts of an SPMD program on a shared thread pool, and a collective
# (one GSPMD inserted or an explicit one) holds each part until every part has arrived. With
# executions dispatched asynchronously, the parts of the next program that reached its all-reduce
# can hold the pool's threads while the previous program's remaining parts wait for one: the
# rendezvous times out and XLA aborts the process (eager mode under SPMD, one small program per op,
# deadlocked on 4 devices of a 2-core machine: torch_xla's eager SPMD data-parallel example). So
# on the CPU platform an SPMD execution waits for the one before it; GPU and TPU keep dispatching
# asynchronously.
_inflight: list[Any] = []


@functools.cache
def _cpu_platform() -> bool:
    return jax.devices()[0].platform == "cpu"


def _one_at_a_time() -> bool:
    return spmd() and _cpu_platform()


def _await_previous() -> None:
    while _inflight:
        outs = _inflight.pop()
        jax.block_until_ready([o for o in outs if not o.is_deleted()])
    metrics.observe_executions()


def _execute(
    pending: list[LazyState], donate: bool, cause: str, wait: bool, full: bool = False
) -> None:
    cap = Capture(pending, donate=donate, full=full)
    metrics.metric_add("TensorsGraphSize", len(cap.nodes))
    if FLAGS.save_tensors_file:
        analysis.save_graph(cap, cause)
    exe = compile_capture(cap, cause)
    global last_executable
    last_executable = exe
    if cause is not analysis.QUIET and analysis.level() >= 2:
        analysis.execution(cap, cause)
    if full or cap.donate:  # as torch_xla: a sample per step barrier, 0 when nothing is donated
        metrics.metric_add("InputOutputAliasCount", sum(cap.donate))
    if _one_at_a_time():  # Note [One SPMD execution at a time on the CPU]
        _await_previous()
    metrics.observe_executions()  # (those finished by now: Note [ExecuteTime])
    t0 = time.perf_counter_ns()
    outs = exe(*cap.args())
    index_error = None
    if cap.checked and type(outs) is tuple:  # (an unchecked one: see `_lower`)
        index_error, outs = outs
    if cap.replicas:
        outs = collectives.localize(outs)
    if _one_at_a_time():
        _inflight.append(outs)
    if wait:
        jax.block_until_ready(outs)
        metrics.metric_add("ExecuteTime", time.perf_counter_ns() - t0)
        metrics.observe_executions()
    else:  # timed when its outputs are seen ready (Note [ExecuteTime])
        metrics.time_when_ready("ExecuteTime", t0, outs)
    # torch_xla counts an SPMD program's execution as ExecuteReplicated (over every device).
    metrics.counter_inc("ExecuteReplicated" if sharding.is_spmd() else "ExecuteComputation")
    data_nodes = [
        device_data(arr, n.specs[k], sharding=output_sharding(arr))
        for arr, (n, k) in zip(outs, cap.root_values, strict=True)
    ]
    for s, r in cap.bindings:
        bind_data(s, data_nodes[r])
        s.failed = None
    if index_error is not None:
        _raise_index_error(index_error)


# Note [Checked indices]
# XLA defines every index: a gather clamps an out-of-range index (or, as lazyxla lowers
# `index_select`/`gather`/`embedding`, fills NaN), where eager raises an error. Checking on every
# step would cost a wait for each graph, so it is a debugging mode: with LAZYXLA_CHECK_INDICES=1
# each graph is compiled through `jax.experimental.checkify` with its index checks, and returns
# an error value beside its outputs; after the run binds the outputs (as XLA computed them), an
# error raises `OutOfRangeIndex` (an IndexError and a RuntimeError, as eager's ops raise one or the
# other) naming the array and the index. The flag is part of the graph's key.


def _checked(run: Any) -> Any:
    from jax.experimental import checkify

    return checkify.checkify(run, errors=checkify.index_checks)


_unchecked_warned: list[bool] = []


def _lower(cap: Capture) -> Any:
    """`cap`'s program lowered; a graph that checkify cannot instrument (a JAX limitation on some
    scatters) is lowered unchecked, with a warning, rather than failing the debugging run."""
    try:
        return cap.function().lower(*cap.args())
    except Exception as err:
        if not cap.checked:
            raise
        cap.checked = False
        lowered = cap.function().lower(*cap.args())  # (raises the program's own error, if any)
        metrics.counter_inc("UncheckedIndicesGraph")
        if not _unchecked_warned:
            _unchecked_warned.append(True)
            warnings.warn(
                f"LAZYXLA_CHECK_INDICES: a graph could not be instrumented ({type(err).__name__}: "
                f"{err}); it runs without index checks (counted as UncheckedIndicesGraph)",
                RuntimeWarning,
                stacklevel=4,
            )
        return lowered


class OutOfRangeIndex(IndexError, RuntimeError):
    """An index tensor held an out-of-range index (Note [Checked indices]). Eager raises
    IndexError (`x[i]`, `index_select`, `embedding`) or RuntimeError (`gather`, `scatter`):
    either `except` catches it."""


def _raise_index_error(err: Any) -> None:
    message = err.get()  # (waits for the graph)
    if message is not None:
        metrics.counter_inc("CheckedIndexError")
        raise OutOfRangeIndex(
            f"{message.strip()} (an index tensor of this graph holds an out-of-range index; "
            "eager raises at the op; LAZYXLA_CHECK_INDICES=1 found it)"
        )


# Note [Failed graphs]
# When the graph of a sync fails (a dtype or size XLA rejects at compile, an allocation that fails
# at run time, a broken lowering), lazyxla finds the tensors that fail on their own by bisection
# (compiling halves of the pending set: O(k log n) compiles for k failing tensors, and only on the
# error path), runs the rest, and marks each failing tensor `failed`. A failed tensor keeps its
# pending value but leaves the set a full sync runs, so later steps run; reading it retries its
# own graph (and raises its error again, or succeeds once the cause is gone), and anything
# computed from it fails the same way. Without this, one bad tensor made every later sync fail
# until it was deleted.


def _isolate(group: list[LazyState], err: BaseException, cause: str) -> None:
    """`group` failed with `err`: a single state keeps the error; a larger group runs each half,
    bisecting again where one fails."""
    if len(group) == 1 or collectives.active():
        # Several processes: a half-graph would not match the other processes' programs.
        for s in group:
            s.failed = err
        return
    mid = len(group) // 2
    for part in (group[:mid], group[mid:]):
        try:
            _execute(part, False, cause, False)
        except ExecutionNotAllowed:
            raise
        except Exception as part_err:
            _isolate(part, part_err, cause)


# Note [Keeping the collector off long-lived objects]
# A lazy step allocates tens of thousands of short-lived objects (nodes, tensors, states), and
# Python's cyclic collector runs a full collection every few steps, re-scanning every live object
# of the process: torch, jax, the model, the optimizer (~400k objects in the demo, ~0.1-0.25 s a
# collection here). Measured on the 8-layer demo decoder: a full collection every ~6 steps, each
# costing several times a step's tracing. The objects that exist after the first graphs compile
# (model, optimizer state, the libraries, the first executables) are long-lived, so lazyxla moves
# them to the permanent generation then (`gc.freeze()`, O(1)), after each of the process's first
# `_FREEZES` compiles, whatever ran the graph: `sync()`, a value read (a `generate()` loop never
# calls `sync()`: Note [What a value read syncs]), a trace-once replay. Later full collections
# scan only what is newer. Freezing only a few times bounds what it gives up: a reference cycle
# alive at such a compile that dies later is freed only by `gc.unfreeze()` + `gc.collect()`
# (objects without cycles are freed by reference counting as always), and a later program (a
# test suite's next test) has its cycles collected as usual. LAZYXLA_GC_FREEZE=0 turns it off.
# The IR itself holds no reference cycles: nodes point only at their inputs, states at their base.
_FREEZES = [4]


def _freeze_long_lived() -> None:
    """After a compile: Note [Keeping the collector off long-lived objects]."""
    if FLAGS.gc_freeze and _FREEZES[0]:
        _FREEZES[0] -= 1
        gc.freeze()


def live_device_arrays() -> list[jax.Array]:
    """The device data of every live tensor (not a donated buffer, nor a host copy)."""
    return [
        s.value[0].data
        for s in live_states()
        if type(s) is not HostState  # (Note [SPMD virtual device])
        and s.value[0].op == DEVICE_DATA
        and not s.value[0].data.is_deleted()
    ]


def sync(wait: bool = False, cause: str | None = None) -> None:
    """Run the pending graph of every live tensor (`torch_xla.sync()` / `xm.mark_step()`).
    `cause`: why, for PT_XLA_DEBUG_LEVEL (default: a user's sync)."""
    metrics.counter_inc("MarkStep")
    if sharding.is_spmd():
        from .transfer import sync_host_data

        sync_host_data()  # Note [SPMD virtual device]
    sync_states(None, wait=wait, cause=cause)
    step_closures.run_pending()  # xm.add_step_closure callbacks run after the step's execution
