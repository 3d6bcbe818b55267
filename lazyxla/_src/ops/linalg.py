"""Matrix products."""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from .registry import axis_of, float_operand, is_const, lowering, to_opmath

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
@lowering(aten.dot.default)
def dot(a, b):
    return matmul_opmath(a, b)


@lowering(aten.vdot.default)
def vdot(a, b):
    """The first vector conjugated (lowered as `dot`, a complex vdot was dot(a, b))."""
    return matmul_opmath(jnp.conj(a) if jnp.iscomplexobj(a) else a, b)


@lowering(aten.mv.default)
def mv(a, b):
    return matmul_opmath(a, b)


@lowering(aten.trace.default, opmath=True)
def trace(x):
    acc = x.astype(jnp.int64) if not jnp.issubdtype(x.dtype, jnp.inexact) else x
    return jnp.trace(acc)


@lowering(aten.renorm.default, static=("p",), opmath=True)  # the norm's formula depends on p
def renorm(x, p, dim, maxnorm):
    d = axis_of(x, dim)
    axes = tuple(i for i in range(x.ndim) if i != d)
    xf = float_operand(x)
    if p == math.inf:
        norm = jnp.max(jnp.abs(xf), axis=axes, keepdims=True)
    else:
        norm = jnp.sum(jnp.abs(xf) ** p, axis=axes, keepdims=True) ** (1.0 / p)
    factor = jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1.0)
    return xf * factor


@lowering(aten.addmv.default, opmath=True)
def addmv(bias, mat, vec, *, beta=1, alpha=1):
    return add_scaled(matmul_opmath(mat, vec), bias, beta, alpha)


@lowering(aten.addr.default, opmath=False)
def addr(x, vec1, vec2, *, beta=1, alpha=1):
    """Eager's kernel: elementwise beta * self + alpha * vec1 * vec2 in the result dtype, where
    bf16/fp16 round every product and the sum (Vectorized<BFloat16> arithmetic, not opmath; alpha
    and beta arrive rounded to the dtype, Note [Scalar precision]); beta == 0 ignores self, NaNs
    included; bool is (beta and self) or (alpha and vec1 and vec2)."""
    v1, v2 = vec1[:, None], vec2[None, :]
    dt = jnp.result_type(x, v1, v2)
    if dt == jnp.bool_:
        out = jnp.logical_and(jnp.logical_and(alpha, v1), v2)
        return jnp.logical_or(jnp.logical_and(beta, x), out)
    alpha, beta = _coef(alpha, dt), _coef(beta, dt)
    if dt in (jnp.bfloat16, jnp.float16):
        f32 = jnp.float32

        def op(a, b, fn):  # one eager op: computed in float32, rounded to the dtype
            return fn(jnp.asarray(a).astype(f32), jnp.asarray(b).astype(f32)).astype(dt)
    else:

        def op(a, b, fn):
            return fn(a, b)

    out = op(op(alpha, v1, jnp.multiply), v2, jnp.multiply)
    if is_const(beta, 0):
        return jnp.broadcast_to(out, jnp.broadcast_shapes(jnp.shape(x), out.shape))
    return jnp.where(beta == 0, out, op(op(beta, x, jnp.multiply), out, jnp.add))
