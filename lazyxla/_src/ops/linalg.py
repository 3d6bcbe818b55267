"""Matrix products."""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from ..meta import META_RULES
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


# Note [Grouped matmul]
# `torch._grouped_mm` (F.grouped_mm: transformers' mixture-of-experts layers) has only a composite
# kernel off CUDA, which reads `offs` to the host and multiplies static slices: on lazyxla each new
# routing of tokens to experts was a new graph (a Mixtral training step compiled twice per step).
# Lowered to XLA's ragged dot, `offs` stays data. The three layouts with offsets, as PyTorch
# defines them (offs: each group's end along the ragged dimension):
#   2-D (m, k) x 3-D (g, k, n) -> (m, n): rows of group j multiply b[j] (the forward, and the
#       input's gradient);
#   2-D (k, m) x 2-D (m, n) -> (g, k, n): group j sums over its part of m (the weights' gradient);
#   3-D (g, m, k) x 2-D (k, n) -> (m, n): columns of group j come from a[j].
# Rows (columns) past the last offset are 0 (eager leaves them uninitialized); an empty group's
# product is 0. Without offsets it is a batched matmul (3-D x 3-D).
def _group_sizes(offs, total):
    ends = jnp.minimum(offs.astype(jnp.int32), total)
    return jnp.diff(ends, prepend=jnp.zeros((1,), jnp.int32))


def _ragged(lhs, rhs, sizes, dims):
    pref = jnp.float32 if lhs.dtype in _LOW else None
    return lax.ragged_dot_general(
        lhs, rhs, sizes, dims, precision=_HIGHEST, preferred_element_type=pref
    )


_ROWS = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((1,), (1,)), ((), ())),
    lhs_ragged_dimensions=(0,),
    rhs_group_dimensions=(0,),
)
_CONTRACTED = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((1,), (0,)), ((), ())),
    lhs_ragged_dimensions=(1,),
    rhs_group_dimensions=(),
)


@lowering(aten._grouped_mm.default)
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    if offs is None:
        return matmul_opmath(a, b)
    if a.ndim == 2 and b.ndim == 3:
        return _ragged(a, b, _group_sizes(offs, a.shape[0]), _ROWS)
    if a.ndim == 2:
        return _ragged(a, b, _group_sizes(offs, a.shape[1]), _CONTRACTED)
    # 3-D x 2-D: ragged columns, as the transposed 2-D x 3-D product
    return _ragged(b.T, jnp.swapaxes(a, 1, 2), _group_sizes(offs, b.shape[1]), _ROWS).T


def _grouped_mm_meta(a, b, offs=None, bias=None, out_dtype=None):
    """The output of each case of Note [Grouped matmul]. PyTorch's meta kernel is CUDA's, which
    takes bfloat16 alone; eager's CPU kernel (and this lowering) any floating dtype."""
    torch._check(
        a.dim() in (2, 3) and b.dim() in (2, 3),
        lambda: (
            f"Multiplicands must be 2D or 3D but got mat_a.dim()={a.dim()} and "
            f"mat_b.dim()={b.dim()}"
        ),
    )
    torch._check(
        a.dtype == b.dtype, lambda: f"mat_a and mat_b must have one dtype: {a.dtype}, {b.dtype}"
    )
    torch._check(bias is None, lambda: "Bias not supported yet")  # (eager's CPU kernel's words)
    torch._check(
        a.size(-1) == b.size(-2 if b.dim() == 3 else 0),
        lambda: (
            f"contraction dimension of mat_a and mat_b must match: {tuple(a.shape)}, "
            f"{tuple(b.shape)}"
        ),
    )
    torch._check(
        (offs is not None) == (a.dim() == 2 or b.dim() == 2),
        lambda: "offs must be given when a multiplicand is 2D, and only then",
    )
    if a.dim() == 2 and b.dim() == 3:
        shape = (a.size(0), b.size(2))
    elif a.dim() == 2:
        shape = (offs.size(0), a.size(0), b.size(1))
    elif b.dim() == 2:
        shape = (a.size(1), b.size(1))
    else:
        shape = (a.size(0), a.size(1), b.size(2))
    return a.new_empty(shape, dtype=out_dtype or a.dtype)


META_RULES[aten._grouped_mm.default] = _grouped_mm_meta
