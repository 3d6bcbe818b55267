"""Order statistics, scans and searches: cumulative max/min/logsumexp, kth value, median, mode,
bucketize/searchsorted, isin and histograms (eager's tie and NaN rules)."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from . import creation
from .registry import axis_of, lowering
from .special_functions import _complex_logaddexp

aten = torch.ops.aten


def _cum_extreme(x, dim, better):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = axis_of(x, dim)
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

    # The values are the input at the indices, as eager's are: the scan's own values can lose a
    # zero's sign (XLA rewrites select(a >= b, a, b) into a max, so cummax([0., -0.]) kept 0.).
    _, ind = lax.associative_scan(comb, (x, idx), axis=d)
    return jnp.take_along_axis(x, ind, axis=d), ind


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
    if jnp.iscomplexobj(x):
        return _complex_logcumsumexp(x, axis_of(x, dim))
    return lax.cumlogsumexp(x, axis=axis_of(x, dim))


def _complex_logcumsumexp(x, d):
    """Eager's sequential recurrence acc = logaddexp(x_i, acc) from -inf: a complex log is
    defined up to 2*pi*i, and eager's imaginary parts are the sums its order makes (x_0's own
    for the first element, unwrapped); a parallel scan's combination order picks other branches."""
    xs = jnp.moveaxis(x, d, 0)
    init = jnp.full(xs.shape[1:], complex(-jnp.inf, 0), x.dtype)

    def step(acc, xi):
        acc = _complex_logaddexp(xi, acc)
        return acc, acc

    return jnp.moveaxis(lax.scan(step, init, xs)[1], 0, d)


def _sorted_along(x, d):
    """Values sorted ascending with NaN last, and the stable sort indices."""
    idx = jnp.argsort(x, axis=d, stable=True)
    return jnp.take_along_axis(x, idx, axis=d), idx


@lowering(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = axis_of(x, dim)
    v, i = _sorted_along(x, d)
    v = lax.index_in_dim(v, k - 1, d, keepdims=keepdim)
    i = lax.index_in_dim(i, k - 1, d, keepdims=keepdim)
    return v, i


def _median_dim(x, dim, keepdim, ignore_nan):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = axis_of(x, dim)
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


# Note [Mode of a row with NaN]
# Eager's CPU kernel sorts each row with `std::sort` and `<`, then takes the first longest run of
# equal neighbours (`!=` ends a run), its last element's index. A NaN compares false both ways: it
# is a run of its own, and since `<` is then no ordering the sort's result depends on where the
# NaNs sit. Rows of up to 16 elements are insertion-sorted, which leaves a first-element NaN in
# front and otherwise brings the smallest number there, so: a row whose counts all are 1 gives
# (NaN, 0) when it starts with a NaN, else its smallest number; a row whose most frequent value
# repeats gives that value (a NaN, a run of one, never wins), as eager does while no NaN stands
# between its copies. There eager splits the run (`[1, nan, 1]` gives index 0, lazyxla 2), as it
# does for any row past 16 elements, whose introsort places NaNs elsewhere: those indices (never
# the values of rows without NaN) can differ from eager's.
@lowering(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    if x.dtype == jnp.bool_:
        v, i = mode(x.astype(jnp.int8), dim, keepdim)
        return v.astype(jnp.bool_), i
    d = axis_of(x, dim)
    xm = jnp.moveaxis(x, d, -1)
    # count of each element's value along the row; the most frequent, smallest value wins; its
    # index is the last occurrence (as PyTorch's CPU kernel returns).
    eq = xm[..., :, None] == xm[..., None, :]
    cnt = jnp.sum(eq, axis=-1)
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    if floating:  # See Note [Mode of a row with NaN]
        nan = jnp.isnan(xm)
        cnt = jnp.where(nan, 1, cnt)
    best = jnp.max(cnt, axis=-1, keepdims=True)
    cand = jnp.where(
        (cnt == best) & ~nan if floating else cnt == best,
        xm,
        jnp.inf if floating else jnp.iinfo(x.dtype).max,
    )
    val = jnp.min(cand, axis=-1, keepdims=True)
    n = xm.shape[-1]
    pos = jnp.where(xm == val, jnp.arange(n), -1)
    ind = jnp.max(pos, axis=-1, keepdims=True)
    if floating:  # a leading NaN that ties for the most frequent: (NaN, 0)
        ind = jnp.where(nan[..., :1] & (best == 1), 0, ind)
    val = jnp.take_along_axis(xm, ind, axis=-1)  # the value there: 0.0 or -0.0, as eager's
    val, ind = jnp.moveaxis(val, -1, d), jnp.moveaxis(ind, -1, d)
    if not keepdim:
        val, ind = jnp.squeeze(val, d), jnp.squeeze(ind, d)
    return val, ind


def _bound(seq, x, right):
    """Eager's binary search (cus_lower_bound / cus_upper_bound in Bucketization.cpp) for each
    value of `x` in the last axis of `seq`: the same comparisons, so a NaN value lands past the
    end and NaNs at the end of `seq` are passed over, as in eager (jnp.searchsorted's compares
    differently: NaN values landed before the NaNs of `seq`). `seq` is (B, n), `x` (B, m)."""
    n = seq.shape[-1]
    lo = jnp.zeros(x.shape, jnp.int64)
    hi = jnp.full(x.shape, n, jnp.int64)
    for _ in range(n.bit_length()):
        mid = lo + (hi - lo) // 2
        mv = jnp.take_along_axis(seq, jnp.clip(mid, 0, max(n - 1, 0)), axis=-1)
        go = ~(mv > x) if right else ~(mv >= x)
        active = lo < hi
        lo = jnp.where(active & go, mid + 1, lo)
        hi = jnp.where(active & ~go, mid, hi)
    return lo


def _searchsorted(seq, x, right):
    seq, x = jnp.asarray(seq), jnp.asarray(x)
    dt = jnp.promote_types(seq.dtype, x.dtype)
    seq, x = seq.astype(dt), x.astype(dt)
    if seq.shape[-1] == 0:
        return jnp.zeros(x.shape, jnp.int64)
    if seq.ndim == 1:
        return _bound(seq[None], x.reshape(1, -1), right).reshape(x.shape)
    s2 = seq.reshape(-1, seq.shape[-1])
    return _bound(s2, x.reshape(s2.shape[0], -1), right).reshape(x.shape)


@lowering(aten.bucketize.Tensor)
def bucketize(x, boundaries, *, out_int32=False, right=False):
    return _searchsorted(boundaries, x, right)


@lowering(aten.bucketize.Scalar)
def bucketize_scalar(x, boundaries, *, out_int32=False, right=False):
    return _searchsorted(boundaries, x, right)


@lowering(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(seq, x, *, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    return _searchsorted(seq, x, right or side == "right")


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
