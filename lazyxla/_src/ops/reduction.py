"""Reductions and scans."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..runtime import jnp_dtype
from .registry import axis_of, lowering

aten = torch.ops.aten


def _dims(x, dim):
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return None
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(d + x.ndim if d < 0 else d for d in dim) if x.ndim else None


def _acc(x, dtype):
    if dtype is not None:
        dt = jnp_dtype(dtype)
        # A bf16/fp16 `dtype=` still accumulates in float32 (Note [Opmath]).
        return x.astype(jnp.float32 if dt in (jnp.bfloat16, jnp.float16) else dt)
    if x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.int64)
    return x


@lowering(aten.sum.dim_IntList)
def sum_(x, dim=None, keepdim=False, dtype=None):
    return jnp.sum(_acc(x, dtype), axis=_dims(x, dim), keepdims=keepdim)


@lowering(aten.sum.default)
def sum_all(x, dtype=None):
    return jnp.sum(_acc(x, dtype))


@lowering(aten.mean.dim)
def mean(x, dim=None, keepdim=False, dtype=None):
    return jnp.mean(_acc(x, dtype), axis=_dims(x, dim), keepdims=keepdim)


@lowering(aten.mean.default)
def mean_all(x, dtype=None):
    return jnp.mean(_acc(x, dtype))


@lowering(aten.prod.dim_int)
def prod(x, dim, keepdim=False, dtype=None):
    return jnp.prod(_acc(x, dtype), axis=_dims(x, dim), keepdims=keepdim)


@lowering(aten.prod.default)
def prod_all(x, dtype=None):
    return jnp.prod(_acc(x, dtype))


@lowering(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_dims(x, dim), keepdims=keepdim)


@lowering(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_dims(x, dim), keepdims=keepdim)


@lowering(aten.max.default)
def max_all(x):
    return jnp.max(x)


@lowering(aten.min.default)
def min_all(x):
    return jnp.min(x)


def _extreme_dim(x, dim, keepdim, arg):
    """max/min along `dim`: the first extreme's index, and the input's value there (as eager's;
    a max reduction's own value can be the other zero: max(-0.0, 0.0, -0.0) over a column whose
    first element is -0.0 is -0.0 in eager)."""
    if x.ndim == 0:  # a 0-d tensor is its own max along dim 0 or -1, at index 0
        return x, jnp.zeros((), jnp.int64)
    d = _dims(x, dim)[0]
    i = arg(x, axis=d, keepdims=True)
    v = jnp.take_along_axis(x, i, axis=d)
    if not keepdim:
        v, i = jnp.squeeze(v, d), jnp.squeeze(i, d)
    return v, i


@lowering(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    return _extreme_dim(x, dim, keepdim, jnp.argmax)


@lowering(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    return _extreme_dim(x, dim, keepdim, jnp.argmin)


@lowering(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    if dim is None:
        return jnp.argmax(x.reshape(-1))
    return jnp.argmax(x, axis=_dims(x, dim)[0] if x.ndim else None, keepdims=keepdim)


@lowering(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    if dim is None:
        return jnp.argmin(x.reshape(-1))
    return jnp.argmin(x, axis=_dims(x, dim)[0] if x.ndim else None, keepdims=keepdim)


@lowering(aten.any.default)
def any_all(x):
    return jnp.any(x)


@lowering(aten.any.dim, aten.any.dims)
def any_(x, dim=None, keepdim=False):
    return jnp.any(x, axis=_dims(x, dim), keepdims=keepdim)


@lowering(aten.all.default)
def all_all(x):
    return jnp.all(x)


@lowering(aten.all.dim, aten.all.dims)
def all_(x, dim=None, keepdim=False):
    return jnp.all(x, axis=_dims(x, dim), keepdims=keepdim)


def _correction(correction, unbiased=True):
    if correction is None:
        return 1 if unbiased else 0
    return correction


# Note [Variance in float64]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# Eager CPU computes var/std/var_mean/std_mean with float64 accumulators in every float dtype
# (Welford, or two passes for a full reduction) and rounds the results through float32. A float32
# two-pass loses the digits of a spread that is small against the mean (1000 + 0.01 * randn: 1.6e-4
# relative error, eager's 3e-8; [3e19, 3e19 +- 1e13]: 13 %), and std of values past 1.8e19 was inf,
# the variance overflowing float32 on its way to the root. On the CPU (eager's own device, where
# float64 is native) the rules do the same; on TPU/GPU they keep float32 (TPUs have no float64).
def _var_acc(x):
    if x.dtype == jnp.float32 and _cpu():  # bf16/fp16 arrive as float32 (Note [Opmath])
        return x.astype(jnp.float64)
    return x


def _var_out(v, x):
    return v.astype(jnp.float32) if x.dtype == jnp.float32 else v


def _cpu() -> bool:
    from ..runtime import default_device

    return default_device().platform == "cpu"


# The correction is static: eager reads it as a double, and a lifted Scalar would be rounded to
# a bf16/fp16 input's dtype (1.3 -> 1.296875).
@lowering(aten.var.correction, static=("correction",))
def var(x, dim=None, correction=None, keepdim=False):
    v = jnp.var(_var_acc(x), axis=_dims(x, dim), ddof=_correction(correction), keepdims=keepdim)
    return _var_out(v, x)


@lowering(aten.std.correction, static=("correction",))
def std(x, dim=None, correction=None, keepdim=False):
    v = jnp.std(_var_acc(x), axis=_dims(x, dim), ddof=_correction(correction), keepdims=keepdim)
    return _var_out(v, x)


@lowering(aten.var_mean.correction, static=("correction",))
def var_mean(x, dim=None, correction=None, keepdim=False):
    d, xa = _dims(x, dim), _var_acc(x)
    return (
        _var_out(jnp.var(xa, axis=d, ddof=_correction(correction), keepdims=keepdim), x),
        _var_out(jnp.mean(xa, axis=d, keepdims=keepdim), x),
    )


@lowering(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    import jax.scipy.special as jss

    return jss.logsumexp(x, axis=_dims(x, dim), keepdims=keepdim)


@lowering(aten.linalg_vector_norm.default, static=("ord",))
def vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    x = _acc(x, dtype) if dtype is not None else x
    d = _dims(x, dim)
    ax = jnp.abs(x)
    if ord == 2:
        return jnp.sqrt(jnp.sum(ax * ax, axis=d, keepdims=keepdim))
    if ord == float("inf"):
        return jnp.max(ax, axis=d, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(ax, axis=d, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((x != 0).astype(x.dtype), axis=d, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(ax, axis=d, keepdims=keepdim)
    return jnp.sum(ax**ord, axis=d, keepdims=keepdim) ** (1.0 / ord)


def _scan_acc(x, dtype):
    """A scan's accumulator, as eager CPU's (`acc_type<scalar_t, /*is_cuda=*/false>`): float32
    for bf16/fp16, float64 for float32 on the CPU (a float32 cumprod of 1e5 factors drifted 6000
    ulps, eager's 74). The rule is registered without opmath to see bf16/fp16 as they are."""
    if dtype is not None and jnp_dtype(dtype) != x.dtype:
        x = x.astype(jnp_dtype(dtype))  # eager converts first, then scans in the accumulator
    if x.dtype == jnp.float32 and _cpu():
        return x.astype(jnp.float64)
    if x.dtype in (jnp.bfloat16, jnp.float16):
        return x.astype(jnp.float32)
    return _acc(x, None)


@lowering(aten.cumsum.default, opmath=False)
def cumsum(x, dim, dtype=None):
    if x.ndim == 0:  # jnp flattens a 0-d input to shape (1,)
        return _scan_acc(x, dtype)
    return jnp.cumsum(_scan_acc(x, dtype), axis=_dims(x, dim)[0])


@lowering(aten.cumprod.default, opmath=False)
def cumprod(x, dim, dtype=None):
    if x.ndim == 0:
        return _scan_acc(x, dtype)
    return jnp.cumprod(_scan_acc(x, dtype), axis=_dims(x, dim)[0])


@lowering(aten.sort.default)
def sort(x, dim=-1, descending=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = _dims(x, dim)[0]
    idx = jnp.argsort(x, axis=d, stable=True, descending=descending)
    return jnp.take_along_axis(x, idx, axis=d), idx


@lowering(aten.sort.stable)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    return sort(x, dim, descending)


@lowering(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = _dims(x, dim)[0]
    xm = jnp.moveaxis(x, d, -1)
    # Every NaN is larger than any number, as in eager. XLA's top_k orders floats totally, so a
    # NaN with its sign bit set (x86's 0/0, torch's bf16 NaN) ranked below -inf and -0.0 below
    # 0.0: top_k reads NaNs made positive and zeros made +0.0, and the values are gathered from
    # the input. The smallest k were the top k of -x (NaN first; unsigned ints wrapped): they
    # are a stable sort's first k.
    if largest:
        key = xm
        if jnp.issubdtype(xm.dtype, jnp.floating):  # (and -0.0 ties with 0.0, as in eager)
            key = jnp.where(jnp.isnan(xm), jnp.nan, jnp.where(xm == 0, 0.0, xm).astype(xm.dtype))
        _, i = lax.top_k(key, k)
    else:
        i = jnp.argsort(xm, axis=-1, stable=True)[..., :k]
    v = jnp.take_along_axis(xm, i, axis=-1)
    return jnp.moveaxis(v, -1, d), jnp.moveaxis(i, -1, d)


@lowering(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, dtype=None):
    return jnp.nansum(_acc(x, dtype), axis=_dims(x, dim), keepdims=keepdim)


@lowering(aten.std_mean.correction, static=("correction",))  # as var's (reduction.py)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    d, xa = _dims(x, dim), _var_acc(x)  # Note [Variance in float64]
    c = 1 if correction is None else correction
    return (
        _var_out(jnp.std(xa, axis=d, ddof=c, keepdims=keepdim), x),
        _var_out(jnp.mean(xa, axis=d, keepdims=keepdim), x),
    )


@lowering(aten.aminmax.default)
def aminmax(x, *, dim=None, keepdim=False):
    if dim is None:
        if keepdim:
            shape = (1,) * x.ndim
            return jnp.min(x).reshape(shape), jnp.max(x).reshape(shape)
        return jnp.min(x), jnp.max(x)
    if x.ndim == 0:
        return x, x
    # (the values at the first extremes, as min.dim's and max.dim's)
    low, _ = _extreme_dim(x, dim, keepdim, jnp.argmin)
    high, _ = _extreme_dim(x, dim, keepdim, jnp.argmax)
    return low, high


@lowering(aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim):
    return jnp.sum(x != 0, axis=_dims(x, dim), dtype=jnp.int64)


@lowering(aten.count_nonzero.default)
def count_nonzero_opt(x, dim=None):
    axis = None if dim is None or x.ndim == 0 else axis_of(x, dim)
    return jnp.sum(x != 0, axis=axis, dtype=jnp.int64)


@lowering(aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype, static=("p",))
def norm_dim(x, p=2, dim=(), keepdim=False, *, dtype=None):
    return vector_norm(
        _acc(x, dtype) if dtype is not None else x, 2 if p is None else p, dim, keepdim
    )


@lowering(aten.norm.Scalar, aten.norm.ScalarOpt_dtype, static=("p",))
def norm_all(x, p=2, *, dtype=None):
    return vector_norm(_acc(x, dtype) if dtype is not None else x, 2 if p is None else p)
