"""The long tail of math: special functions, integer math, scans, order statistics, losses."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jss
import numpy as np
import torch
from jax import lax

from ..runtime import jnp_dtype
from . import creation, elementwise, linalg
from .reduction import _acc, _dims
from .registry import is_const, lowering

aten = torch.ops.aten


def _f(x):
    """Reduced-precision floats computed in float32 (PyTorch's opmath); ints promoted to float."""
    if x.dtype in (jnp.bfloat16, jnp.float16):
        return x.astype(jnp.float32)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x.astype(jnp.float32)
    return x


def _d(dim, n):
    return dim + n if dim < 0 else dim


def _ax(x, dim):
    return _d(dim, x.ndim) if x.ndim else 0


# --- elementwise ----------------------------------------------------------------------------------


@lowering(aten.polygamma.default)
def polygamma(n, x):
    x = _f(x)
    if n == 0:
        return elementwise.digamma(x)
    # jax's polygamma is for x > 0: shift negative x up with the recurrence
    # psi_n(x) = psi_n(x + k) - (-1)^n n! sum_{j<k} (x + j)^-(n+1).
    k = 16
    neg = x < 0
    xs = jnp.where(neg, x + k, x)
    out = jss.polygamma(n, xs)
    corr = sum(1.0 / (x + j) ** (n + 1) for j in range(k))
    sign = 1.0 if n % 2 else -1.0
    out = jnp.where(neg, out + sign * math.factorial(n) * corr, out)
    return jnp.where(x == 0, sign * jnp.inf, out)  # the pole at 0, signed as eager's


@lowering(aten.round.decimals)
def round_decimals(x, *, decimals):
    return jnp.round(_f(x), decimals)


@lowering(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(x):
    return jax.nn.log_sigmoid(_f(x)), jnp.exp(-jnp.abs(_f(x)))  # eager CPU's buffer


@lowering(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad, x, buffer):
    return _f(grad) * jax.nn.sigmoid(-_f(x))


@lowering(aten.isneginf.default)
def isneginf(x):
    return jnp.isneginf(x)


@lowering(aten.isposinf.default)
def isposinf(x):
    return jnp.isposinf(x)


@lowering(aten.logaddexp.default)
def logaddexp(x, y):
    return jnp.logaddexp(_f(x), _f(y))


@lowering(aten.logaddexp2.default)
def logaddexp2(x, y):
    return jnp.logaddexp2(_f(x), _f(y))


@lowering(aten.sinc.default)
def sinc(x):
    return jnp.sinc(_f(x))


@lowering(aten.heaviside.default)
def heaviside(x, values):
    return jnp.where(x == 0, values.astype(x.dtype), (x > 0).astype(x.dtype))


@lowering(aten.gcd.default)
def gcd(x, y):
    return jnp.gcd(x, y)


@lowering(aten.lcm.default)
def lcm(x, y):
    return jnp.lcm(x, y)


def _shift_dtype(x, y):
    x, y = jnp.asarray(x), jnp.asarray(y)
    dt = jnp.result_type(x, y) if x.ndim else x.dtype
    return x.astype(dt), y.astype(dt)


@lowering(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar)
def bitwise_left_shift(x, y):
    x, y = _shift_dtype(x, y)
    bits = x.dtype.itemsize * 8
    return jnp.where((y >= bits) | (y < 0), jnp.zeros_like(x), jnp.left_shift(x, y))


@lowering(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar)
def bitwise_right_shift(x, y):
    x, y = _shift_dtype(x, y)
    bits = x.dtype.itemsize * 8
    big = (y >= bits) | (y < 0)
    sat = (
        jnp.where(x < 0, -1, 0).astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.signedinteger) else 0
    )
    return jnp.where(big, sat, jnp.right_shift(x, jnp.where(big, 0, y)))


@lowering(aten.frexp.Tensor, opmath=False)  # the mantissa/exponent split of its own dtype
def frexp(x):
    m, e = jnp.frexp(x)
    return m, e.astype(jnp.int32)


@lowering(aten.igamma.default)
def igamma(a, x):
    return jss.gammainc(_f(a), _f(x))


@lowering(aten.igammac.default)
def igammac(a, x):
    return jss.gammaincc(_f(a), _f(x))


@lowering(aten.hardshrink.default)
def hardshrink(x, lambd=0.5):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros_like(x), x)


@lowering(aten.hardshrink_backward.default)
def hardshrink_backward(grad, x, lambd):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros_like(grad), grad)


@lowering(aten.softshrink.default)
def softshrink(x, lambd=0.5):
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, jnp.zeros_like(x)))


@lowering(aten.softshrink_backward.default)
def softshrink_backward(grad, x, lambd):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros_like(grad), grad)


@lowering(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad, x):
    return jnp.where((x > -3) & (x < 3), grad / 6, jnp.zeros_like(grad))


@lowering(aten.hardswish_backward.default)
def hardswish_backward(grad, x):
    mid = grad * (x / 3 + 0.5)
    return jnp.where(x < -3, jnp.zeros_like(grad), jnp.where(x <= 3, mid, grad))


@lowering(aten.logit_backward.default)
def logit_backward(grad, x, eps=None):
    g = grad / (x * (1 - x))
    if eps is None:
        return jnp.where((x < 0) | (x > 1), jnp.nan, g)
    return jnp.where((x < eps) | (x > 1 - eps), jnp.zeros_like(g), g)


@lowering(aten.angle.default)
def angle(x):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.angle(x)
    x = _f(x)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0).astype(x.dtype))


@lowering(aten.special_i0e.default)
def special_i0e(x):
    return jss.i0e(_f(x))


@lowering(aten.special_i1.default)
def special_i1(x):
    return jss.i1(_f(x))


@lowering(aten.special_i1e.default)
def special_i1e(x):
    return jss.i1e(_f(x))


@lowering(aten.special_ndtri.default)
def special_ndtri(x):
    return jss.ndtri(_f(x))


@lowering(aten.special_log_ndtr.default)
def special_log_ndtr(x):
    return jss.log_ndtr(_f(x))


@lowering(aten.special_erfcx.default)
def special_erfcx(x):
    x = _f(x)
    # erfcx(x) = exp(x^2) erfc(x); for large x use the asymptotic-stable form via log_ndtr.
    big = x > 5
    xs = jnp.where(big, 0.0, x)
    small = jnp.exp(xs * xs) * jss.erfc(xs)
    xb = jnp.where(big, x, 6.0)
    z = 1.0 / (xb * xb)
    series = (1 - 0.5 * z + 0.75 * z * z - 1.875 * z**3 + 6.5625 * z**4) / (xb * np.sqrt(np.pi))
    return jnp.where(big, series, small)


@lowering(aten.special_xlog1py.default, opmath=False)  # rounds its log1p (elementwise.xlog)
def special_xlog1py(x, y):
    return elementwise.xlog(x, y, jnp.log1p, lambda a, b: jss.xlog1py(_f(a), _f(b)))


@lowering(aten.special_entr.default)
def special_entr(x):
    x = _f(x)
    return jnp.where(x > 0, -x * jnp.log(jnp.where(x > 0, x, 1)), jnp.where(x == 0, 0.0, -jnp.inf))


@lowering(aten.special_zeta.default)
def special_zeta(x, q):
    """Hurwitz zeta with eager's (Cephes') domain: inf at x == 1 and at nonpositive integer q,
    nan for x < 1 and for a negative non-integer q with a non-integer x."""
    x, q = jnp.broadcast_arrays(_f(x), _f(q))
    out = jss.zeta(x, q)
    q_pole = (q <= 0) & (q == jnp.floor(q))
    out = jnp.where((q <= 0) & ~q_pole & (x != jnp.floor(x)), jnp.nan, out)
    out = jnp.where(q_pole, jnp.inf, out)
    out = jnp.where(x < 1, jnp.nan, out)
    return jnp.where(x == 1, jnp.inf, out)


@lowering(aten.mvlgamma.default)
def mvlgamma(x, p):
    x = _f(x)
    out = p * (p - 1) / 4 * np.log(np.pi)
    for j in range(p):
        out = out + jss.gammaln(x - j / 2)
    return out


@lowering(aten.polar.default)
def polar(r, theta):
    return lax.complex(r * jnp.cos(theta), r * jnp.sin(theta))


@lowering(aten.complex.default)
def complex_(re, im):
    return lax.complex(*jnp.broadcast_arrays(re, im))


@lowering(aten.trace.default)
def trace(x):
    acc = x.astype(jnp.int64) if not jnp.issubdtype(x.dtype, jnp.inexact) else x
    return jnp.trace(acc)


@lowering(aten.renorm.default, static=("p",))  # the norm's formula depends on p
def renorm(x, p, dim, maxnorm):
    d = _ax(x, dim)
    axes = tuple(i for i in range(x.ndim) if i != d)
    xf = _f(x)
    if p == math.inf:
        norm = jnp.max(jnp.abs(xf), axis=axes, keepdims=True)
    else:
        norm = jnp.sum(jnp.abs(xf) ** p, axis=axes, keepdims=True) ** (1.0 / p)
    factor = jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1.0)
    return xf * factor


@lowering(aten.addmv.default)
def addmv(bias, mat, vec, *, beta=1, alpha=1):
    return linalg.add_scaled(linalg.matmul_opmath(mat, vec), bias, beta, alpha)


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
    alpha, beta = linalg._coef(alpha, dt), linalg._coef(beta, dt)
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


@lowering(aten.glu.default)
def glu(x, dim=-1):
    a, b = jnp.split(x, 2, axis=_ax(x, dim))
    return a * jax.nn.sigmoid(_f(b)).astype(x.dtype)


@lowering(aten.glu_backward.default)
def glu_backward(grad, x, dim):
    return jax.vjp(lambda v: glu(v, dim), x)[1](grad)[0]


@lowering(aten._prelu_kernel.default)
def prelu(x, weight):
    w = weight.reshape((1, -1) + (1,) * (x.ndim - 2)) if x.ndim >= 2 and weight.size > 1 else weight
    return jnp.where(x > 0, x, w * x)


@lowering(aten._prelu_kernel_backward.default)
def prelu_backward(grad, x, weight):
    # The weight's gradient is elementwise, in the broadcast shape (autograd sums it to the
    # weight's shape afterwards), as eager's kernel returns it.
    w = weight.reshape((1, -1) + (1,) * (x.ndim - 2)) if x.ndim >= 2 and weight.size > 1 else weight
    pos = x > 0
    gx = jnp.where(pos, grad, w * grad)
    gw = jnp.where(pos, jnp.zeros_like(x), x * grad)
    shape = jnp.broadcast_shapes(x.shape, jnp.shape(w))
    return jnp.broadcast_to(gx, shape), jnp.broadcast_to(gw, shape)


# --- reductions, scans, order statistics ---------------------------------------------------------


@lowering(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, dtype=None):
    return jnp.nansum(_acc(x, dtype), axis=_dims(x, dim), keepdims=keepdim)


@lowering(aten.std_mean.correction, static=("correction",))  # as var's (reduction.py)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    d = _dims(x, dim)
    c = 1 if correction is None else correction
    return jnp.std(x, axis=d, ddof=c, keepdims=keepdim), jnp.mean(x, axis=d, keepdims=keepdim)


@lowering(aten.aminmax.default)
def aminmax(x, *, dim=None, keepdim=False):
    if dim is None:
        if keepdim:
            shape = (1,) * x.ndim
            return jnp.min(x).reshape(shape), jnp.max(x).reshape(shape)
        return jnp.min(x), jnp.max(x)
    if x.ndim == 0:
        return x, x
    d = _ax(x, dim)
    return jnp.min(x, axis=d, keepdims=keepdim), jnp.max(x, axis=d, keepdims=keepdim)


@lowering(aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim):
    return jnp.sum(x != 0, axis=_dims(x, dim), dtype=jnp.int64)


@lowering(aten.count_nonzero.default)
def count_nonzero_opt(x, dim=None):
    axis = None if dim is None or x.ndim == 0 else _ax(x, dim)
    return jnp.sum(x != 0, axis=axis, dtype=jnp.int64)


def _cum_extreme(x, dim, better):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = _ax(x, dim)
    idx = jnp.broadcast_to(
        jnp.arange(x.shape[d], dtype=jnp.int64).reshape((-1,) + (1,) * (x.ndim - d - 1)), x.shape
    )

    def comb(a, b):
        av, ai = a
        bv, bi = b
        # PyTorch takes the later index on ties (>=) and lets NaN win and stick.
        take_b = (
            better(bv, av) | (bv == av) | jnp.isnan(bv)
            if jnp.issubdtype(x.dtype, jnp.floating)
            else better(bv, av) | (bv == av)
        )
        if jnp.issubdtype(x.dtype, jnp.floating):
            take_b = take_b & ~(jnp.isnan(av) & ~jnp.isnan(bv))
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    return lax.associative_scan(comb, (x, idx), axis=d)


@lowering(aten.cummax.default)
def cummax(x, dim):
    return _cum_extreme(x, dim, jnp.greater)


@lowering(aten.cummin.default)
def cummin(x, dim):
    return _cum_extreme(x, dim, jnp.less)


@lowering(aten._logcumsumexp.default, aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    if x.ndim == 0:
        return x
    return lax.cumlogsumexp(x, axis=_ax(x, dim))


def _sorted_along(x, d):
    """Values sorted ascending with NaN last, and the stable sort indices."""
    idx = jnp.argsort(x, axis=d, stable=True)
    return jnp.take_along_axis(x, idx, axis=d), idx


@lowering(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = _ax(x, dim)
    v, i = _sorted_along(x, d)
    v = lax.index_in_dim(v, k - 1, d, keepdims=keepdim)
    i = lax.index_in_dim(i, k - 1, d, keepdims=keepdim)
    return v, i


def _median_dim(x, dim, keepdim, ignore_nan):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = _ax(x, dim)
    n = x.shape[d]
    v, i = _sorted_along(x, d)
    if ignore_nan and jnp.issubdtype(x.dtype, jnp.floating):
        cnt = jnp.sum(~jnp.isnan(x), axis=d, keepdims=True)
        pos = jnp.maximum((cnt - 1) // 2, 0)
    else:
        pos = jnp.full([1 if a == d else s for a, s in enumerate(x.shape)], (n - 1) // 2)
        if jnp.issubdtype(x.dtype, jnp.floating):  # any NaN: the median is NaN (first NaN)
            nan_any = jnp.any(jnp.isnan(x), axis=d, keepdims=True)
            first_nan = jnp.sum(~jnp.isnan(x), axis=d, keepdims=True)
            pos = jnp.where(nan_any, first_nan, pos)
    val = jnp.take_along_axis(v, pos, axis=d)
    ind = jnp.take_along_axis(i, pos, axis=d)
    if not keepdim:
        val, ind = jnp.squeeze(val, d), jnp.squeeze(ind, d)
    return val, ind


@lowering(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, False)


@lowering(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, True)


@lowering(aten.median.default)
def median(x):
    return _median_dim(x.reshape(-1), 0, False, False)[0]


@lowering(aten.nanmedian.default)
def nanmedian(x):
    return _median_dim(x.reshape(-1), 0, False, True)[0]


@lowering(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    if x.dtype == jnp.bool_:
        v, i = mode(x.astype(jnp.int8), dim, keepdim)
        return v.astype(jnp.bool_), i
    d = _ax(x, dim)
    xm = jnp.moveaxis(x, d, -1)
    # count of each element's value along the row; the most frequent, smallest value wins; its
    # index is the last occurrence (as PyTorch's CPU kernel returns).
    eq = xm[..., :, None] == xm[..., None, :]
    cnt = jnp.sum(eq, axis=-1)
    best = jnp.max(cnt, axis=-1, keepdims=True)
    cand = jnp.where(
        cnt == best,
        xm,
        jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).max,
    )
    val = jnp.min(cand, axis=-1, keepdims=True)
    n = xm.shape[-1]
    pos = jnp.where(xm == val, jnp.arange(n), -1)
    ind = jnp.max(pos, axis=-1, keepdims=True)
    val, ind = jnp.moveaxis(val.astype(x.dtype), -1, d), jnp.moveaxis(ind, -1, d)
    if not keepdim:
        val, ind = jnp.squeeze(val, d), jnp.squeeze(ind, d)
    return val, ind


@lowering(aten.take.default)
def take(x, index):
    flat = x.reshape(-1)
    i = jnp.where(index < 0, index + flat.shape[0], index)
    return flat[i]


@lowering(aten.bucketize.Tensor)
def bucketize(x, boundaries, *, out_int32=False, right=False):
    return jnp.searchsorted(boundaries, x, side="right" if right else "left")


@lowering(aten.bucketize.Scalar)
def bucketize_scalar(x, boundaries, *, out_int32=False, right=False):
    return jnp.searchsorted(boundaries, x, side="right" if right else "left")


@lowering(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(seq, x, *, out_int32=False, right=False, side=None, sorter=None):
    side = side or ("right" if right else "left")
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    if seq.ndim == 1:
        return jnp.searchsorted(seq, x, side=side)
    lead = seq.shape[:-1]
    s2 = seq.reshape(-1, seq.shape[-1])
    x2 = x.reshape(s2.shape[0], -1)
    out = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(s2, x2)
    return out.reshape(lead + x.shape[-1:])


@lowering(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    if x.size == 0:
        return jnp.zeros((bins,), x.dtype)
    xf = x.reshape(-1)
    lo, hi = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    auto = (lo == 0) & (hi == 0)
    lo = jnp.where(auto, jnp.min(xf), lo)
    hi = jnp.where(auto, jnp.max(xf), hi)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    inside = (xf >= lo) & (xf <= hi)
    pos = ((xf - lo) * bins / (hi - lo)).astype(jnp.int64)
    pos = jnp.clip(pos, 0, bins - 1)
    return jnp.zeros((bins,), x.dtype).at[pos].add(inside.astype(x.dtype))


@lowering(aten.logspace.default, static=("start", "end"))
def logspace(
    start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None
):
    dt = jnp_dtype(dtype if dtype is not None else torch.get_default_dtype())
    if jnp.issubdtype(dt, jnp.integer):  # eager: integer bounds, float64 exponents
        exps = creation.eager_linspace(int(start), int(end), steps, jnp.float64)
        return jnp.power(float(base), exps).astype(dt)
    acc = jnp.float32 if dt in (jnp.bfloat16, jnp.float16) else dt  # rounded once
    return jnp.power(
        jnp.asarray(base, acc), creation.eager_linspace(start, end, steps, acc)
    ).astype(dt)


def _tri_indices(row, col, offset, lower):
    r, c = np.indices((row, col))
    keep = (c - r <= offset) if lower else (c - r >= offset)
    return np.stack([r[keep], c[keep]])


@lowering(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(_tri_indices(row, col, offset, False), jnp.int64)


@lowering(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(_tri_indices(row, col, offset, True), jnp.int64)


@lowering(aten.isin.Tensor_Tensor)
def isin(x, test, *, assume_unique=False, invert=False):
    out = jnp.isin(x, test)
    return ~out if invert else out


@lowering(aten.isin.Tensor_Scalar)
def isin_ts(x, test, *, assume_unique=False, invert=False):
    out = x == test
    return ~out if invert else out


@lowering(aten.isin.Scalar_Tensor)
def isin_st(x, test, *, assume_unique=False, invert=False):
    out = jnp.any(test == x)
    return ~out if invert else out


# --- FFT (PyTorch's normalization codes: 0 none, 1 by 1/sqrt(n), 2 by 1/n) -----------------------


def _fft_scale(y, n, normalization):
    if normalization == 1:
        return y / np.sqrt(n).astype(np.float32)
    if normalization == 2:
        return y / n
    return y


@lowering(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    axes = tuple(_d(d, x.ndim) for d in dim)
    n = int(np.prod([x.shape[a] for a in axes]))
    y = jnp.fft.rfftn(x, axes=axes) if onesided else jnp.fft.fftn(x, axes=axes)
    return _fft_scale(y, n, normalization)


@lowering(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    axes = tuple(_d(d, x.ndim) for d in dim)
    n = int(np.prod([x.shape[a] for a in axes]))
    if not axes:
        return x
    y = jnp.fft.fftn(x, axes=axes) if forward else jnp.fft.ifftn(x, axes=axes) * n
    return _fft_scale(y, n, normalization)


@lowering(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    axes = tuple(_d(d, x.ndim) for d in dim)
    s = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    n = int(np.prod(s))
    y = jnp.fft.irfftn(x, s=s, axes=axes) * n
    return _fft_scale(y, n, normalization)


@lowering(aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype, static=("p",))
def norm_dim(x, p=2, dim=(), keepdim=False, *, dtype=None):
    from .reduction import vector_norm

    return vector_norm(
        _acc(x, dtype) if dtype is not None else x, 2 if p is None else p, dim, keepdim
    )


@lowering(aten.norm.Scalar, aten.norm.ScalarOpt_dtype, static=("p",))
def norm_all(x, p=2, *, dtype=None):
    from .reduction import vector_norm

    return vector_norm(_acc(x, dtype) if dtype is not None else x, 2 if p is None else p)


# --- orthogonal polynomials (PyTorch's Math.h: the same special cases, then the recurrence) -------


def _poly(x, n, p1, step, special=None):
    """p_n(x) by p_{k+1} = step(k, x, p_{k-1}, p_k), p_0 = 1, p_1 = p1(x); n is per element."""
    x = _f(x)
    n = jnp.broadcast_to(jnp.asarray(n), jnp.broadcast_shapes(jnp.shape(x), jnp.shape(n)))
    n = jnp.trunc(n).astype(jnp.int64) if jnp.issubdtype(n.dtype, jnp.inexact) else n
    n = n.astype(jnp.int64)
    x = jnp.broadcast_to(x, n.shape)
    q1 = p1(x)
    out = jnp.where(n == 0, jnp.ones_like(x), jnp.where(n == 1, q1, jnp.zeros_like(x)))

    def cond(c):
        return c[0] < jnp.max(n, initial=0)

    def body(c):
        k, p, q, out = c
        r = step(k.astype(x.dtype), x, p, q)
        out = jnp.where(n == k + 1, r, out)
        return k + 1, q, r, out

    _, _, _, out = lax.while_loop(cond, body, (jnp.int64(1), jnp.ones_like(x), q1, out))
    if special is not None:
        out = special(x, n, out)
    return jnp.where(n < 0, jnp.zeros_like(out), out)


def _odd(n):
    return (n % 2) == 1


def _cheb_t(x, n):
    def special(x, n, out):
        nf = n.astype(x.dtype)
        edge = jnp.where((x > 0) | ~_odd(n), 1.0, -1.0).astype(x.dtype)
        trig = jnp.cos(nf * jnp.arccos(x))
        out = jnp.where((n > 6) & (jnp.abs(x) < 1), trig, out)
        return jnp.where(jnp.abs(x) == 1, edge, out)

    return _poly(x, n, lambda x: x, lambda k, x, p, q: (x + x) * q - p, special)


def _cheb_u(x, n):
    def special(x, n, out):
        nf = n.astype(x.dtype)
        edge = jnp.where((x > 0) | ~_odd(n), nf + 1, -(nf + 1))
        a = jnp.arccos(x)
        s = jnp.sin(a)
        trig = jnp.where(
            s != 0,
            jnp.sin((nf + 1) * a) / jnp.where(s != 0, s, 1),
            (nf + 1) * jnp.cos((nf + 1) * a) / x,
        )
        out = jnp.where((n > 8) & (jnp.abs(x) < 1), trig, out)
        return jnp.where(jnp.abs(x) == 1, edge, out)

    return _poly(x, n, lambda x: x + x, lambda k, x, p, q: (x + x) * q - p, special)


def _cheb_v(x, n):
    def special(x, n, out):
        nf = n.astype(x.dtype)
        odd = jnp.where(_odd(n), -(nf + nf + 1), nf + nf + 1)
        edge = jnp.where(x > 0, jnp.ones_like(x), odd)
        a = jnp.arccos(x)
        h = jnp.sin(a / 2)
        trig = jnp.where(h != 1, jnp.cos((nf + 0.5) * a) / jnp.cos(a / 2), odd)
        out = jnp.where((n > 8) & (jnp.abs(x) < 1), trig, out)
        return jnp.where(jnp.abs(x) == 1, edge, out)

    return _poly(x, n, lambda x: x + x - 1, lambda k, x, p, q: (x + x) * q - p, special)


def _cheb_w(x, n):
    def special(x, n, out):
        nf = n.astype(x.dtype)
        edge = jnp.where(x > 0, nf + nf + 1, jnp.where(_odd(n), -1.0, 1.0).astype(x.dtype))
        a = jnp.arccos(x)
        c = jnp.cos(a / 2)
        trig = jnp.where(
            c != 1,
            jnp.sin((nf + 0.5) * a) / jnp.sin(a / 2),
            jnp.where(x > 0, nf + nf + 1, jnp.where(_odd(n), -1.0, 1.0).astype(x.dtype)),
        )
        out = jnp.where((n > 8) & (jnp.abs(x) < 1), trig, out)
        return jnp.where(jnp.abs(x) == 1, edge, out)

    return _poly(x, n, lambda x: x + x + 1, lambda k, x, p, q: (x + x) * q - p, special)


def _hermite_h(x, n):
    return _poly(x, n, lambda x: x + x, lambda k, x, p, q: (x + x) * q - (k + k) * p)


def _hermite_he(x, n):
    return _poly(x, n, lambda x: x, lambda k, x, p, q: x * q - k * p)


def _laguerre(x, n):
    def special(x, n, out):
        return jnp.where((jnp.abs(x) == 0) & (n >= 0), jnp.ones_like(out), out)

    return _poly(
        x, n, lambda x: 1 - x, lambda k, x, p, q: ((k + k + (1 - x)) * q - k * p) / (k + 1), special
    )


def _legendre(x, n):
    def special(x, n, out):
        edge = jnp.where((x > 0) | (n == 0) | ~_odd(n), 1.0, -1.0).astype(x.dtype)
        return jnp.where(jnp.abs(x) == 1, edge, out)

    return _poly(
        x, n, lambda x: x, lambda k, x, p, q: ((k + k + 1) * x * q - k * p) / (k + 1), special
    )


def _shifted(fn):
    return lambda x, n: fn(_f(x) + _f(x) - 1, n)


for _name, _fn in (
    ("chebyshev_polynomial_t", _cheb_t),
    ("chebyshev_polynomial_u", _cheb_u),
    ("chebyshev_polynomial_v", _cheb_v),
    ("chebyshev_polynomial_w", _cheb_w),
    ("shifted_chebyshev_polynomial_t", _shifted(_cheb_t)),
    ("shifted_chebyshev_polynomial_u", _shifted(_cheb_u)),
    ("shifted_chebyshev_polynomial_v", _shifted(_cheb_v)),
    ("shifted_chebyshev_polynomial_w", _shifted(_cheb_w)),
    ("hermite_polynomial_h", _hermite_h),
    ("hermite_polynomial_he", _hermite_he),
    ("laguerre_polynomial_l", _laguerre),
    ("legendre_polynomial_p", _legendre),
):
    lowering(getattr(aten, "special_" + _name).default)(lambda x, n, _fn=_fn: _fn(x, n))


@lowering(aten.special_modified_bessel_i0.default)
def special_modified_bessel_i0(x):
    return jss.i0(_f(x))


@lowering(aten.special_modified_bessel_i1.default)
def special_modified_bessel_i1(x):
    return jss.i1(_f(x))


@lowering(aten.special_spherical_bessel_j0.default)
def spherical_bessel_j0(x):
    x = _f(x)
    safe = jnp.where(x == 0, 1.0, x)
    return jnp.where(x == 0, 1.0, jnp.sin(safe) / safe)


@lowering(aten._conj_physical.default)  # conj_physical is composite: it calls this for complex x
def conj_physical(x):
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


def _histogram(x, edges, weight, density):
    """Counts (or weights) of x per bin [e_i, e_i+1), the last bin closed; values outside the
    edges are not counted. Bins are found against the edges themselves (as eager does), so a value
    on an edge lands in the bin that edge opens."""
    xf, bins = x.reshape(-1), edges.shape[0] - 1
    pos = jnp.searchsorted(edges, xf, side="right") - 1
    pos = jnp.where(xf == edges[-1], bins - 1, pos)
    inside = (xf >= edges[0]) & (xf <= edges[-1])
    w = jnp.ones_like(xf) if weight is None else weight.reshape(-1).astype(xf.dtype)
    hist = jnp.zeros((bins,), xf.dtype).at[jnp.clip(pos, 0, bins - 1)].add(jnp.where(inside, w, 0))
    if density:
        hist = hist / (jnp.sum(hist) * (edges[1:] - edges[:-1]))
    return hist, edges


@lowering(aten.histogram.bin_ct, static=("range",))
def histogram_bin_ct(x, bins=100, *, range=None, weight=None, density=False):
    if range is not None:
        lo, hi = jnp.asarray(range[0], x.dtype), jnp.asarray(range[1], x.dtype)
    elif x.size == 0:  # eager: edges [0, 1]
        lo, hi = jnp.zeros((), x.dtype), jnp.ones((), x.dtype)
    else:
        lo, hi = jnp.min(x), jnp.max(x)
    same = lo == hi  # eager widens an empty range by 0.5 on each side
    lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
    edges = creation.eager_linspace(lo, hi, bins + 1, x.dtype)
    return _histogram(x, edges, weight, density)


@lowering(aten.histogram.bins_tensor)
def histogram_bins_tensor(x, bins, *, weight=None, density=False):
    return _histogram(x, bins.astype(x.dtype), weight, density)
