"""Sub-graph nodes: a Python function traced once on placeholder lazy tensors, lowered inside a
JAX transform (`lax.scan`, `lax.while_loop`, `jax.checkpoint`, ...).

# Note [Sub-graph nodes]
Control flow and other higher-order ops need the computation of a function as one value, not as
ops spliced into the surrounding graph. `trace(fn, specs)` runs `fn` on placeholder tensors
(`xla::subgraph_input` leaves, one per argument) under `no_grad`; the IR its outputs reach is the
function's body. Every node of that IR is *inside* the body iff it depends on a placeholder or on a
random op's seed/offset drawn during the trace (so `torch.rand` in a loop body draws inside the
loop, not once before it); the other nodes it reaches (weights the function closes over, tensors
it created from constants, pending values computed before the call) are *captured*: they become
extra inputs of the node that calls the body, evaluated once outside it, and the walk stops there.
Constants (`prim::Constant`) stay inside.

A `SubGraph` holds the body as a data-free `Program` (so the body's JAX function is built from the
same interpreter as a whole graph: named scopes, dtype casts, shape checks), its output specs, its
captures, and an interned structural id: the calling node puts the id in its static arguments, so
two traces of the same function give the same graph key and the executable compiled for the first
is reused (see Note [Graph hashing]). On every call `capture_inputs()` gives the captured values,
with fresh RNG seeds/offsets (as trace-once replays do, see Note [Trace once]) and captured device
data marked never to donate (a cached trace feeds it again on the next call).

Caller contract: build one `Node` whose inputs are the caller's own operands followed by
`capture_inputs()`, and whose rule calls `body(args, captures)` inside its transform; `body` is a
pure function of `jax.Array`s. `lazyxla/_src/control_flow.py` (scan, while_loop) is the first
user; any other sub-computation node kind (checkpointed regions, ...) can use it the same way.

A sync inside the traced function (`.item()`, `print`, `xm.mark_step()`) cannot run: the
placeholders have no value. Their rule says so if one is ever reached by a lowering.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch

from . import donation, fallback, random_state
from .ir import (
    CONSTANT,
    DEVICE_DATA,
    SCALAR,
    Node,
    TensorSpec,
    intern_desc,
    post_order,
    scalar,
    structure_key,
)
from .lower import Program
from .tensor import DEVICE_TYPE, new_tensor, read, state

SUBGRAPH_INPUT = "xla::subgraph_input"


class SubGraphError(RuntimeError):
    """A function could not be traced into a sub-graph (what, where, how to fix)."""


def _placeholder_rule(*_: Any) -> Any:
    raise SubGraphError(
        "a value traced inside a loop body (scan / while_loop / fori_loop) was read or synced "
        "while the body was being traced (`.item()`, `print`, `.cpu()`, `torch_xla.sync()`, or "
        "Python control flow on a tensor); a traced body has no values: keep such reads outside "
        "the body, or express the condition with tensor ops (torch.where)"
    )


def placeholder(index: int, spec: TensorSpec) -> torch.Tensor:
    """A lazy tensor standing for argument `index` of a traced function."""
    node = Node(SUBGRAPH_INPUT, _placeholder_rule, (), (index,), (), (spec,))
    return new_tensor((node, 0), spec)


def spec_of(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(tuple(t.shape), t.dtype)


class _Capture:
    """How one captured value is fed on each call: a fixed value, or a fresh RNG seed/offset."""

    __slots__ = ("kind", "value", "pair")

    def __init__(self, kind: str, value: tuple[Node, int], pair: int = 0) -> None:
        self.kind = kind  # "const" | "rng_seed" | "rng_offset"
        self.value = value
        self.pair = pair


class SubGraph:
    """One function traced once for one signature (see Note [Sub-graph nodes])."""

    def __init__(
        self,
        arg_specs: tuple[TensorSpec, ...],
        out_specs: tuple[TensorSpec, ...],
        program: Program,
        leaves: list[tuple[str, int]],
        captures: list[_Capture],
        key: int,
        what: str,
    ) -> None:
        self.arg_specs = arg_specs
        self.out_specs = out_specs
        self.program = program
        self.leaves = leaves  # per data leaf in post-order: ("arg", i) or ("cap", j)
        self.captures = captures
        self.id = key
        self.what = what
        self._run = program.function()

    @property
    def rng_seed_slots(self) -> tuple[int, ...]:
        """Capture positions holding a random op's seed (a loop varies it per iteration)."""
        return tuple(i for i, c in enumerate(self.captures) if c.kind == "rng_seed")

    def body(self, args: Sequence[jax.Array], captures: Sequence[jax.Array]) -> list[jax.Array]:
        """The traced function as a pure JAX function of its arguments and captured values."""
        data = [args[i] if kind == "arg" else captures[i] for kind, i in self.leaves]
        return self._run(data, [])

    def capture_inputs(self) -> list[tuple[Node, int]]:
        """The captured values to pass as the calling node's trailing inputs, for one call."""
        out: list[tuple[Node, int]] = []
        fresh: dict[int, tuple[int, int]] = {}
        for c in self.captures:
            if c.kind == "const":
                out.append(c.value)
                continue
            if c.pair not in fresh:
                fresh[c.pair] = random_state.next_offset()
            seed, off = fresh[c.pair]
            out.append((scalar(seed if c.kind == "rng_seed" else off, torch.int64), 0))
        return out


def _inside_ids(roots: list[Node], varying: Callable[[Node], bool]) -> set[int]:
    """Ids of the nodes reachable from `roots` that depend on a varying leaf."""
    inside: set[int] = set()
    done: set[int] = set()
    stack: list[tuple[Node, bool]] = [(r, False) for r in roots]
    while stack:
        n, expanded = stack.pop()
        if expanded:
            if any(id(x) in inside for x, _ in n.inputs):
                inside.add(id(n))
            continue
        if id(n) in done:
            continue
        done.add(id(n))
        if not n.inputs:
            if varying(n):
                inside.add(id(n))
            continue
        stack.append((n, True))
        for x, _ in n.inputs:
            if id(x) not in done:
                stack.append((x, False))
    return inside


def trace(
    fn: Callable[[list[torch.Tensor]], Sequence[torch.Tensor]],
    arg_specs: Sequence[TensorSpec],
    what: str = "function",
) -> SubGraph:
    """Trace `fn(list of placeholder tensors) -> sequence of lazy tensors` into a `SubGraph`.

    Args:
        fn: takes one lazy tensor per spec in `arg_specs`, returns a flat sequence of lazy tensors.
        arg_specs: the arguments' shapes and dtypes.
        what: names the traced function in error messages (e.g. "the scan body `fn`").

    Returns:
        The sub-graph: output specs, pure JAX body, captured inputs and structural id.
    """
    arg_specs = tuple(arg_specs)
    args = [placeholder(i, s) for i, s in enumerate(arg_specs)]
    rng_before = random_state.get_state()[1]
    was_tracing, was_target = fallback.tracing_graph, fallback.tracing_target
    fallback.tracing_graph, fallback.tracing_target = True, None  # (reads: subgraph_input)
    try:
        with torch.no_grad():
            outs = list(fn(args))
    except fallback.FallbackWhileTracing as e:
        raise SubGraphError(
            f"{what} uses {e.op}, which has no lazyxla lowering; ops inside a traced body cannot "
            "run through the CPU fallback. Add a lowering for it (lazyxla/_src/ops/), or move it "
            "out of the body"
        ) from None
    finally:
        fallback.tracing_graph, fallback.tracing_target = was_tracing, was_target
    rng_after = random_state.get_state()[1]
    roots: list[tuple[Node, int]] = []
    for i, o in enumerate(outs):
        if not (isinstance(o, torch.Tensor) and o.device.type == DEVICE_TYPE):
            where = type(o).__name__ if not isinstance(o, torch.Tensor) else f"a {o.device} tensor"
            raise SubGraphError(
                f"{what} returned {where} as output {i}; every output must be a tensor on the "
                "lazyxla device (create tensors with device=torch_xla.device())"
            )
        roots.append(read(state(o)))

    def varying(n: Node) -> bool:
        if n.op == SUBGRAPH_INPUT:
            return n in placeholder_nodes
        # a random op's seed/offset drawn while tracing (see ir.rng_scalar)
        return n.op == SCALAR and type(n.meta) is tuple and rng_before < n.meta[1] <= rng_after

    placeholder_nodes = {read(state(a))[0] for a in args}
    root_nodes = [n for n, _ in roots]
    inside = _inside_ids(root_nodes, varying)

    def stop(n: Node) -> bool:
        return id(n) not in inside and n.op != CONSTANT

    nodes = post_order(root_nodes, stop=stop)
    pos = {id(n): i for i, n in enumerate(nodes)}
    arg_index = {id(read(state(a))[0]): i for i, a in enumerate(args)}
    leaves: list[tuple[str, int]] = []
    captures: list[_Capture] = []
    leaf_ids: set[int] = set()
    for n in nodes:
        if id(n) in arg_index:
            leaves.append(("arg", arg_index[id(n)]))
        elif n.op == SUBGRAPH_INPUT and id(n) not in inside:
            raise SubGraphError(
                f"{what} uses a placeholder of another traced body (a tensor from an enclosing "
                "loop body captured by a nested one); pass it to the nested loop as an input"
            )
        elif id(n) in inside and n.op == SCALAR:  # an RNG seed/offset drawn while tracing
            leaves.append(("cap", len(captures)))
            captures.append(_Capture(n.meta[0], (n, 0), n.meta[1]))
        elif stop(n):
            if len(n.specs) > 1:
                raise SubGraphError(
                    f"{what} captured a pending value with several outputs computed before the "
                    f"call ({n.op}); call torch_xla.sync() before the loop, or pass the value "
                    "to the loop as an input"
                )
            if n.op == DEVICE_DATA:
                n.meta = donation.KEEP  # fed again by every call of a cached trace: never donated
            leaves.append(("cap", len(captures)))
            captures.append(_Capture("const", (n, 0)))
        else:
            continue
        leaf_ids.add(id(n))
    root_refs = [(pos[id(n)], k) for n, k in roots]
    out_specs = tuple(n.specs[k] for n, k in roots)
    program = Program(nodes, pos, root_refs, leaf_ids=leaf_ids)
    leaf_kinds = (SUBGRAPH_INPUT, DEVICE_DATA, SCALAR)
    parts = structure_key(nodes, leaf_kinds)
    leaf_roles = tuple(
        ("arg", i) if kind == "arg" else (captures[i].kind, captures[i].value[0].specs)
        for kind, i in leaves
    )
    key = intern_desc(("subgraph", parts, tuple(root_refs), leaf_roles, arg_specs))
    return SubGraph(arg_specs, out_specs, program, leaves, captures, key, what)
