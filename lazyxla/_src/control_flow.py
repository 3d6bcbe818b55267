"""Loops as single IR nodes: `xla::scan` lowered to `lax.scan`, `xla::while_loop` to
`lax.while_loop` (and so `fori_loop`).

# Note [Loop nodes]
A loop body is traced once into a `SubGraph` (see Note [Sub-graph nodes]) and the loop is ONE node
of the lazy IR whose inputs are the loop's operands followed by the body's captured values, and
whose static arguments hold the body's structural id: the surrounding graph's key then names the
loop by its body's structure, so a second call with the same shapes (even after re-tracing)
compiles nothing new. The node's rule calls `lax.scan` / `lax.while_loop` with the body's pure JAX
function, so XLA sees a `while` whose body is compiled once, however many iterations it runs: this
is what makes a 16-layer decoder compile like a 1-layer one.

Traced bodies are cached by the caller (per function object and input signature): a cache hit
traces nothing. Random ops inside a scan body draw different numbers in each iteration: the seed
of every random op traced in the body is offset by the iteration index inside the loop, and every
call gets a fresh seed/offset pair (as a replayed trace does).

The checks that make a bad loop fail at the call instead of inside XLA: the body must return as
many carries as it was given, each with its input's shape and dtype (`lax.scan` requires it), every
leaf of `xs` must have the same leading length, and a while-loop condition must return a
single-element bool tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch
from jax import lax

from . import metrics
from .ir import Node, Ref, TensorSpec, shape_str
from .subgraph import SubGraph, SubGraphError, spec_of, trace
from .tensor import DEVICE_TYPE, new_tensor, read, state

# Per-iteration seed offset of random ops in a scan body: an odd multiplier (golden ratio), so
# iterations 0..2**32-1 get distinct 32-bit seeds.
_SEED_STRIDE = 0x9E3779B9


class LoopError(ValueError):
    """Bad input to a loop (scan / while_loop / fori_loop): says what, where and how to fix."""


def _describe(spec: TensorSpec) -> str:
    return shape_str(spec).split("{")[0]


def _check_lazy(tensors: Sequence[Any], what: str) -> None:
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise LoopError(f"{what}[{i}] is a {type(t).__name__}, not a tensor")
        if t.device.type != DEVICE_TYPE:
            raise LoopError(
                f"{what}[{i}] is on {t.device}; loop operands must be on the lazyxla device "
                "(move it with .to(torch_xla.device()))"
            )


def check_carry(
    got: Sequence[TensorSpec], want: Sequence[TensorSpec], what: str, names: Sequence[str] = ()
) -> None:
    """The carry a body returned must match the carry it was given: count, shape and dtype."""
    if len(got) != len(want):
        raise LoopError(
            f"{what} returned {len(got)} carry tensors but was given {len(want)}; the carry must "
            "keep its structure from one iteration to the next"
        )
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            name = names[i] if i < len(names) else f"carry[{i}]"
            kind = "dtype" if g.shape == w.shape else "shape"
            raise LoopError(
                f"{what} changed the {kind} of {name}: given {_describe(w)}, returned "
                f"{_describe(g)}. A loop carry must keep its shape and dtype; cast or reshape it "
                "back inside the body (e.g. `.to(carry.dtype)`)"
            )


# --- scan -----------------------------------------------------------------------------------------


def trace_scan_body(
    fn: Callable[[list[torch.Tensor], list[torch.Tensor]], tuple[Sequence[Any], Sequence[Any]]],
    carry_specs: Sequence[TensorSpec],
    x_specs: Sequence[TensorSpec],
    what: str = "the scan body `fn`",
) -> tuple[SubGraph, int]:
    """Trace `fn(carry, x) -> (carry, ys)` (flat lists) once; returns the body and len(ys)."""
    nc = len(carry_specs)
    n_y = [0]

    def flat(args: list[torch.Tensor]) -> list[torch.Tensor]:
        carry, ys = fn(args[:nc], args[nc:])
        carry, ys = list(carry), list(ys)
        check_carry([spec_of(c) for c in carry], carry_specs, what)
        n_y[0] = len(ys)
        return carry + ys

    metrics.counter_inc("ScanTraceBody")
    body = trace(flat, (*carry_specs, *x_specs), what)
    return body, n_y[0]


def scan_flat(
    body: SubGraph,
    init: Sequence[torch.Tensor],
    xs: Sequence[torch.Tensor],
    reverse: bool = False,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Record one `xla::scan` node running `body` over the leading dimension of `xs`.

    Args:
        body: a traced `fn(carry..., x...) -> (carry..., y...)` (see `trace_scan_body`).
        init: the initial carry tensors.
        xs: tensors scanned over their leading dimension (all the same length, at least one).
        reverse: iterate from the last slice to the first (ys keep their positions).

    Returns:
        (final carry, stacked ys), each a list of lazy tensors.
    """
    _check_lazy(init, "init")
    _check_lazy(xs, "xs")
    if not xs:
        raise LoopError("scan needs at least one tensor in `xs` to know how many steps to run")
    length = int(xs[0].shape[0])
    nc, nx = len(init), len(xs)
    n_out = len(body.out_specs)
    y_specs = tuple(TensorSpec((length, *s.shape), s.dtype) for s in body.out_specs[nc:])
    out_specs = (*body.out_specs[:nc], *y_specs)
    inputs = [read(state(t)) for t in (*init, *xs)] + body.capture_inputs()
    seed_slots = body.rng_seed_slots
    run = body.body

    def rule(*arrays: Any) -> tuple:
        ops = arrays[: len(inputs)]
        carry0 = tuple(ops[:nc])
        xs_ = tuple(ops[nc : nc + nx])
        caps = list(ops[nc + nx :])

        def step(carry: tuple, inp: tuple) -> tuple:
            x, i = inp
            c = caps
            if seed_slots:
                c = list(caps)
                for s in seed_slots:
                    c[s] = caps[s] + (i.astype(caps[s].dtype) + 1) * _SEED_STRIDE
            outs = run([*carry, *x], c)
            return tuple(outs[:nc]), tuple(outs[nc:n_out])

        idx = jnp.arange(length, dtype=jnp.int64)
        carry, ys = lax.scan(step, carry0, (xs_, idx), length=length, reverse=reverse)
        return (*carry, *ys)

    statics = ("scan", body.id, nc, nx, length, bool(reverse))
    node = Node(
        "xla::scan",
        rule,
        tuple(inputs),
        (*(Ref(i) for i in range(len(inputs))), statics),
        (),
        out_specs,
    )
    metrics.counter_inc("xla::scan")
    outs = [new_tensor((node, i), s) for i, s in enumerate(out_specs)]
    return outs[:nc], outs[nc:]


# --- while_loop -----------------------------------------------------------------------------------


def while_loop(
    cond_fn: Callable[..., Any],
    body_fn: Callable[..., Any],
    carried: Sequence[torch.Tensor],
    additional: Sequence[torch.Tensor] = (),
) -> list[torch.Tensor]:
    """Record one `xla::while_loop` node: `while cond_fn(*c, *a): c = body_fn(*c, *a)`.

    `carried` changes from one iteration to the next (same shapes and dtypes); `additional`
    inputs are read-only (weights). `cond_fn` must return a single-element bool tensor.
    """
    carried = list(carried)
    # Python numbers among the additional inputs (dynamo lifts some) are baked into the trace.
    statics_in = list(additional)
    additional = [a for a in statics_in if isinstance(a, torch.Tensor)]
    _check_lazy(carried, "carried_inputs")
    _check_lazy(additional, "additional_inputs")
    nc = len(carried)
    c_specs = tuple(spec_of(t) for t in carried)
    a_specs = tuple(spec_of(t) for t in additional)

    def full_args(args: list[torch.Tensor]) -> list[Any]:
        it = iter(args[nc:])
        return [*args[:nc], *(next(it) if isinstance(a, torch.Tensor) else a for a in statics_in)]

    def cond_flat(args: list[torch.Tensor]) -> list[torch.Tensor]:
        out = cond_fn(*full_args(args))
        if not isinstance(out, torch.Tensor) or out.numel() != 1 or out.dtype != torch.bool:
            got = (
                f"a {out.dtype} tensor of shape {tuple(out.shape)}"
                if isinstance(out, torch.Tensor)
                else repr(type(out).__name__)
            )
            raise LoopError(
                f"while_loop's cond_fn must return a single-element torch.bool tensor, got {got}"
            )
        return [out.reshape(())]

    def body_flat(args: list[torch.Tensor]) -> list[torch.Tensor]:
        out = body_fn(*full_args(args))
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        _check_lazy(out, "body_fn's output")
        check_carry([spec_of(t) for t in out], c_specs, "while_loop's body_fn")
        return out

    metrics.counter_inc("WhileLoopTrace")
    cond = trace(cond_flat, (*c_specs, *a_specs), "while_loop's cond_fn")
    body = trace(body_flat, (*c_specs, *a_specs), "while_loop's body_fn")
    inputs = (
        [read(state(t)) for t in (*carried, *additional)]
        + cond.capture_inputs()
        + body.capture_inputs()
    )
    na, ncc = len(additional), len(cond.captures)
    run_cond, run_body = cond.body, body.body
    seed_slots = body.rng_seed_slots

    def rule(*arrays: Any) -> tuple:
        ops = arrays[: len(inputs)]
        extra = list(ops[nc : nc + na])
        ccaps = list(ops[nc + na : nc + na + ncc])
        bcaps = list(ops[nc + na + ncc :])

        def c(state: tuple) -> jax.Array:
            return run_cond([*state[1:], *extra], ccaps)[0]

        def b(state: tuple) -> tuple:
            it, carry = state[0], state[1:]
            caps = bcaps
            if seed_slots:  # random ops draw anew in each iteration (see Note [Loop nodes])
                caps = list(bcaps)
                for s in seed_slots:
                    caps[s] = bcaps[s] + (it.astype(bcaps[s].dtype) + 1) * _SEED_STRIDE
            return (it + 1, *run_body([*carry, *extra], caps))

        out = lax.while_loop(c, b, (jnp.zeros((), jnp.int64), *ops[:nc]))
        return tuple(out[1:])

    statics = ("while_loop", cond.id, body.id, nc, na)
    node = Node(
        "xla::while_loop",
        rule,
        tuple(inputs),
        (*(Ref(i) for i in range(len(inputs))), statics),
        (),
        c_specs,
    )
    metrics.counter_inc("xla::while_loop")
    return [new_tensor((node, i), s) for i, s in enumerate(c_specs)]


def fori_loop(
    lower: Any, upper: Any, body_fun: Callable[..., Any], *init: torch.Tensor
) -> list[torch.Tensor]:
    """`for _ in range(lower, upper): init = body_fun(*init)` as one `lax.while_loop`.

    torch_xla's signature: `body_fun(*values)` gets the values only (not the index) and returns
    the new values. `lower`/`upper` are ints or integer tensors. Returns `[index, *values]`, the
    loop index after the last iteration first, as torch_xla's fori_loop does.
    """
    from .api import device

    dev = device()

    def as_index(v: Any, name: str) -> torch.Tensor:
        if isinstance(v, torch.Tensor):
            if v.numel() != 1 or v.dtype.is_floating_point or v.dtype == torch.bool:
                raise LoopError(f"fori_loop's {name} must be an integer, got {v.dtype} {v.shape}")
            return v.reshape(()).to(dev, torch.int64)
        if isinstance(v, bool) or not isinstance(v, int):
            raise LoopError(f"fori_loop's {name} must be an int or integer tensor, got {v!r}")
        return torch.tensor(v, dtype=torch.int64, device=dev)

    lo, hi = as_index(lower, "lower"), as_index(upper, "upper")

    def cond(i: torch.Tensor, hi_: torch.Tensor, *vals: torch.Tensor) -> torch.Tensor:
        return i < hi_

    def body(i: torch.Tensor, hi_: torch.Tensor, *vals: torch.Tensor) -> tuple:
        out = body_fun(*vals)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        return (i + 1, hi_, *out)

    res = while_loop(cond, body, [lo, hi, *init])
    return [res[0], *res[2:]]


# --- torch's while_loop higher-order op on lazy tensors -------------------------------------------


def while_loop_hop(
    cond_fn: Callable[..., Any],
    body_fn: Callable[..., Any],
    carried_inputs: Sequence[Any],
    additional_inputs: Sequence[Any] | None = None,
    stack_output: bool = False,
    mutated_arg_indices: str = "",
) -> tuple:
    """`torch._higher_order_ops.while_loop` on lazyxla tensors: one `xla::while_loop` node
    (torch_xla's `while_loop` registered for its device key)."""
    if stack_output:
        raise NotImplementedError(
            "while_loop with stacked outputs (the while_loop_stack_output op) is not supported "
            "on lazyxla; use torch_xla.experimental.scan.scan for loops that stack outputs"
        )
    for i, v in enumerate(carried_inputs):
        if not isinstance(v, torch.Tensor):
            raise LoopError(
                f"while_loop: carried_inputs[{i}] is a {type(v).__name__}; on lazyxla every "
                "carried input must be a tensor (wrap Python ints with torch.tensor(..., "
                "device=torch_xla.device()))"
            )
    out = while_loop(cond_fn, body_fn, list(carried_inputs), list(additional_inputs or ()))
    return tuple(out)


_hop_registered = False


def register_while_loop_hop() -> None:
    """Route `torch._higher_order_ops.while_loop` on lazyxla tensors to `while_loop_hop`
    (idempotent; done when `torch_xla.experimental.fori_loop` is imported, as torch_xla does)."""
    global _hop_registered
    if _hop_registered:
        return
    from torch._C import DispatchKey
    from torch._higher_order_ops.while_loop import while_loop_op

    while_loop_op.py_impl(DispatchKey.PrivateUse1)(while_loop_hop)
    _hop_registered = True


__all__ = [
    "LoopError",
    "SubGraphError",
    "check_carry",
    "fori_loop",
    "register_while_loop_hop",
    "scan_flat",
    "trace_scan_body",
    "while_loop",
    "while_loop_hop",
]
