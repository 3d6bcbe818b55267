"""Matrix products."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .registry import is_const, lowering, to_opmath

aten = torch.ops.aten
_HIGHEST = lax.Precision.HIGHEST


_LOW = (jnp.bfloat16, jnp.float16)


def matmul_opmath(a, b):
    """jnp.matmul at full precision; bf16/fp16 products accumulate in float32 and stay float32
    until the op's output is rounded once (eager's opmath; XLA's native mixed-precision dot)."""
    if a.dtype in _LOW:
        return jnp.matmul(a, b, precision=_HIGHEST, preferred_element_type=jnp.float32)
    return jnp.matmul(a, b, precision=_HIGHEST)


def _coef(c, dtype):
    """alpha/beta as eager applies them: truncated to an integer on integer tensors."""
    if not jnp.issubdtype(dtype, jnp.integer):
        return c
    return int(c) if type(c) in (int, float, bool) else c.astype(dtype)


def add_scaled(out, bias, beta, alpha):
    """beta * bias + alpha * out (the epilogue of addmm/addmv/addbmm); beta == 0 ignores bias,
    NaNs included."""
    alpha, beta = _coef(alpha, bias.dtype), _coef(beta, bias.dtype)
    bias, alpha, beta = to_opmath((bias, alpha, beta))  # linalg rules keep bf16 (Note [Opmath])
    if not is_const(alpha, 1):
        out = out * alpha
    if is_const(beta, 0):
        return out
    return out + (bias if is_const(beta, 1) else bias * beta)


@lowering(aten.mm.default)
def mm(a, b):
    return matmul_opmath(a, b)


@lowering(aten.bmm.default)
def bmm(a, b):
    return matmul_opmath(a, b)


@lowering(aten.addmm.default, aten.baddbmm.default)
def addmm(bias, a, b, beta=1, alpha=1):
    return add_scaled(matmul_opmath(a, b), bias, beta, alpha)


@lowering(aten.addbmm.default)
def addbmm(bias, a, b, beta=1, alpha=1):
    return add_scaled(jnp.sum(matmul_opmath(a, b), axis=0), bias, beta, alpha)


# Through matmul_opmath: a bf16 dot written as such is compiled by XLA's CPU backend as a float32
# dot and a convert to bf16 it inserts itself, which excess precision then drops when the next
# op reads the result in float32 (`out.add_(torch.dot(a, b))` was not rounded in between).
@lowering(aten.dot.default, aten.vdot.default)
def dot(a, b):
    return matmul_opmath(a, b)


@lowering(aten.mv.default)
def mv(a, b):
    return matmul_opmath(a, b)
