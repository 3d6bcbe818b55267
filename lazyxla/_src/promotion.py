"""Zero-dimensional tensor operands converted to the dtype eager computes in.

# Note [Zero-dim operands]
Eager's binary, comparison and ternary pointwise ops (TensorIterator with
`promote_inputs_to_common_dtype`) convert every operand to the op's common dtype before computing.
In that dtype's choice a 0-d tensor counts less than a dimensioned one of its category: `uint8_t
// torch.tensor(-12, dtype=torch.int8)` computes in uint8, where -12 is 244, and gives 0. A lazy
0-d tensor reaches the lowering in its own dtype, and jnp promotes it as if it had dimensions
(uint8 with int8: int16), so the rule computed `5 // -12 = -1`, 255 in uint8: the results of
division, remainder, pow, maximum/minimum and comparisons differed from eager's, silently (the
sum, difference and product wrap to the same bits either way; a 0-d CPU tensor is lifted at the
right dtype when recorded). A float 0-d operand of a reduced-precision tensor was not rounded to
it either (`bf16_t.pow_(torch.tensor(0.3))`). When an operand is a 0-d tensor, the lowering
converts every operand to the dtype eager computes in first (a bool tensor's trunc division by an
int8 0-d tensor failed to lower: jnp divides no bools). That dtype is the common dtype; the float
result when an op computes a float from integer operands (true division, atan2:
`promote_integer_inputs_to_float`, each operand converted from its own value, as in Note [Integer
scalars of floating results]); float32 where eager's kernel reads a 0-d operand at the op math
type (Note [Scalar precision] in dispatch.py: `other` of mul/div/floor_divide).
A lifted Python scalar (a SCALAR leaf) was lifted at its dtype already. (An integer 0-d weight of
a float lerp computed `1 - weight` in its integer dtype: uint8 200 weighed as 57.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from .ir import SCALAR, Node, Ref
from .ops.registry import bool_to
from .runtime import jnp_dtype

_BINARY = (0, 1)
# Op name -> the argument positions eager promotes to one common dtype.
PROMOTED_OPERANDS: dict[str, tuple[int, ...]] = {
    **{
        "aten::" + op: _BINARY
        for op in (
            "add",
            "sub",
            "mul",
            "div",
            "floor_divide",
            "remainder",
            "fmod",
            "pow",
            "maximum",
            "minimum",
            "fmax",
            "fmin",
            "atan2",
            "hypot",
            "copysign",
            "nextafter",
            "logaddexp",
            "logaddexp2",
            "xlogy",
            "heaviside",
            "bitwise_and",
            "bitwise_or",
            "bitwise_xor",
            "bitwise_left_shift",
            "bitwise_right_shift",
            "gcd",
            "lcm",
            "eq",
            "ne",
            "lt",
            "le",
            "gt",
            "ge",
            "logical_and",
            "logical_or",
            "logical_xor",
        )
    },
    "aten::clamp": (0, 1, 2),
    "aten::addcmul": (0, 1, 2),
    "aten::addcdiv": (0, 1, 2),
    "aten::where": (1, 2),
    "aten::lerp": (0, 1, 2),
    "aten::isin": (0, 1),  # (not pointwise: compared in result_type(elements, test_elements))
}
# The operand eager's kernel reads at op math from its own value when it is a 0-d tensor (Note
# [Scalar precision] in dispatch.py): mul/div/floor_divide's `other`, and so their foreach ops'.
# (lerp's weight is converted to the common dtype: a float32 weight of a bf16 lerp is rounded.)
_OPMATH_OPERAND = {
    **{f"aten::{op}": 1 for op in ("mul", "div", "floor_divide")},
    **{f"aten::_foreach_{op}": 1 for op in ("mul", "div")},
}
_REDUCED = (torch.bfloat16, torch.float16)
_FOREACH_TENSOR_OPS = frozenset(
    "aten::_foreach_" + op
    for op in ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "clamp_min", "clamp_max")
)


def _computed_in(operands: list[Any], result: torch.dtype) -> torch.dtype:
    """The dtype eager converts `operands` (meta tensors, Python numbers) to: their common
    dtype, or the float `result` of an op computing it from integers (true division, atan2)."""
    _, common = elementwise_dtypes(
        *operands, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
    )
    return result if _floating(result) and not _floating(common) else common


def _zero_dim_target(op: str, position: int, common: torch.dtype) -> torch.dtype:
    """What a 0-d tensor operand at `position` converts to: `common`, or float32 where eager's
    kernel reads it at op math."""
    if _OPMATH_OPERAND.get(op) == position and common in _REDUCED:
        return torch.float32
    return common


def _meta(spec: Any) -> torch.Tensor:
    return torch.empty(spec.shape, dtype=spec.dtype, device="meta")


def _foreach_casts(n: Node) -> tuple[tuple[int, Any], ...]:
    """A foreach op's 0-d tensor `other` (`_foreach_mul_(grads, clip_coef)`), converted as each
    single op of its loop converts it, when the list has one dtype (Note [Zero-dim operands])."""
    if len(n.args) < 2 or type(n.args[1]) is not Ref or not isinstance(n.args[0], (list, tuple)):
        return ()
    node, k = n.inputs[n.args[1]]
    spec = node.specs[k]
    if spec.shape or node.op == SCALAR:
        return ()
    specs = {n.inputs[r][0].specs[n.inputs[r][1]] for r in n.args[0] if type(r) is Ref}
    if len({x.dtype for x in specs}) != 1:
        return ()
    common = _computed_in([_meta(next(iter(specs))), _meta(spec)], n.specs[0].dtype)
    target = _zero_dim_target(n.op, 1, common)
    return ((1, jnp_dtype(target)),) if spec.dtype != target else ()


def zero_dim_casts(n: Node) -> tuple[tuple[int, Any], ...]:
    """(argument position, jnp dtype) for each tensor operand of `n` that eager converts to
    another dtype before computing, when one of them is a 0-d tensor (Note [Zero-dim operands]);
    () for most nodes."""
    positions = PROMOTED_OPERANDS.get(n.op)
    if positions is None:
        return _foreach_casts(n) if n.op in _FOREACH_TENSOR_OPS else ()
    operands: list[Any] = []
    tensors: list[tuple[int, torch.dtype, bool]] = []  # (position, dtype, 0-d)
    for p in positions:
        if p >= len(n.args):
            continue
        a = n.args[p]
        if type(a) is Ref:
            node, k = n.inputs[a]
            spec = node.specs[k]
            operands.append(_meta(spec))
            if node.op != SCALAR:  # (a lifted scalar has its dtype already)
                tensors.append((p, spec.dtype, not spec.shape))
        elif isinstance(a, (bool, int, float, complex)):
            operands.append(a)
    if not any(zero_dim for _, _, zero_dim in tensors):
        return ()
    common = _computed_in(operands, n.specs[0].dtype)
    casts = []
    for p, dtype, zero_dim in tensors:
        target = _zero_dim_target(n.op, p, common) if zero_dim else common
        if dtype != target:
            casts.append((p, jnp_dtype(target)))
    return tuple(casts)


def _floating(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def converting(rule: Callable[..., Any], casts: tuple[tuple[int, Any], ...]) -> Callable[..., Any]:
    """`rule` with the operands `casts` names converted first (Note [Zero-dim operands])."""

    def run(*args: Any, **kwargs: Any) -> Any:
        args = list(args)
        for p, dt in casts:
            args[p] = bool_to(jnp.asarray(args[p]), dt)
        return rule(*args, **kwargs)

    return run
