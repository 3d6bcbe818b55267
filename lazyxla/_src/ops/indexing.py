"""Gather/scatter-style indexing: index, index_put, gather, scatter, index_select, masking."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import torch

from ..meta import META_RULES, _dtype_name
from .elementwise import _true_divide
from .registry import is_const, lowering, to_opmath

aten = torch.ops.aten


def _accumulate(x, idx, v):
    """x.at[idx].add(v); on bool, `or` (eager's bool sum)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.int8).at[idx].max(jnp.asarray(v).astype(jnp.int8)) != 0
    return x.at[idx].add(v)


def _d(dim, n):
    return dim + n if dim < 0 else dim


# Note [Scatter accumulation]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# This family's rules are not opmath (Note [Opmath]): what eager CPU does with bf16/fp16
# contributions to one element depends on the op, measured bit for bit:
# - scatter_add, scatter_reduce (sum, prod, mean) and scatter_(reduce=) accumulate in float32
#   and round once. A mean divides the rounded sum by a count accumulated in float32 and
#   rounded to the dtype. The rules compute in float32 (`_scatter_opmath`).
# - index_add takes scatter_add's path (float32) only for a tensor of 2+ dims, along its first
#   or last dim, with alpha == 1 and no broadcast source; otherwise it adds each contribution in
#   the dtype, in index order, as index_put(accumulate=True), put(accumulate=True) and
#   index_reduce do: XLA's scatter applies updates in index order, so those keep the dtype.
# - index_reduce's mean counts with index_add on a tensor of the dtype (so a bf16 count past 256
#   rounds, by that same rule), then divides in float32.
# Before, every one of them accumulated in the dtype: a bf16 scatter_add of 1000 values a row was
# 60 ulps from eager's, and a mean's bf16 count stopped at 256 (256 + 1 rounds to 256).
_LOW = (jnp.bfloat16, jnp.float16)


def _scatter_opmath(fn):
    """Run a scatter rule on bf16/fp16 `x`/`src` in float32 (Note [Scatter accumulation]); the
    interpreter rounds the result to the recorded dtype once."""

    @functools.wraps(fn)
    def wrapped(x, dim, index, src, *args, **kwargs):
        return fn(to_opmath(x), dim, index, to_opmath(src), *args, **kwargs)

    return wrapped


def _index_tuple(x, indices):
    idx = []
    for i in indices:
        if i is None:
            idx.append(slice(None))
        elif i.dtype == jnp.bool_:
            raise NotImplementedError("boolean mask indexing has a data-dependent shape")
        else:
            idx.append(i)
    return tuple(idx)


@lowering(aten.index.Tensor)
def index(x, indices):
    return x[_index_tuple(x, indices)]


def _mask_put(x, indices, values, accumulate):
    """`x[mask] = values` with one boolean mask: a `where`, no dynamic shape."""
    pos = [k for k, i in enumerate(indices) if i is not None]
    if len(pos) != 1 or any(i is not None for i in indices[pos[0] + 1 :]):
        raise NotImplementedError("boolean mask index_put mixed with other indices")
    p, mask = pos[0], indices[pos[0]]
    trail = x.shape[p + mask.ndim :]
    # values broadcast against (x.shape[:p], N, *trail): N is 1 (one value for every selected
    # element) or the number of elements selected.
    target_rank = p + 1 + len(trail)
    v = values.reshape((1,) * (target_rank - values.ndim) + values.shape)
    m = mask.reshape((1,) * p + mask.shape + (1,) * len(trail))
    n = v.shape[p]
    if n == 0:
        return x
    if n != 1:
        # One value per selected element (the backward of x[mask]): the k-th true position of
        # the mask takes value k. N, the number selected, is static (values' shape).
        k = jnp.clip(jnp.cumsum(mask.reshape(-1).astype(jnp.int32)) - 1, 0, n - 1)
        v = jnp.take(jnp.broadcast_to(v, x.shape[:p] + (n,) + trail), k, axis=p).reshape(x.shape)
    else:
        v = v.reshape(v.shape[:p] + (1,) * mask.ndim + v.shape[p + 1 :])
    v = jnp.broadcast_to(v, x.shape).astype(x.dtype)
    return jnp.where(m, x + v, x) if accumulate else jnp.where(m, v, x)


@lowering(aten.index_put.default)
def index_put(x, indices, values, accumulate=False):
    if any(i is not None and i.dtype == jnp.bool_ for i in indices):
        return _mask_put(x, indices, values, accumulate)
    idx = _index_tuple(x, indices)
    values = values.astype(x.dtype)
    return _accumulate(x, idx, values) if accumulate else x.at[idx].set(values)


@lowering(aten._index_put_impl.default)
def index_put_impl(x, indices, values, accumulate=False, unsafe=False):
    return index_put(x, indices, values, accumulate)


@lowering(aten._unsafe_index.Tensor)
def unsafe_index(x, indices):
    return x[_index_tuple(x, indices)]


@lowering(aten._unsafe_index_put.default)
def unsafe_index_put(x, indices, values, accumulate=False):
    return index_put(x, indices, values, accumulate)


@lowering(aten.index_select.default)
def index_select(x, dim, index):
    if x.ndim == 0:
        return x
    # (a 0-d index selects as a 1-element one: the dim is kept, of size 1)
    return jnp.take(x, index.reshape(-1), axis=_d(dim, x.ndim))


@lowering(aten.gather.default)
def gather(x, dim, index, sparse_grad=False):
    if x.ndim == 0:
        return x.reshape(index.shape)
    if index.ndim == 0:  # (of a 1-d x: one element, read as a 0-d result)
        return gather(x, dim, index.reshape(1)).reshape(())
    d = _d(dim, x.ndim)
    # PyTorch allows index.size(i) <= x.size(i) for i != dim: only that corner is read.
    x = x[tuple(slice(None) if i == d else slice(0, s) for i, s in enumerate(index.shape))]
    return jnp.take_along_axis(x, index, axis=d)


def _scalar_as_1d(fn):
    """Run a scatter lowering on a 0-d self as on shape (1,) (PyTorch treats a 0-d self, index
    and src as 1-element vectors along dim 0 or -1)."""

    @functools.wraps(fn)
    def wrapped(x, dim, index, src, *args, **kwargs):
        if index.size == 0:  # nothing scattered
            return x
        if x.ndim:
            return fn(x, dim, index, src, *args, **kwargs)
        src = src if isinstance(src, (bool, int, float)) else src.reshape(-1)
        return fn(x.reshape(1), 0, index.reshape(-1), src, *args, **kwargs).reshape(())

    return wrapped


def _bool_via_int(fn):
    """Run a scatter reduction on bool tensors in int32: sum/add then is `or`, prod/multiply
    `and`, amax/amin `or`/`and` (as eager computes them), read back as != 0."""

    @functools.wraps(fn)
    def wrapped(x, dim, index, src, *args, **kwargs):
        if x.dtype != jnp.bool_:
            return fn(x, dim, index, src, *args, **kwargs)
        src = src if isinstance(src, (bool, int, float)) else src.astype(jnp.int32)
        return fn(x.astype(jnp.int32), dim, index, src, *args, **kwargs) != 0

    return wrapped


def _scatter_idx(x, dim, index):
    dim = _d(dim, x.ndim)
    grids = jnp.meshgrid(*[jnp.arange(s) for s in index.shape], indexing="ij")
    grids[dim] = index
    return tuple(grids)


@lowering(aten.scatter.src, aten.scatter.value)
@_scalar_as_1d
def scatter(x, dim, index, src):
    src = (
        jnp.broadcast_to(jnp.asarray(src, x.dtype), index.shape)
        if jnp.ndim(src) == 0
        else src[tuple(slice(0, s) for s in index.shape)]
    )
    return x.at[_scatter_idx(x, dim, index)].set(src.astype(x.dtype))


@lowering(aten.scatter.reduce, aten.scatter.value_reduce)
@_scatter_opmath
@_scalar_as_1d
@_bool_via_int
def scatter_reduce_(x, dim, index, src, reduce):
    src = (
        jnp.broadcast_to(jnp.asarray(src, x.dtype), index.shape)
        if jnp.ndim(src) == 0
        else src[tuple(slice(0, s) for s in index.shape)].astype(x.dtype)
    )
    ref = x.at[_scatter_idx(x, dim, index)]
    return ref.add(src) if reduce == "add" else ref.multiply(src)


@lowering(aten.scatter_add.default)
@_scatter_opmath
@_scalar_as_1d
@_bool_via_int
def scatter_add(x, dim, index, src):
    src = src[tuple(slice(0, s) for s in index.shape)]
    return x.at[_scatter_idx(x, dim, index)].add(src.astype(x.dtype))


@lowering(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    if x.dtype in _LOW and reduce == "mean":  # Note [Scatter accumulation]
        total = _scatter_reduce(to_opmath(x), dim, index, to_opmath(src), "sum", include_self)
        count = _scatter_reduce(
            jnp.ones(x.shape, jnp.float32) if include_self else jnp.zeros(x.shape, jnp.float32),
            dim,
            index,
            jnp.ones(index.shape, jnp.float32),
            "sum",
            True,
        )
        total, count = total.astype(x.dtype), count.astype(x.dtype)  # eager's two tensors
        return to_opmath(total) / jnp.maximum(to_opmath(count), 1)
    if x.dtype in _LOW:
        return _scatter_reduce(to_opmath(x), dim, index, to_opmath(src), reduce, include_self)
    return _scatter_reduce(x, dim, index, src, reduce, include_self)


@_scalar_as_1d
@_bool_via_int
def _scatter_reduce(x, dim, index, src, reduce, include_self=True):
    src = src[tuple(slice(0, s) for s in index.shape)].astype(x.dtype)
    idx = _scatter_idx(x, dim, index)
    if reduce == "sum":
        return (x if include_self else x.at[idx].set(0)).at[idx].add(src)
    if reduce == "prod":
        return (x if include_self else x.at[idx].set(1)).at[idx].multiply(src)
    if reduce == "amax":
        base = (
            x
            if include_self
            else x.at[idx].set(
                jnp.finfo(x.dtype).min
                if jnp.issubdtype(x.dtype, jnp.floating)
                else jnp.iinfo(x.dtype).min
            )
        )
        return base.at[idx].max(src)
    if reduce == "amin":
        base = (
            x
            if include_self
            else x.at[idx].set(
                jnp.finfo(x.dtype).max
                if jnp.issubdtype(x.dtype, jnp.floating)
                else jnp.iinfo(x.dtype).max
            )
        )
        return base.at[idx].min(src)
    if reduce == "mean":
        ones = jnp.ones_like(src)
        cnt = jnp.zeros_like(x).at[idx].add(ones)
        base = x if include_self else x.at[idx].set(0)
        s = base.at[idx].add(src)
        cnt = cnt + (1 if include_self else 0)
        out = s / jnp.maximum(cnt, 1)
        return (
            out
            if jnp.issubdtype(x.dtype, jnp.floating)
            else jnp.floor_divide(s, jnp.maximum(cnt, 1))
        )
    raise NotImplementedError(f"scatter_reduce with reduce={reduce!r}")


@lowering(aten.index_add.default)
def index_add(x, dim, index, source, alpha=1):
    if x.ndim == 0:
        return x + (jnp.sum(source) * alpha).astype(x.dtype)
    d = _d(dim, x.ndim)
    idx = [slice(None)] * x.ndim
    idx[d] = index.reshape(-1)  # (a 0-d index adds as a 1-element one)
    src = source.reshape(x.shape[:0] + source.shape) if source.ndim else source
    rest = x.shape[:d] + x.shape[d + 1 :]
    if (
        x.dtype in _LOW
        and x.ndim > 1
        and d in (0, x.ndim - 1)
        and is_const(alpha, 1)
        and src.shape[:d] + src.shape[d + 1 :] == rest
    ):  # eager's scatter_add path: float32 (Note [Scatter accumulation])
        return _accumulate(to_opmath(x), tuple(idx), to_opmath(src))
    return _accumulate(x, tuple(idx), src if is_const(alpha, 1) else (src * alpha).astype(x.dtype))


@lowering(aten.index_copy.default)
def index_copy(x, dim, index, source):
    if x.ndim == 0:
        return source.reshape(()).astype(x.dtype)
    dim = _d(dim, x.ndim)
    idx = [slice(None)] * x.ndim
    idx[dim] = index.reshape(-1)  # (a 0-d index copies as a 1-element one)
    return x.at[tuple(idx)].set(source.astype(x.dtype))


@lowering(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(x, dim, index, value):
    dim = _d(dim, x.ndim) if x.ndim else 0
    if x.ndim == 0:
        return jnp.asarray(value, x.dtype)
    idx = [slice(None)] * x.ndim
    idx[dim] = index
    return x.at[tuple(idx)].set(jnp.asarray(value, x.dtype))


@lowering(aten.index_reduce.default)
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    if x.ndim == 0:
        x, source, dim = x.reshape(1), source.reshape(1), 0
        return index_reduce(x, dim, index.reshape(1), source, reduce, include_self=include_self)[0]
    d = _d(dim, x.ndim)
    index = index.reshape(-1)  # (a 0-d index reduces as a 1-element one)
    xm, sm = jnp.moveaxis(x, d, 0), jnp.moveaxis(source.astype(x.dtype), d, 0)
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    if reduce in ("prod", "mean"):
        init = 1 if reduce == "prod" else 0
    elif reduce == "amax":
        init = -jnp.inf if floating else jnp.iinfo(x.dtype).min
    else:
        init = jnp.inf if floating else jnp.iinfo(x.dtype).max
    base = xm if include_self else xm.at[index].set(jnp.asarray(init, x.dtype))
    ref = base.at[index]
    if reduce == "prod":
        out = ref.multiply(sm)
    elif reduce == "amax":
        out = ref.max(sm)
    elif reduce == "amin":
        out = ref.min(sm)
    else:
        s = ref.add(sm)
        # eager's count: index_add of ones into ones (or zeros) of x's dtype and shape (Note
        # [Scatter accumulation]); every slice of a row holds the same count
        ones = jnp.ones(x.shape, x.dtype)
        cnt = index_add(
            ones if include_self else jnp.zeros_like(ones),
            dim,
            index,
            jnp.ones(source.shape, x.dtype),
        )
        cnt = jnp.moveaxis(cnt.astype(x.dtype), d, 0)
        cnt = jnp.where(cnt == 0, jnp.ones((), x.dtype), cnt)
        # the count broadcasts: a plain `/` would be XLA's reciprocal multiply, rounding twice
        # (Note [Broadcast divisors]); bf16/fp16 divide in float32 as eager's opmath does
        out = _true_divide(to_opmath(s), to_opmath(cnt)) if floating else jnp.floor_divide(s, cnt)
    return jnp.moveaxis(out, 0, d)


@lowering(aten.put.default)
def put(x, index, source, accumulate=False):
    flat = x.reshape(-1)
    i = jnp.where(index < 0, index + flat.shape[0], index).reshape(-1)
    src = source.reshape(-1).astype(x.dtype)
    out = _accumulate(flat, i, src) if accumulate else flat.at[i].set(src)
    return out.reshape(x.shape)


@lowering(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    xb, mb = jnp.broadcast_to(x, shape).reshape(-1), jnp.broadcast_to(mask, shape).reshape(-1)
    # the k-th masked position takes source.flatten()[k]
    pos = jnp.cumsum(mb.astype(jnp.int64)) - 1
    src = source.reshape(-1).astype(x.dtype)
    taken = src[jnp.clip(pos, 0, max(src.shape[0] - 1, 0))] if src.shape[0] else xb
    return jnp.where(mb, taken, xb).reshape(shape)


@lowering(aten._efficientzerotensor.default)
def efficientzerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    from ..runtime import jnp_dtype

    return jnp.zeros(size, jnp_dtype(dtype) if dtype is not None else jnp.float32)


@lowering(aten.take.default)
def take(x, index):
    flat = x.reshape(-1)
    i = jnp.where(index < 0, index + flat.shape[0], index)
    return flat[i]


def _checked_meta(op, check) -> None:
    """`op`'s meta rule runs `check(*args)` (which raises eager's error) first; checks added to
    one op compose, whatever their order."""
    inner = META_RULES.get(op, op)

    def meta(*args, **kwargs):
        check(*args)
        return inner(*args, **kwargs)

    META_RULES[op] = meta


# Eager's CPU kernels refuse a source of another dtype than `self` (their meta kernels do not
# check, so a lazy call computed with a cast where eager raises), with eager's messages.
def _same_dtype_meta(op, source_at: int, message) -> None:
    def check(x, *args):
        source = args[source_at - 1]
        if source.dtype != x.dtype:
            raise RuntimeError(message(_dtype_name(x.dtype), _dtype_name(source.dtype)))

    _checked_meta(op, check)


_same_dtype_meta(
    aten.index_add.default,
    3,
    lambda s, src: f"index_add_(): self ({s}) and source ({src}) must have the same scalar type",
)
_same_dtype_meta(
    aten.index_copy.default,
    3,
    lambda s, src: (
        "index_copy_(): self and source expected to have the same dtype, but got "
        f"(self) {s} and (source) {src}"
    ),
)
_same_dtype_meta(
    aten.put.default,
    2,
    lambda s, src: (
        "put_(): self and source expected to have the same dtype, but got "
        f"self.dtype = {s} and source.dtype = {src}"
    ),
)


# Eager's CPU kernels take only an int64 index (target) here; their meta kernels do not check, so
# an int32 one computed on lazyxla where eager raises ("index_copy_(): Expected a long tensor for
# index, but got Int"). Checked, with eager's error, before the op's meta.
def _long_index_meta(op, at: int, error: type[Exception], message: str) -> None:
    def check(*args):
        if args[at].dtype != torch.int64:
            raise error(message.format(_dtype_name(args[at].dtype)))

    _checked_meta(op, check)


for _op in (aten.index_fill.int_Scalar, aten.index_fill.int_Tensor):
    _long_index_meta(_op, 2, IndexError, "index_fill_(): Expected dtype int64 for index.")
_long_index_meta(
    aten.index_copy.default,
    2,
    RuntimeError,
    "index_copy_(): Expected a long tensor for index, but got {}",
)
# (take's meta kernel checks, but names the dtype "torch.int32" where eager says "Int")
_long_index_meta(
    aten.take.default, 1, RuntimeError, "take(): Expected a long tensor for index, but got {}"
)
for _op in (aten.multi_margin_loss.default, aten.multilabel_margin_loss_forward.default):
    _long_index_meta(_op, 1, RuntimeError, "expected scalar type Long but found {}")
