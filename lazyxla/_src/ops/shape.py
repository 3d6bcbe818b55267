"""Views, reshapes and layout ops.

View ops are recorded as views (see Note [Views and mutation] in tensor.py): each has a forward rule
here and, in `SCATTERS`, the rule that writes a new view value back into its parent.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .registry import lowering

aten = torch.ops.aten

VIEWS: set[Any] = set()
SCATTERS: dict[Any, Any] = {}


def view_op(*ops: Any, scatter: Any = None):
    def deco(rule):
        lowering(*ops)(rule)
        for op in ops:
            VIEWS.add(op)
            if scatter is not None:
                SCATTERS[op] = scatter
        return rule

    return deco


def _norm_dim(d: int, n: int) -> int:
    return d + n if d < 0 else d


def _infer_shape(shape: tuple[int, ...], numel: int) -> tuple[int, ...]:
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        return tuple(numel // known if s == -1 else s for s in shape)
    return tuple(shape)


def _reshape_back(parent, new, *_):
    return new.reshape(parent.shape)


@view_op(aten.view.default, aten._reshape_alias.default, scatter=_reshape_back)
def view(x, size, *_):
    return x.reshape(_infer_shape(tuple(size), x.size))


@lowering(aten._unsafe_view.default)
def _unsafe_view(x, size):
    return x.reshape(_infer_shape(tuple(size), x.size))


@view_op(aten.alias.default, scatter=lambda parent, new: new)
def alias(x):
    return x


@view_op(aten.unsqueeze.default, scatter=_reshape_back)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, _norm_dim(dim, x.ndim + 1))


@view_op(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, scatter=_reshape_back)
def squeeze(x, dim=None):
    if dim is None:
        return jnp.squeeze(x)
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    dims = tuple(
        d for d in (_norm_dim(d, max(x.ndim, 1)) for d in dims) if x.ndim and x.shape[d] == 1
    )
    return jnp.squeeze(x, dims) if dims else x


def _permute_back(parent, new, dims):
    return jnp.transpose(new, np.argsort([_norm_dim(d, parent.ndim) for d in dims]))


@view_op(aten.permute.default, scatter=_permute_back)
def permute(x, dims):
    return jnp.transpose(x, [_norm_dim(d, x.ndim) for d in dims])


def _transpose(x, d0, d1):
    if x.ndim < 2:
        return x
    return jnp.swapaxes(x, _norm_dim(d0, x.ndim), _norm_dim(d1, x.ndim))


@view_op(aten.transpose.int, scatter=lambda parent, new, d0, d1: _transpose(new, d0, d1))
def transpose(x, d0, d1):
    return _transpose(x, d0, d1)


@view_op(aten.t.default, scatter=lambda parent, new: new.T)
def t(x):
    return x.T


def _expand_scatter(parent, new, size, implicit=False):
    """Write an expanded view back: each parent element takes the value of the last of its
    aliases that the write changed (only stores reach here: Note [Overlapping writes])."""
    lead = new.ndim - parent.ndim
    bdims = [
        d
        for d in range(new.ndim)
        if d < lead or (parent.shape[d - lead] == 1 and new.shape[d] != 1)
    ]
    if not bdims:
        return new.reshape(parent.shape)
    keep = [d for d in range(new.ndim) if d not in bdims]
    perm = keep + bdims
    flat_shape = tuple(new.shape[d] for d in keep) + (-1,)
    nn = jnp.transpose(new, perm).reshape(flat_shape)
    old = jnp.transpose(jnp.broadcast_to(parent, new.shape), perm).reshape(flat_shape)
    changed = (nn != old)[..., ::-1]
    last = nn.shape[-1] - 1 - jnp.argmax(changed, axis=-1)
    return jnp.take_along_axis(nn, last[..., None], -1).reshape(parent.shape)


@view_op(aten.expand.default, scatter=_expand_scatter)
def expand(x, size, implicit=False):
    lead = len(size) - x.ndim
    size = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, size)


def _select_scatter(parent, new, dim, index):
    dim = _norm_dim(dim, parent.ndim)
    index = index + parent.shape[dim] if index < 0 else index
    return lax.dynamic_update_index_in_dim(parent, new.astype(parent.dtype), index, dim)


@view_op(aten.select.int, scatter=_select_scatter)
def select(x, dim, index):
    dim = _norm_dim(dim, x.ndim)
    return lax.index_in_dim(x, index + x.shape[dim] if index < 0 else index, dim, keepdims=False)


def _slice_bounds(n: int, start: int | None, end: int | None) -> tuple[int, int]:
    start = 0 if start is None else start
    end = n if end is None else end
    start = max(0, start + n if start < 0 else start)
    end = max(0, end + n if end < 0 else end)
    end = min(end, n)
    start = min(start, n)
    return start, max(start, end)


def _slice_scatter(parent, new, dim=0, start=None, end=None, step=1):
    dim = _norm_dim(dim, parent.ndim)
    s, e = _slice_bounds(parent.shape[dim], start, end)
    idx = [slice(None)] * parent.ndim
    idx[dim] = slice(s, e, step)
    return parent.at[tuple(idx)].set(new.astype(parent.dtype))


@view_op(aten.slice.Tensor, scatter=_slice_scatter)
def slice_(x, dim=0, start=None, end=None, step=1):
    dim = _norm_dim(dim, x.ndim)
    s, e = _slice_bounds(x.shape[dim], start, end)
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(s, e, step)
    return x[tuple(idx)]


def _diag_index(shape, offset, d1, d2):
    n = len(shape)
    d1, d2 = _norm_dim(d1, n), _norm_dim(d2, n)
    rows = np.arange(shape[d1])
    cols = rows + offset
    keep = (cols >= 0) & (cols < shape[d2])
    return d1, d2, rows[keep], cols[keep]


def _diagonal_scatter(parent, new, offset=0, dim1=0, dim2=1):
    d1, d2, r, c = _diag_index(parent.shape, offset, dim1, dim2)
    moved = jnp.moveaxis(parent, (d1, d2), (-2, -1))
    moved = moved.at[..., r, c].set(new.astype(parent.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@view_op(aten.diagonal.default, scatter=_diagonal_scatter)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, _norm_dim(dim1, x.ndim), _norm_dim(dim2, x.ndim))


def _strided_index(size, stride, offset):
    idx = np.full(tuple(size), offset or 0, dtype=np.int64)
    for d, (n, st) in enumerate(zip(size, stride)):
        r = np.arange(n) * st
        idx = idx + r.reshape([-1 if i == d else 1 for i in range(len(size))])
    return idx


def _memory_order(shape, stride):
    """The permutation that lays a dense tensor out in its storage order (outermost first)."""
    return sorted(range(len(shape)), key=lambda d: -stride[d])


def _storage_flat(root, root_stride, dtype):
    """The root's elements in storage order, read as `dtype` (a view(dtype) reads the bits)."""
    if root_stride is not None:
        root = jnp.transpose(root, _memory_order(root.shape, root_stride))
    return _bitcast(root.reshape(-1), _jnp_dtype(dtype))


def _from_storage_flat(flat, root, root_stride):
    flat = _bitcast(flat, root.dtype)
    if root_stride is None:
        return flat.reshape(root.shape)
    order = _memory_order(root.shape, root_stride)
    return jnp.transpose(flat.reshape([root.shape[d] for d in order]), np.argsort(order))


def _set_changed(flat, idx, new):
    """1-D `flat` with `new` stored at `idx`. Where `idx` repeats (an overlapping view), only the
    elements the write changed are stored, so a fill or a masked fill gives eager's result
    (Note [Overlapping writes] in writes.py)."""
    new = new.reshape(-1).astype(flat.dtype)
    if np.unique(idx).size == idx.size:
        return flat.at[idx].set(new)
    changed = _bits_differ(new, flat[idx])
    return flat.at[jnp.where(changed, idx, flat.shape[0])].set(new, mode="drop")


def _bits_differ(a, b):
    """Elementwise: a store of `a` over `b` changes the bits (-0.0 over 0.0 does; NaN over the
    same NaN does not), which `!=` does not tell for floats."""
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        return _bits_differ(a.real, b.real) | _bits_differ(a.imag, b.imag)
    if jnp.issubdtype(a.dtype, jnp.floating):
        as_int = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[a.dtype.itemsize]
        return lax.bitcast_convert_type(a, as_int) != lax.bitcast_convert_type(b, as_int)
    return a != b


# Note [Dense strided views]
# A view whose elements, taken in decreasing-stride order, are consecutive in storage (a
# contiguous or permuted-contiguous block: DDP's gradient bucket views, `flat[k:k+n].view(shape)`
# through as_strided, a transposed block) is read as a slice of the storage and written back with
# one dynamic_update_slice. Any other view gathers and scatters through an explicit index array,
# a constant of the view's size in the program: for the 25 M gradients of a ResNet-50 in DDP
# buckets, tracing one step passed 3.5 GB of memory and 90 s before it was stopped
# (tests/compat/test_torchvision_ddp_bucket_views.py).


def _dense_block(size, stride):
    """The dims of a view ordered so that its elements are consecutive in storage, or None."""
    if math.prod(size) == 0:
        return None
    ones = [d for d in range(len(size)) if size[d] == 1]  # their stride is never used
    order = sorted((d for d in range(len(size)) if size[d] != 1), key=lambda d: -stride[d])
    expected = 1
    for d in reversed(order):
        if stride[d] != expected:
            return None
        expected *= size[d]
    return ones + order


def _strided_read(flat, size, stride, offset):
    perm = _dense_block(size, stride)
    if perm is None:
        return flat[_strided_index(size, stride, offset)]
    n = math.prod(size)
    block = lax.slice_in_dim(flat, offset, offset + n).reshape([size[d] for d in perm])
    return jnp.transpose(block, np.argsort(perm))


def _strided_write(flat, new, size, stride, offset):
    perm = _dense_block(size, stride)
    if perm is None:
        return _set_changed(flat, _strided_index(size, stride, offset).reshape(-1), new)
    block = jnp.transpose(new.reshape(size), perm).reshape(-1).astype(flat.dtype)
    return lax.dynamic_update_slice_in_dim(flat, block, offset, axis=0)


def _as_strided_scatter_root(root, new, size, stride, offset, root_stride, dtype):
    flat = _strided_write(_storage_flat(root, root_stride, dtype), new, size, stride, offset or 0)
    return _from_storage_flat(flat, root, root_stride)


# `as_strided` reads the root base's storage (view_kernels.as_strided_kernel gives the rule the
# root's value, strides and the view's dtype); as_strided_scatter and as_strided_copy act on a
# contiguous input.
@view_op(aten.as_strided.default, scatter=_as_strided_scatter_root)
def as_strided(root, size, stride, offset, root_stride, dtype):
    return _strided_read(_storage_flat(root, root_stride, dtype), size, stride, offset or 0)


def _as_strided_scatter(parent, new, size, stride, storage_offset=None):
    flat = _strided_write(parent.reshape(-1), new, size, stride, storage_offset or 0)
    return flat.reshape(parent.shape)


def _unfold_index(n, size, step):
    return np.arange((n - size) // step + 1)[:, None] * step + np.arange(size)[None, :]


def _unfold_scatter(parent, new, dimension, size, step):
    """Write windows back (overlapping windows: only the changed elements, `_set_changed`)."""
    if new.size == 0:
        return parent
    if parent.ndim == 0:
        return new.reshape(())
    d = _norm_dim(dimension, parent.ndim)
    idx = _unfold_index(parent.shape[d], size, step).reshape(-1)
    moved = jnp.moveaxis(parent, d, -1)  # windows index the last axis
    rows = moved.reshape(-1, moved.shape[-1])
    vals = jnp.moveaxis(new, d, -2).reshape(rows.shape[0], -1)  # (..., windows, size) per row
    out = jax.vmap(lambda r, v: _set_changed(r, idx, v))(rows, vals)
    return jnp.moveaxis(out.reshape(moved.shape), -1, d)


@view_op(aten.unfold.default, scatter=_unfold_scatter)
def unfold(x, dimension, size, step):
    d = _norm_dim(dimension, max(x.ndim, 1))
    if x.ndim == 0:
        return x.reshape(1)
    idx = _unfold_index(x.shape[d], size, step)
    out = jnp.take(x, idx.reshape(-1), axis=d)
    out = out.reshape(x.shape[:d] + idx.shape + x.shape[d + 1 :])
    return jnp.moveaxis(out, d + 1, -1)


# --- view(dtype): the same bytes read as another dtype --------------------------------------------

# Note [Bitcasts between widths]
# XLA's algebraic simplifier folds two width-changing bitcast-converts in a row into one, with a
# shape its own verifier rejects: `x.view(torch.int16).view(torch.uint8)` on float32 (two
# narrowings; so are two widenings) failed to compile ("Expected instruction to have shape equal
# to u8[1,4], actual shape is u8[1,2,2]"), even with an op between them whose result is then
# viewed back (the view fuzzer's program: a write through an int16 view, then a uint8 view). So
# a width change is never a bitcast-convert here: each element's bits are split into (or joined
# from) the narrower elements with shifts and masks on unsigned integers of each width, and only
# same-width bitcasts remain, which the simplifier folds correctly. The order is little-endian:
# element k of a split holds bits [8*k*w, 8*(k+1)*w) of a w-byte element, as in the CPU's memory
# and as bitcast_convert_type orders them.


def _bitcast(x, dtype):
    """`x`'s bits as `dtype`; the last dimension scales by the itemsize ratio (PyTorch's rule)."""
    src, dst = np.dtype(x.dtype), np.dtype(dtype)
    if src == dst:
        return x
    if x.ndim == 0:  # (same itemsize, PyTorch's rule) a complex <-> real step needs a last dim
        return _bitcast(x.reshape(1), dtype).reshape(())
    shape = x.shape
    if src.itemsize != dst.itemsize:
        shape = x.shape[:-1] + (x.shape[-1] * src.itemsize // dst.itemsize,)
    return _bitcast_bits(x, src, dst).reshape(shape)


def _bitcast_bits(x, src, dst):
    if dst == np.bool_:
        return _bitcast(x, np.uint8) != 0
    if src == np.bool_:
        return _bitcast(x.astype(np.uint8), dst)
    if dst.kind == "c":  # pairs of real parts become complex numbers
        part = np.dtype(f"float{dst.itemsize * 4}")
        r = _bitcast(x, part).reshape(x.shape[:-1] + (-1, 2))
        return lax.complex(r[..., 0], r[..., 1])
    if src.kind == "c":
        parts = jnp.stack([jnp.real(x), jnp.imag(x)], -1).reshape(x.shape[:-1] + (-1,))
        return _bitcast(parts, dst)
    if src.itemsize > dst.itemsize:  # one element becomes several (Note [Bitcasts between widths])
        return _split_bits(x, src, dst).reshape(x.shape[:-1] + (-1,))
    if src.itemsize < dst.itemsize:  # several become one
        ratio = dst.itemsize // src.itemsize
        return _join_bits(x.reshape(x.shape[:-1] + (-1, ratio)), src, dst)
    return lax.bitcast_convert_type(x, dst)


def _uint(itemsize: int) -> np.dtype:
    return np.dtype(f"uint{itemsize * 8}")


def _split_bits(x, src, dst):
    """Each `src` element of `x` as its `src.itemsize // dst.itemsize` `dst` elements, on a new
    last axis, low bits first (Note [Bitcasts between widths])."""
    wide, narrow = _uint(src.itemsize), _uint(dst.itemsize)
    bits = lax.bitcast_convert_type(x, wide)
    width = dst.itemsize * 8
    mask = np.array((1 << width) - 1, wide)
    parts = [
        lax.convert_element_type((bits >> np.array(k * width, wide)) & mask, narrow)
        for k in range(src.itemsize // dst.itemsize)
    ]
    return lax.bitcast_convert_type(jnp.stack(parts, -1), dst)


def _join_bits(x, src, dst):
    """The `dst` elements whose bits are `x`'s last axis of `src` elements, low bits first
    (Note [Bitcasts between widths])."""
    wide = _uint(dst.itemsize)
    parts = lax.convert_element_type(lax.bitcast_convert_type(x, _uint(src.itemsize)), wide)
    width = src.itemsize * 8
    out = parts[..., 0]
    for k in range(1, x.shape[-1]):
        out = out | (parts[..., k] << np.array(k * width, wide))
    return lax.bitcast_convert_type(out, dst)


def _jnp_dtype(dtype):
    from ..runtime import jnp_dtype

    return jnp_dtype(dtype)


@view_op(
    aten.view.dtype,
    scatter=lambda parent, new, dtype: _bitcast(new, parent.dtype).reshape(parent.shape),
)
def view_dtype(x, dtype):
    return _bitcast(x, _jnp_dtype(dtype))


# --- non-view shape ops ---------------------------------------------------------------------------


@lowering(aten.cat.default)
def cat(tensors, dim=0):
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not tensors:
        return jnp.zeros((0,))
    dt = jnp.result_type(*tensors)
    return jnp.concatenate([t.astype(dt) for t in tensors], axis=_norm_dim(dim, tensors[0].ndim))


@lowering(aten.stack.default)
def stack(tensors, dim=0):
    dt = jnp.result_type(*tensors)
    return jnp.stack([t.astype(dt) for t in tensors], axis=_norm_dim(dim, tensors[0].ndim + 1))


@lowering(aten.flip.default)
def flip(x, dims):
    return jnp.flip(x, [_norm_dim(d, x.ndim) for d in dims])


@lowering(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts).reshape(x.shape)
    return jnp.roll(x, shifts, [_norm_dim(d, x.ndim) for d in dims])


@lowering(aten.repeat.default)
def repeat(x, repeats):
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, repeats)


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    cfg = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        cfg[d] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), cfg)


@lowering(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowering(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lowering(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    return _select_scatter(x, src, dim, index)


@lowering(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    return _slice_scatter(x, src, dim, start, end, step)


# Note [Slice and select backward]
# Autograd's gradient of a slice or a select (`x[..., :h]`, `x[0]`: rotary embeddings, stacked
# heads) is `slice_backward` / `select_backward`, which eager composes as `zeros` then a `copy_`
# into a view of them: three recorded ops and a view each. Lowered here as one op, the gradient
# padded with zeros (`lax.pad`, its interior padding for a step): the same values, one node.


@lowering(aten.slice_backward.default)
def slice_backward(grad, input_sizes, dim, start, end, step):
    dim = _norm_dim(dim, len(input_sizes))
    s, _ = _slice_bounds(input_sizes[dim], start, end)
    n = grad.shape[dim]
    if n == 0:
        return jnp.zeros(input_sizes, grad.dtype)
    pads = [(0, 0, 0)] * grad.ndim
    pads[dim] = (s, input_sizes[dim] - (s + (n - 1) * step) - 1, step - 1)
    return lax.pad(grad, jnp.zeros((), grad.dtype), pads)


@lowering(aten.select_backward.default)
def select_backward(grad, input_sizes, dim, index):
    dim = _norm_dim(dim, len(input_sizes))
    index = index + input_sizes[dim] if index < 0 else index
    pads = [(0, 0, 0)] * len(input_sizes)
    pads[dim] = (index, input_sizes[dim] - index - 1, 0)
    return lax.pad(jnp.expand_dims(grad, dim), jnp.zeros((), grad.dtype), pads)


@lowering(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    return _diagonal_scatter(x, src, offset, dim1, dim2)


@lowering(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    return _as_strided_scatter(x, src, size, stride, storage_offset)


@lowering(aten.view_copy.default)
def view_copy(x, size):
    return view(x, size)


@lowering(aten.permute_copy.default)
def permute_copy(x, dims):
    return permute(x, dims)


@lowering(aten.expand_copy.default)
def expand_copy(x, size, implicit=False):
    return expand(x, size)


# --- complex views --------------------------------------------------------------------------------


@view_op(
    aten.view_as_real.default,
    scatter=lambda parent, new: lax.complex(new[..., 0], new[..., 1]).astype(parent.dtype),
)
def view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@view_op(
    aten.view_as_complex.default,
    scatter=lambda parent, new: jnp.stack([jnp.real(new), jnp.imag(new)], -1).astype(parent.dtype),
)
def view_as_complex(x):
    return lax.complex(x[..., 0], x[..., 1])


# `x.conj()` sets PyTorch's lazy conjugation bit, which a lazy tensor's value cannot carry: the view
# holds the conjugated values instead (and has no conj bit).
@view_op(aten._conj.default, scatter=lambda parent, new: jnp.conj(new).astype(parent.dtype))
def _conj(x):
    return jnp.conj(x)


# The same for the negation bit (`torch._neg_view`, which PyTorch also uses inside some of its
# composite ops): the view holds the negated values. (With the bit set, copies and reads of the
# view ignored it: `torch._neg_view(x) * 1` read x, not -x.)
@view_op(aten._neg_view.default, scatter=lambda parent, new: jnp.negative(new).astype(parent.dtype))
def _neg_view(x):
    return jnp.negative(x)


@lowering(aten.unfold_backward.default)
def unfold_backward(grad, input_sizes, dim, size, step):
    """The adjoint of unfold: each window's gradient added back where the window was read."""
    shape = tuple(input_sizes)
    if not shape:
        return grad.reshape(())
    d = _norm_dim(dim, len(shape))
    n = (shape[d] - size) // step + 1
    idx = (np.arange(n)[:, None] * step + np.arange(size)[None, :]).reshape(-1)
    g = jnp.moveaxis(grad, -1, d + 1)  # (..., n, size, ...)
    g = g.reshape(shape[:d] + (n * size,) + shape[d + 1 :])
    return jnp.zeros(shape, grad.dtype).at[(slice(None),) * d + (idx,)].add(g)
