"""Sync: capture the pending graph of live tensors, find or compile its executable, run it, bind
results.

# Note [Graph hashing]
The cache key of a graph is built at sync time from the post-order of the nodes reachable from the
roots.
Each node contributes its descriptor id (op, static arguments, output specs; interned once at record
time, see ir.py) and the post-order *positions* of its inputs; leaves contribute only their spec
(and
sharding). Array data and lifted scalar values are inputs of the jitted function, never part of the
key,
so new data or a new learning rate reuses the executable. Numbering inputs by position is what tells
`(a-b)+(b-a)` from `(a-b)+(a-b)` when `a` and `b` have the same spec: a hash built from specs alone
would collide. Scalars are packed into one vector per dtype because a jitted call's cost grows with
its
argument count.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

from . import analysis, metrics, step_closures
from .config import FLAGS
from .ir import DEVICE_DATA, SCALAR, Node, device_data, post_order
from .lower import Program
from .runtime import jnp_dtype
from .sharding import output_sharding
from .tensor import LazyState, bind_data, live_states, read


class GraphCache:
    """In-memory map from graph key to compiled executable, least recently used evicted first.

    Bounded (XLA_COMPILATION_CACHE_SIZE, torch_xla's name and default, 1024): a program that makes
    thousands of distinct graphs must not hold every executable until the compiler runs out of
    memory. An evicted graph that comes back compiles again (counted as UncachedCompile).
    """

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
            self.entries.popitem(last=False)
            metrics.counter_inc("CompilationCacheEvict")

    def clear(self) -> None:
        self.entries.clear()


CACHE = GraphCache()
_allow_execution = True


class ExecutionNotAllowed(RuntimeError):
    pass


def set_allow_execution(allow: bool) -> None:
    global _allow_execution
    _allow_execution = allow


# Note [Buffer donation]
# With LAZYXLA_DONATE_BUFFERS=1, a full sync donates the buffers of inputs nothing will read
# again: a device-data node that no live tensor holds as its value (its tensor was overwritten, as
# a parameter is by optimizer.step()) is reachable only through the graph being run, so XLA may
# write an output into its buffer. A stale view (its cached value may still read old data) turns
# donation off for that sync; data a trace-once graph keeps as a constant is never donated
# (`node.meta == KEEP`). Only inputs whose spec matches an output are donated, so XLA can alias
# every one. The donation mask is part of the graph key. Partial syncs (`.item()`) never donate.
KEEP = "keep"


def _held_data() -> set[int] | None:
    """Ids of the device-data nodes some live tensor holds (None: donate nothing this sync)."""
    held: set[int] = set()
    for s in live_states():
        node = s.value[0]
        if s.base is not None and s.seen != s.base.version:
            return None
        if node.op == DEVICE_DATA:
            held.add(id(node))
    return held


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
    return np.asarray(values, dtype=dt)


class Capture:
    """A pending graph, numbered: its key, its inputs, and where its outputs go."""

    def __init__(self, states: list[LazyState], donate: bool = False) -> None:
        root_index: dict[tuple[int, int], int] = {}
        root_values: list[tuple[Node, int]] = []
        self.bindings: list[tuple[LazyState, int]] = []
        out_shardings: list[Any] = []
        for s in states:
            v = s.value
            k = (id(v[0]), v[1])
            r = root_index.get(k)
            if r is None:
                r = root_index[k] = len(root_values)
                root_values.append(v)
                ann = s.sharding
                out_shardings.append(getattr(ann, "named", None))
            self.bindings.append((s, r))
        self.out_shardings = tuple(out_shardings)  # See Note [Sharding]
        self.root_values = root_values
        nodes = post_order([n for n, _ in root_values])
        pos: dict[int, int] = {}
        parts: list[Any] = []
        data: list[jax.Array] = []
        scalars: dict[np.dtype, list[Any]] = {}
        for i, n in enumerate(nodes):
            pos[id(n)] = i
            if n.op == DEVICE_DATA:
                data.append(n.data)
                parts.append(n.desc)
            elif n.op == SCALAR:
                scalars.setdefault(jnp_dtype(n.specs[0].dtype), []).append(n.data)
                parts.append(n.desc)
            elif n.inputs:
                parts.append((n.desc, tuple([(pos[id(x)], k) for x, k in n.inputs])))
            else:
                parts.append(n.desc)
        self.nodes = nodes
        self.pos = pos
        self.roots = [(pos[id(n)], k) for n, k in root_values]
        self.donate = self._donation(nodes, root_values) if donate else ()
        self.key = (tuple(parts), tuple(self.roots), self.out_shardings, self.donate)
        self.data = data
        self.scalars = [_scalar_vector(v, dt) for dt, v in scalars.items()]

    @staticmethod
    def _donation(nodes: list[Node], root_values: list[tuple[Node, int]]) -> tuple[bool, ...]:
        """One flag per data input: may XLA reuse its buffer? See Note [Buffer donation]."""
        held = _held_data()
        data_nodes = [n for n in nodes if n.op == DEVICE_DATA]
        if held is None:
            return (False,) * len(data_nodes)
        free = collections.Counter(n.specs[k] for n, k in root_values)
        mask = []
        for n in data_nodes:
            ok = id(n) not in held and n.meta != KEEP and free[n.specs[0]] > 0
            if ok:
                free[n.specs[0]] -= 1
            mask.append(ok)
        return tuple(mask)

    def program(self) -> Program:
        return Program(self.nodes, self.pos, self.roots, self.out_shardings)

    def args(self) -> tuple:
        """The executable's arguments: (donated data, kept data, scalars) or (data, scalars)."""
        if not any(self.donate):
            return (self.data, self.scalars)
        donated = [a for a, d in zip(self.data, self.donate) if d]
        kept = [a for a, d in zip(self.data, self.donate) if not d]
        return (donated, kept, self.scalars)

    def function(self) -> Any:
        run = self.program().function()
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
    debug = analysis.level()
    if debug:
        analysis.compilation(cap, cause)
    with metrics.timed("CompileTime"):
        exe = cap.function().lower(*cap.args()).compile()
    metrics.counter_inc("CreateCompileHandles")
    if debug:
        analysis.post_compilation(cap, exe)
    CACHE.put(cap.key, exe)
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
    if not pending:
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
        _execute(pending, states is None and FLAGS.donate_buffers, cause, wait)
    except ExecutionNotAllowed:
        raise
    except Exception as err:
        _isolate(pending, err, cause)
        raise


def _execute(pending: list[LazyState], donate: bool, cause: str, wait: bool) -> None:
    cap = Capture(pending, donate=donate)
    metrics.metric_add("TensorsGraphSize", len(cap.nodes))
    if FLAGS.save_tensors_file:
        analysis.save_graph(cap)
    exe = compile_capture(cap, cause)
    if analysis.level() >= 2:
        analysis.execution(cap, cause)
    if cap.donate:
        metrics.metric_add("InputOutputAliasCount", sum(cap.donate))
    t0 = time.perf_counter_ns()
    outs = exe(*cap.args())
    if wait:
        jax.block_until_ready(outs)
    metrics.metric_add("ExecuteTime", time.perf_counter_ns() - t0)
    metrics.counter_inc("ExecuteComputation")
    data_nodes = [
        device_data(arr, n.specs[k], sharding=output_sharding(arr))
        for arr, (n, k) in zip(outs, cap.root_values, strict=True)
    ]
    for s, r in cap.bindings:
        bind_data(s, data_nodes[r])
        s.failed = None


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
    if len(group) == 1:
        group[0].failed = err
        return
    mid = len(group) // 2
    for part in (group[:mid], group[mid:]):
        try:
            _execute(part, False, cause, False)
        except ExecutionNotAllowed:
            raise
        except Exception as part_err:
            _isolate(part, part_err, cause)


def sync(wait: bool = False) -> None:
    """Run the pending graph of every live tensor (`torch_xla.sync()` / `xm.mark_step()`)."""
    metrics.counter_inc("MarkStep")
    sync_states(None, wait=wait)
    step_closures.run_pending()  # xm.add_step_closure callbacks run after the step's execution
