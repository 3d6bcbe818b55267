"""Graph → one pure JAX function, interpreted over the post-order inside `jax.jit`.

Each op runs its lowering rule under `jax.named_scope(<aten op>)`, so the HLO reads like the
program.
Outputs are cast to the dtypes PyTorch's meta kernels computed at record time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .ir import CONSTANT, DEVICE_DATA, SCALAR, Node, Ref
from .meta import OPT_TENSOR, TENSOR, ArgSpec
from .ops.registry import _out_dtypes, is_const
from .promotion import converting, zero_dim_casts
from .runtime import jnp_dtype

# A program step: (kind, rule, input refs, args, kwargs, output dtypes, op name)
DATA, SCAL, CONST, OP, EMPTY = range(5)


class Program:
    """The data-free structure of a graph: enough to build its JAX function."""

    def __init__(
        self,
        nodes: list[Node],
        pos: dict[int, int],
        roots: list[tuple[int, int]],
        out_shardings: tuple = (),
        leaf_ids: set[int] | frozenset[int] = frozenset(),
    ) -> None:
        """`leaf_ids`: nodes to read as data inputs (a manual region's entries and leaves)."""
        self.out_shardings = out_shardings
        self.steps: list[tuple] = []
        marked = False
        for n in nodes:
            if n.op == DEVICE_DATA or id(n) in leaf_ids:
                self.steps.append((DATA,))
            elif n.op == SCALAR:  # one 0-d argument each: Note [Scalars are arguments]
                self.steps.append((SCAL,))
            elif n.op == CONSTANT:
                self.steps.append((CONST, n.args[0], jnp_dtype(n.specs[0].dtype)))
            elif n.specs and all(0 in s.shape for s in n.specs):
                # Every output is empty: its value is its shape. Rules need not handle the
                # degenerate inputs that make it (a gather from an empty index, a 0-batch norm).
                self.steps.append(
                    (EMPTY, tuple((tuple(s.shape), jnp_dtype(s.dtype)) for s in n.specs))
                )
            else:
                refs = tuple((pos[id(i)], k) for i, k in n.inputs)
                dtypes = tuple(jnp_dtype(s.dtype) for s in n.specs)
                shapes = tuple(tuple(s.shape) for s in n.specs)
                rule = _eager_rule(n)
                self.steps.append((OP, rule, refs, n.args, n.kwargs, dtypes, n.op, n.src, shapes))
                marked = marked or n.op == "xla::mark_tensor"
        self.roots = roots
        if marked:  # pattern markers become stablehlo.composite ops: Note [Composites]
            from .composite import group_patterns

            self.steps, self.roots = group_patterns(self.steps, roots)

    def function(self) -> Callable[..., list[jax.Array]]:
        steps, roots = self.steps, self.roots
        # A root that is its own `mark_sharding` node carries that constraint already (one
        # annotation in the HLO, as torch_xla's).
        out_shardings = [
            None if sh is not None and _constrained_to(steps[p], sh) else sh
            for sh, (p, _) in zip(self.out_shardings, roots)
        ]

        def run(data: list[jax.Array], scalars: list[jax.Array]) -> list[jax.Array]:
            env: list[tuple] = []
            di = si = 0
            for step in steps:
                kind = step[0]
                if kind == DATA:
                    env.append((data[di],))
                    di += 1
                elif kind == SCAL:
                    env.append((scalars[si],))
                    si += 1
                elif kind == CONST:
                    env.append((jnp.asarray(step[1], step[2]),))
                elif kind == EMPTY:
                    env.append(tuple(jnp.zeros(shape, dt) for shape, dt in step[1]))
                else:
                    _, rule, refs, args, kwargs, dtypes, name, src, shapes = step
                    ins = [env[p][k] for p, k in refs]
                    a = [_subst(x, ins) for x in args]
                    kw = {k: _subst(v, ins) for k, v in kwargs}
                    # Note [Integer inputs, floating results]; restored after (a rule may run
                    # a nested program: a scan's body, a traced graph)
                    outer, _out_dtypes[0] = _out_dtypes[0], dtypes
                    with jax.named_scope(name.replace("::", ".")):
                        try:
                            out = rule(*a, **kw)
                        except Exception as e:
                            where = (
                                f" (recorded at {src})"
                                if src
                                else " (set XLA_IR_DEBUG=1 to record source lines)"
                            )
                            raise LoweringError(
                                f"lowering {name}{where} failed: {type(e).__name__}: {e}"
                            ) from e
                        finally:
                            _out_dtypes[0] = outer
                    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
                    outs = _flatten(outs)
                    _check_shapes(name, src, outs, shapes)
                    env.append(
                        tuple(
                            o if o.dtype == dt else o.astype(dt)
                            for o, dt in zip((jnp.asarray(o) for o in outs), dtypes)
                        )
                    )
            outs = [env[p][k] for p, k in roots]
            # Annotated roots keep their sharding (see Note [Sharding]).
            for i, sh in enumerate(out_shardings):
                if sh is not None:
                    outs[i] = jax.lax.with_sharding_constraint(outs[i], sh)
            return outs

        return run


def _eager_rule(n: Node) -> Callable[..., Any]:
    """`n`'s lowering rule, with what its node needs to give eager's values: numbers in tensor
    slots as arrays (Note [Numbers in tensor slots]), zero sums made +0.0 (Note [Adding a constant
    zero]), operands converted (Note [Zero-dim operands])."""
    rule = n.rule
    if n.aten is not None:
        rule = _numbers_as_arrays(n, rule)
    if n.op == "aten::add" and _adds_constant_zero(n):
        rule = _adding_zeros(rule)
    casts = zero_dim_casts(n)
    return converting(rule, casts) if casts else rule


# Note [Numbers in tensor slots]
# A 0-d CPU tensor of 0 or 1 (or a bool) in a Tensor argument is baked into its node as a Python
# number (`Recorder.tensor` in dispatch.py, as torch_xla bakes its units), so a rule meets a number
# where it expects an array: `x[mask] = torch.tensor(0)`, `x.gather(0, torch.tensor(1))`,
# `torch.igamma(x, torch.tensor(1.))` failed to lower (`'int' object has no attribute 'reshape'`;
# probing OpInfo's samples with such operands found 14 ops, and their in-place and out= forms).
# The interpreter hands the rule a weakly typed 0-d array in its place: it promotes as the number
# did, and has an array's methods. The node's aten overload (`Node.aten`; an in-place op's node
# calls its functional twin) says which arguments are tensors.
_NUMBERS = (bool, int, float)


@functools.cache
def _tensor_slots(op: Any) -> tuple[tuple[int, ...], frozenset[str]]:
    """Where a node of aten overload `op` holds tensors: positions in its arguments (schema
    order, keyword-only ones apart) and names of its keyword-only arguments."""
    positions, names, i = [], set(), 0
    for a in op._schema.arguments:
        tensor = ArgSpec(a, None).kind in (TENSOR, OPT_TENSOR)
        if a.kwarg_only:
            if tensor:
                names.add(a.name)
        else:
            if tensor:
                positions.append(i)
            i += 1
    return tuple(positions), frozenset(names)


def _numbers_as_arrays(n: Node, rule: Callable[..., Any]) -> Callable[..., Any]:
    """`rule`, given a 0-d array for each number in a tensor slot of `n` (Note [Numbers in
    tensor slots])."""
    positions, names = _tensor_slots(n.aten)
    at = [p for p in positions if p < len(n.args) and type(n.args[p]) in _NUMBERS]
    named = [k for k, v in n.kwargs if k in names and type(v) in _NUMBERS]
    if not at and not named:
        return rule

    def arrays(*args: Any, **kwargs: Any) -> Any:
        args = list(args)
        for p in at:
            args[p] = jnp.asarray(args[p])
        for k in named:
            kwargs[k] = jnp.asarray(kwargs[k])
        return rule(*args, **kwargs)

    return arrays


# Note [Adding a constant zero]
# XLA's algebraic simplifier folds `x + 0` to `x` when the 0 is a constant: -0.0 + 0 stays -0.0,
# where IEEE, and eager, give +0.0. Two kinds of add have such a 0: a 0 (or 0.0, False, a 0-d
# zero tensor) baked into the node as torch_xla bakes its units (`_is_unit` in dispatch.py:
# `t + 0`, `0 + t`, `t.add_(0)`; -0.0 is never baked), and a zero fill as an operand
# (`torch.zeros_like(t) + t`, `t + torch.zeros(n)`, `new_zeros`; small fills passed as data are
# not constants). The interpreter computes those adds as IEEE does: their zero sums become +0.0
# (with a +0.0 operand, -0.0 + -0.0 cannot occur), each part of a complex sum alike. Not covered:
# a zero fill reaching the add through a view (an expanded zeros).
_ZERO_FILLS = frozenset({"aten::zeros", "aten::zeros_like", "aten::zero"})


def _adds_constant_zero(n: Node) -> bool:
    other = n.args[1] if len(n.args) > 1 else None
    return is_const(other, 0) or any(i.op in _ZERO_FILLS for i, _ in n.inputs)


def _adding_zeros(rule: Callable[..., Any]) -> Callable[..., Any]:
    """`rule` (an add with a constant zero operand), with its zero sums made +0.0 (Note [Adding
    a constant zero])."""

    def add(*args: Any, **kwargs: Any) -> Any:
        out = jnp.asarray(rule(*args, **kwargs))
        if not jnp.issubdtype(out.dtype, jnp.inexact):
            return out
        if jnp.issubdtype(out.dtype, jnp.complexfloating):
            return jax.lax.complex(_positive_zero(out.real), _positive_zero(out.imag))
        return _positive_zero(out)

    return add


def _positive_zero(x: Any) -> Any:
    return jnp.where(x == 0, jnp.zeros((), x.dtype), x)


def _constrained_to(step: tuple, sharding: Any) -> bool:
    return (
        step[0] not in (DATA, SCAL, CONST, EMPTY)
        and step[6] == "xla::mark_sharding"
        and (step[3][1] == sharding)
    )


def _check_shapes(name: str, src: Any, outs: tuple, shapes: tuple) -> None:
    """A rule's outputs must have the shapes recorded for them (PyTorch's): a mismatch is a
    lowering bug, reported here at trace time rather than as a wrong-shaped tensor later."""
    got = tuple(tuple(jnp.shape(o)) for o in outs)
    if got != shapes:
        where = f" (recorded at {src})" if src else ""
        raise LoweringError(
            f"lowering {name}{where} produced shapes {list(got)}, PyTorch's are {list(shapes)}"
        )


class LoweringError(RuntimeError):
    """A lowering rule failed while building the graph's JAX function."""


def _flatten(outs: tuple) -> tuple:
    if any(isinstance(o, (list, tuple)) for o in outs):
        flat: list[Any] = []
        for o in outs:
            flat.extend(o if isinstance(o, (list, tuple)) else (o,))
        return tuple(flat)
    return outs


def _subst(x: Any, ins: list[jax.Array]) -> Any:
    if type(x) is Ref:
        return ins[x]
    if type(x) is tuple and x and any(type(e) is Ref or type(e) is tuple for e in x):
        return tuple(_subst(e, ins) for e in x)
    return x
