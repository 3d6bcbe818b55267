"""StableHLO composites from torch_xla's pattern markers (`torch.ops.xla.mark_tensor`).

# Note [Composites]
torch_xla's `mark_tensor(x, name, pos, id, is_input, attr)` (and `StableHLOCompositeBuilder`,
which calls it for each input and output of a pattern) tags the boundary of a pattern; its
exporter wraps the ops between the inputs and outputs that share `(name, id)` into one
`stablehlo.composite "name"` whose `decomposition` is a private function `@name.impl` and whose
`composite_attributes` are the output markers' `attr`. A compiler that knows the composite may
replace it; every other compiler inlines the decomposition, so values never change.

lazyxla records each marker as an identity node (`xla::mark_tensor`, its boundary metadata in the
node's kwargs). When a graph is lowered (`lower.Program`; the lazy graph, `get_stablehlo`, the
trace-once backend and `torch_xla.stablehlo` export all go through it), `group_patterns`
rewrites the program's step list, once per compile:
1. the *region* of a pattern is every op step that depends on one of its input markers and that
   one of its output markers depends on (paths through the input markers are cut);
2. the region becomes a sub-program whose inputs are the input markers (by `pos`), then any value
   from outside the region the ops use (runtime scalars, other tensors), constants copied in;
3. one composite step runs it through `jax`'s composite lowering (our own primitive over
   `jax.lax.composite`'s machinery, so the decomposition is named `name.impl` as torch_xla names
   it), and each output marker becomes a pick of the composite's result `pos`;
4. the steps are re-sorted topologically, keeping data and scalar inputs in their order (the
   caller feeds them by position). A region step that something outside the pattern also uses
   stays in the main program too (computed twice; XLA removes the duplicate).
A pattern whose output feeds its own input, and nested patterns, are not built (torch_xla does
not support nesting either): their markers stay identities. Attributes follow torch_xla's
types: `float` → f32, `int` → i64, `bool`, `str`, lists → dense i64/f32/i1 tensors.
The pattern-instance id is left out of the graph key (`_PatternId`): a builder made anew each
step (a new uuid) must not recompile. Two graphs that differ only in which markers share an id
then share a compiled program, whose grouping may differ, never its values; the StableHLO text
of a graph is always lowered from its own markers.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

MARK_TENSOR = "xla::mark_tensor"
COMPOSITE = "xla::composite"


# --- the jax primitive ----------------------------------------------------------------------------

_primitive: Any = None


def _composite_primitive() -> Any:
    """`jax.lax.composite`'s primitive, renamed: its decomposition is `@<name>.impl`.

    Built on jax internals (`jax._src.lax.lax._composite_*`), pinned with jax."""
    global _primitive
    if _primitive is not None:
        return _primitive
    from jax._src import core
    from jax._src.interpreters import ad, mlir
    from jax._src.lax import lax as lax_internal
    from jax._src.lib.mlir import ir

    p = core.Primitive("lazyxla_composite")
    p.multiple_results = True
    p.def_impl(lax_internal._composite_impl)
    p.def_abstract_eval(lax_internal._composite_abstract_eval)
    ad.primitive_jvps[p] = lax_internal.composite_jvp
    ad.primitive_transposes[p] = lax_internal.composite_transpose

    def lowering(ctx: Any, *args: Any, name: str, **params: Any) -> Any:
        results = lax_internal._composite_lowering(ctx, *args, name=name + ".impl", **params)
        results[0].owner.attributes["name"] = ir.StringAttr.get(name)
        return results

    mlir.register_lowering(p, lowering)
    _primitive = p
    return p


def _attr_value(v: Any) -> Any:
    """A composite attribute as torch_xla types it (f32 floats, i64 ints, dense lists)."""
    if isinstance(v, (list, tuple)):
        kinds = {type(e) for e in v}
        dtype = {bool: np.bool_, int: np.int64, float: np.float32}[next(iter(kinds))]
        return np.asarray(v, dtype=dtype)
    if isinstance(v, float):
        return np.float32(v)
    return v


def call_composite(
    decomposition: Callable[..., list], name: str, attrs: dict, operands: list
) -> list:
    """`stablehlo.composite name(operands)` with `decomposition` as its body."""
    from jax._src import api_util, core, tree_util
    from jax._src.hashable_array import HashableArray
    from jax._src.lax import lax as lax_internal

    prim = _composite_primitive()
    flat = tuple(operands)
    in_tree = tree_util.tree_structure(flat)
    in_avals = tuple(core.typeof(x) for x in flat)
    debug = api_util.debug_info("composite", decomposition, flat, {})
    jaxpr, consts, out_tree = lax_internal._trace_composite_to_jaxpr(
        lambda *a: list(decomposition(*a)), in_tree, in_avals, name, debug
    )
    attributes = []
    for k, v in (attrs or {}).items():
        leaves, treedef = tree_util.tree_flatten(_attr_value(v))
        leaves = tuple(HashableArray(x) if isinstance(x, np.ndarray) else x for x in leaves)
        attributes.append((k, leaves, treedef))
    out = prim.bind(
        *core.auto_insert_reshard(*consts, *flat),
        name=name,
        attributes=tuple(attributes),
        version=0,
        jaxpr=jaxpr,
    )
    return tree_util.tree_unflatten(out_tree, out)


# --- the marker op on lazy tensors ---------------------------------------------------------------


def _identity(x: Any, **_: Any) -> Any:
    return x


class _PatternId:
    """A marker's pattern-instance id, equal to every other in the graph key: it only says which
    markers belong together and never changes a value, while `StableHLOCompositeBuilder` makes a
    new uuid per instance (a builder made in `forward` would otherwise recompile every step)."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _PatternId)

    def __hash__(self) -> int:
        return 0x5A7

    def __repr__(self) -> str:
        return repr(self.value)


def _frozen(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(e) for e in v)
    return v


def mark_tensor_lazy(
    x: torch.Tensor, name: str, pos: int, id: str, is_input: bool, attr: Any = None
) -> torch.Tensor:
    """`torch.ops.xla.mark_tensor` on a lazyxla tensor: an identity node carrying the marker."""
    from .custom_call import check_composite_attr
    from .ir import Node, Ref, TensorSpec
    from .tensor import new_tensor, read, state

    attr = None if attr is None else dict(attr)
    check_composite_attr(attr)
    spec = TensorSpec(tuple(x.shape), x.dtype)
    kwargs = (
        ("name", name),
        ("pos", int(pos)),
        ("id", _PatternId(id)),
        ("is_input", bool(is_input)),
        ("attr", None if attr is None else tuple((k, _frozen(v)) for k, v in attr.items())),
    )
    node = Node(MARK_TENSOR, _identity, (read(state(x)),), (Ref(0),), kwargs, (spec,))
    return new_tensor((node, 0), spec)


# --- grouping a program's steps into composites -------------------------------------------------


class _Pattern:
    def __init__(self, name: str) -> None:
        self.name = name
        self.inputs: dict[int, int] = {}  # pos -> step index
        self.outputs: dict[int, int] = {}
        self.attr: dict | None = None


def _patterns(steps: list[tuple]) -> list[_Pattern]:
    from .lower import OP

    found: dict[tuple[str, str], _Pattern] = {}
    for i, st in enumerate(steps):
        if st[0] != OP or st[6] != MARK_TENSOR:
            continue
        kw = dict(st[4])
        p = found.setdefault((kw["name"], kw["id"].value), _Pattern(kw["name"]))
        (p.inputs if kw["is_input"] else p.outputs)[kw["pos"]] = i
        if not kw["is_input"] and kw["attr"] is not None:
            p.attr = dict(kw["attr"])
    return [p for p in found.values() if p.inputs and p.outputs]


def group_patterns(
    steps: list[tuple], roots: list[tuple[int, int]]
) -> tuple[list[tuple], list[tuple[int, int]]]:
    """The program's steps with each marked pattern as one composite step (Note [Composites])."""
    from .lower import CONST, DATA, EMPTY, OP

    patterns = _patterns(steps)
    if not patterns:
        return steps, roots
    markers = {i for i, st in enumerate(steps) if st[0] == OP and st[6] == MARK_TENSOR}
    users: dict[int, list[int]] = defaultdict(list)
    for i, st in enumerate(steps):
        if st[0] == OP:
            for p, _ in st[2]:
                users[p].append(i)
    root_ids = {p for p, _ in roots}

    removed: set[int] = set()
    picks: dict[int, tuple[int, int]] = {}  # output marker -> (composite key, result index)
    composites: list[tuple[tuple, int, list[int]]] = []  # (step, priority, dependencies)
    for pat in patterns:
        ins = set(pat.inputs.values())
        outs = [pat.outputs[k] for k in sorted(pat.outputs)]
        # ancestors of the outputs, not crossing the input markers
        back: set[int] = set()
        stack = [p for o in outs for p, _ in steps[o][2]]
        while stack:
            i = stack.pop()
            if i in back or i in ins:
                continue
            back.add(i)
            if steps[i][0] == OP:
                stack.extend(p for p, _ in steps[i][2])
        # descendants of the inputs
        fwd: set[int] = set()
        stack = [u for i in ins for u in users[i]]
        while stack:
            i = stack.pop()
            if i not in fwd:
                fwd.add(i)
                stack.extend(users[i])
        region = back & fwd
        own_outs = set(outs)
        if any(i in markers and i not in own_outs for i in region) or any(
            i in region for i in removed
        ):
            continue  # nested or overlapping patterns are left inline
        # The sub-program: operands (inputs by pos, then outside values), copied constants,
        # the region's ops in their order.
        operands = [(pat.inputs[k], 0) for k in sorted(pat.inputs)]
        local: dict[tuple[int, int], int] = {ref: j for j, ref in enumerate(operands)}
        sub_steps: list[tuple] = [(DATA,)] * len(operands)
        consts: list[tuple] = []
        const_slot: dict[int, int] = {}
        body = sorted(region)
        for i in body + outs:
            for ref in steps[i][2] if i in region else steps[i][2][:1]:
                p = ref[0]
                if p in region or ref in local:
                    continue
                if steps[p][0] in (CONST, EMPTY):
                    if p not in const_slot:
                        const_slot[p] = len(consts)
                        consts.append(steps[p])
                    continue
                local[ref] = len(operands)
                operands.append(ref)
                sub_steps.append((DATA,))
        n_ops = len(operands)
        slot: dict[int, int] = {p: n_ops + j for p, j in const_slot.items()}
        sub_steps.extend(consts)
        for j, i in enumerate(body):
            slot[i] = len(sub_steps) + j
        for i in body:
            st = steps[i]
            refs = tuple(_local_ref(r, slot, local) for r in st[2])
            sub_steps.append((st[0], st[1], refs, *st[3:]))
        sub_roots = [_local_ref(steps[o][2][0], slot, local) for o in outs]
        decomposition = _sub_program(sub_steps, sub_roots)
        name, attr = pat.name, pat.attr

        def rule(*arrays: Any, _d: Callable = decomposition, _n: str = name, _a: Any = attr):
            return tuple(call_composite(_d, _n, _a or {}, list(arrays)))

        dtypes = tuple(steps[o][5][0] for o in outs)
        shapes = tuple(steps[o][8][0] for o in outs)
        from .ir import Ref

        key = -1 - len(composites)
        step = (OP, rule, tuple(operands), tuple(Ref(j) for j in range(n_ops)), (), dtypes)
        step += (COMPOSITE, steps[outs[0]][7], shapes)
        composites.append((step, min(outs), [p for p, _ in operands]))
        for j, o in enumerate(outs):
            picks[o] = (key, j)
        # region ops nothing outside the pattern uses are computed in the composite only (an
        # output marker inside the region, feeding another output, is a pick either way)
        outside = {
            i
            for i in region - own_outs
            if i in root_ids or any(u not in region and u not in own_outs for u in users[i])
        }
        keep: set[int] = set()
        stack = list(outside)
        while stack:
            i = stack.pop()
            if i in keep or i not in region or i in own_outs:
                continue
            keep.add(i)
            stack.extend(p for p, _ in steps[i][2])
        removed |= region - keep - own_outs
    if not composites:
        return steps, roots
    return _resort(steps, roots, removed, picks, composites)


def _local_ref(ref: tuple[int, int], slot: dict[int, int], local: dict) -> tuple[int, int]:
    if ref in local:
        return (local[ref], 0)
    return (slot[ref[0]], ref[1])


def _sub_program(steps: list[tuple], roots: list[tuple[int, int]]) -> Callable[..., list]:
    from .lower import Program

    prog = Program.__new__(Program)
    prog.steps, prog.roots, prog.out_shardings = steps, roots, ()
    run = prog.function()
    return lambda *arrays: run(list(arrays), [])


def _resort(
    steps: list[tuple],
    roots: list[tuple[int, int]],
    removed: set[int],
    picks: dict[int, tuple[int, int]],
    composites: list[tuple[tuple, int, list[int]]],
) -> tuple[list[tuple], list[tuple[int, int]]]:
    """Topological order of the rewritten steps, data and scalar inputs kept in their order."""
    from .ir import Ref
    from .lower import OP

    items: dict[int, tuple] = {}  # key -> step (old refs; composite keys are negative)
    prio: dict[int, float] = {}
    deps: dict[int, list[int]] = {}
    for i, st in enumerate(steps):
        if i in removed:
            continue
        if i in picks:
            key, k = picks[i]
            items[i] = (OP, _identity, ((key, k),), (Ref(0),), (), st[5], st[6], st[7], st[8])
            deps[i] = [key]
        else:
            items[i] = st
            deps[i] = [p for p, _ in st[2]] if st[0] == OP else []
        prio[i] = i
    for c, (st, first_out, operands) in enumerate(composites):
        key = -1 - c
        items[key], prio[key], deps[key] = st, first_out - 0.5, operands
    users: dict[int, list[int]] = defaultdict(list)
    indeg = {k: 0 for k in items}
    for k, ds in deps.items():
        if not items.keys() >= set(ds):
            raise RuntimeError(f"internal: composite grouping dropped a step that {k} reads")
        for d in set(ds):
            users[d].append(k)
            indeg[k] += 1
    heap = [(prio[k], k) for k, n in indeg.items() if n == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, k = heapq.heappop(heap)
        order.append(k)
        for u in users[k]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (prio[u], u))
    if len(order) != len(items):
        raise ValueError(
            "a marked pattern (torch.ops.xla.mark_tensor / StableHLOCompositeBuilder) has an "
            "output that feeds its own inputs: mark the inputs before any op of the pattern and "
            "the outputs after all of them"
        )
    new = {k: j for j, k in enumerate(order)}
    out: list[tuple] = []
    for k in order:
        st = items[k]
        if st[0] == OP:
            st = (st[0], st[1], tuple((new[p], j) for p, j in st[2]), *st[3:])
        out.append(st)
    return out, [(new[p], j) for p, j in roots]
