"""What a value read runs (Note [What a value read syncs]): the tensor read with every live
pending tensor but pending move graphs, the computed values right under those, and small fills
bound to data (Note [Fills passed as data]); a compiled graph's pending arguments run the same
way. graph.py runs the graphs; this module decides what goes in them."""

from __future__ import annotations

import math
import warnings
from typing import Any

from . import analysis, collectives, fallback, host_read, metrics
from .config import FLAGS
from .graph import (
    ExecutionNotAllowed,
    _fill_data,
    pending_states,
    sync,
    sync_states,
)
from .ir import CONSTANT, DEVICE_DATA, SCALAR, Node, post_order
from .sharding import is_spmd as spmd
from .tensor import STATE_FILL_OPS, LazyState, bind_data, read

# Note [What a value read syncs]
# torch_xla's `.item()`/`.cpu()` run only the graph of the tensor read; everything else stays
# pending. A loop that reads a value each iteration while it updates other tensors (text
# generation: the next token is read, the KV cache is written in place) then never cuts the
# cache's graph: each iteration's sync recomputes, and compiles, a graph that grew by one more
# iteration (29 compiles for 24 tokens). lazyxla treats a read that must execute as a step
# boundary: it runs every live pending tensor together with the one read (one graph, one
# execution), so the cache becomes device data at each token and every token runs the same
# graph. A read of a tensor that is already data runs nothing; an integer read answered on the
# host runs nothing either, and may leave a small pending graph for later (Note [Small integer
# reads on the host]: a padding-mask check mid-step). In a training step a read after `sync()` is
# of data; a read mid-step that must execute (a loss printed before `optimizer.step()`) cuts the
# step in two graphs, each the same every step, as before. Such a sync
# never donates buffers. If another pending tensor fails to compile or run, the tensor read still
# gets its value: the failing one is marked failed (Note [Failed graphs]) and a warning names
# its error. LAZYXLA_READ_SYNCS_ALL=0 restores torch_xla's policy, which also holds in programs
# that open manual sharding regions or run as several processes (see `sync_read`).


def _outside_open_regions(states: list[LazyState], keep: set[int]) -> list[LazyState]:
    """`states` without the local tensors of open manual sharding regions (they run only inside
    their region's shard_map, once it is closed); the states in `keep` (ids) always stay."""
    from . import manual

    if not manual._regions_opened:
        return states
    inside: set[int] = set()
    for n in post_order([x.value[0] for x in states]):
        if n.op == manual.FULL_TO_SHARD or any(id(i) in inside for i, _ in n.inputs):
            inside.add(id(n))
    return [x for x in states if id(x) in keep or id(x.value[0]) not in inside]


def sync_read(s: LazyState) -> None:
    """Run what a value read of `s` needs: see Note [What a value read syncs]."""
    read(s)
    if not s.is_pending and s.failed is None:
        return
    if fallback.tracing_target is not None:  # a trace-once graph has no values yet: the op
        raise fallback.FallbackWhileTracing(fallback.tracing_target)  # runs outside
    if host_read.try_read(s, _MOVES):  # Note [Small integer reads on the host]
        return
    if not FLAGS.read_syncs_all or collectives.active():
        # With several processes a read on one process (the master printing a loss) must not
        # run the step's collectives, which the others run at their sync: torch_xla's policy.
        sync_states([s])
        return
    _sync_with_pending([s], analysis.VALUE_ACCESS)


def sync_inputs(states: list[LazyState], cause: str) -> None:
    """Run the pending `states` (a compiled graph's arguments) as a value read runs its tensor
    (Note [What a value read syncs]): with every pending tensor but move graphs, so that a
    sequence growing by `cat` beside a compiled decoding step is not a new graph every step.
    Under torch_xla's policy (LAZYXLA_READ_SYNCS_ALL=0, several processes) a full sync, as
    torch_xla's dynamo bridge does."""
    if not FLAGS.read_syncs_all or collectives.active():
        sync(cause=cause)
        return
    run = []
    for x in states:
        read(x)
        if x.failed is not None:
            run.append(x)
        elif x.is_pending and not _fill_as_data(x):  # (a small fill is bound to data instead)
            run.append(x)
    if run:
        _sync_with_pending(run, cause)


# Note [Fills passed as data]
# A compiled backward's gradient seed is a fill: `loss.backward()` seeds it with
# `torch.ones_like(loss)`, and AOTAutograd's tangents for outputs that got no gradient are
# `zeros`. Pending, each used to run a graph of its own before the backward's replay (one more
# execution, every training step, with every compiled model). A small fill is instead bound to a
# data input holding its values, as a state's first fill is (Note [A state's first value is
# data]), uploaded once and shared through the device data cache (Note [Device data cache]): the
# same values, and the replay's program is unchanged. A large one still runs (XLA fills it in
# place of a transfer, and the cache stays small); so does any fill under SPMD, whose data input
# would need the fill's sharding.
_FILL_AS_DATA_ELEMENTS = 1 << 16


def _fill_as_data(s: LazyState) -> bool:
    """Bind pending base `s` to data if its value is a small fill (Note [Fills passed as data])."""
    n, k = s.value
    if (
        n.op not in STATE_FILL_OPS
        or k
        or s.base is not None
        or spmd()
        or math.prod(n.specs[0].shape) > _FILL_AS_DATA_ELEMENTS
    ):
        return False
    bind_data(s, _fill_data(n, shared=True))
    return True


def _sync_with_pending(keep: list[LazyState], cause: str) -> None:
    """Run `keep` with every live pending tensor except those made of moves alone, and the
    computed values right under those (Note [What a value read syncs])."""
    if not keep:
        return
    keep_ids = {id(x) for x in keep}
    states: list[Any] = []
    moves: list[LazyState] = []
    for x in _outside_open_regions(pending_states(None), keep_ids):
        if id(x) not in keep_ids and x.base is None and x.value[0].op in _MOVES:
            moves.append(x)
        else:
            states.append(x)
    present = {id(x) for x in states}
    missing = [x for x in keep if id(x) not in present]
    if missing:
        states.extend(missing)  # failed (Note [Failed graphs]): a read retries it
        states.sort(key=_seq_of)
    held = {(id(x.value[0]), x.value[1]): x for x in states}
    cuts = _cuts(moves, held)
    try:
        sync_states(states + cuts, cause=cause)
    except ExecutionNotAllowed:
        raise
    except Exception as err:
        for x in keep:
            if x.failed is not None or x.is_pending:
                raise x.failed or err from None
        metrics.counter_inc("ReadSyncOtherFailed")
        warnings.warn(
            f"a value read ran every pending tensor (Note [What a value read syncs]) and some "
            f"other pending tensor failed; it stays pending and raises when read: {err}",
            RuntimeWarning,
            stacklevel=4,
        )
        return
    if moves:
        _rebase(moves, held)


class _Cut:
    """A value under a pending move graph that a read sync computes (no tensor holds it)."""

    __slots__ = ("value", "base", "sharding", "failed", "fill")

    def __init__(self, value: tuple[Node, int]) -> None:
        self.value = value
        self.base = None
        self.sharding = None
        self.failed: BaseException | None = None
        self.fill = None  # (a state's, Note [A state's first value is data])


# Ops that only move or copy values: a pending tensor made of these alone is left pending by a
# value read (Note [What a value read syncs]).
_MOVES = frozenset(
    "aten::" + op
    for op in (
        "cat",
        "stack",
        "slice",
        "select",
        "unsqueeze",
        "squeeze",
        "view",
        "_unsafe_view",
        "reshape",
        "expand",
        "clone",
        "alias",
        "permute",
        "transpose",
        "t",
    )
)
_LEAVES = frozenset((DEVICE_DATA, SCALAR, CONSTANT))
# `Node.meta` of a move node with only leaves, ops without inputs and such nodes beneath: nothing
# under it is ever cut or rebased again, so the walks below stop there. A generated sequence
# (`ids = cat([ids, tok])` each token) stays a pending chain of cats over data: without the mark
# every read sync walked the whole chain twice, a cost growing with the tokens generated.
_SETTLED = "moves with nothing to cut beneath"


def _settled(n: Node) -> bool:
    return not n.inputs or (n.meta is _SETTLED and n.op in _MOVES)


def _move_graph(v: tuple[Node, int]) -> list[Node]:
    """The move nodes of the pending graph under `v`, inputs before users (it stops at leaves,
    at ops without inputs, at ops that compute and at settled moves)."""
    order: list[Node] = []
    if v[0].meta is _SETTLED:
        return order
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(v[0], False)]
    while stack:
        n, expanded = stack.pop()
        if expanded:
            order.append(n)
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.append((n, True))
        for x, _ in n.inputs:
            if x.op in _MOVES and id(x) not in seen and x.meta is not _SETTLED:
                stack.append((x, False))
    return order


def _cuts(moves: list[LazyState], held: dict[tuple[int, int], Any]) -> list[_Cut]:
    """The computing values right under the move graphs of `moves` that no synced tensor holds:
    the read sync computes them too (Note [What a value read syncs]); `held` gains them."""
    cuts: list[_Cut] = []
    for x in moves:
        for n in _move_graph(x.value):
            for v in n.inputs:
                m = v[0]
                if m.op in _MOVES or m.op in _LEAVES or not m.inputs:
                    continue
                key = (id(m), v[1])
                if key not in held:
                    held[key] = c = _Cut(v)
                    cuts.append(c)
    return cuts


def _rebase(moves: list[LazyState], held: dict[tuple[int, int], Any]) -> None:
    """Point the pending move graphs of `moves` at the data their computed inputs now are, so
    they stop referring to (and recomputing) the graph that just ran."""
    new: dict[int, Node] = {}
    for x in moves:
        for n in _move_graph(x.value):
            if id(n) in new:
                continue
            ins = []
            for v in n.inputs:
                m, k = v
                h = held.get((id(m), k))
                if h is not None and m.op not in _MOVES and h.value[0].op == DEVICE_DATA:
                    ins.append(h.value)
                else:
                    r = new.get(id(m))
                    ins.append((r, k) if r is not None else v)
            r = n
            if any(a is not b for a, b in zip(ins, n.inputs)):
                r = new[id(n)] = n.with_inputs(tuple(ins))
            if r.meta is None and all(_settled(m) for m, _ in r.inputs):
                r.meta = _SETTLED
        r = new.get(id(x.value[0]))
        if r is not None:
            x.value = (r, x.value[1])


def _seq_of(s: LazyState) -> int:
    return s.seq
