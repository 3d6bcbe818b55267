"""Neural-network ops: softmax, losses, normalization, convolution, pooling, embedding.

Backward ops are lowered as the VJP of the forward rule where PyTorch's formula has no simpler form.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .registry import lowering, to_opmath

aten = torch.ops.aten


def _d(dim, n):
    return dim + n if dim < 0 else dim


def _present(*outs):
    """The outputs an `output_mask` asked for: PyTorch returns None for the others, and a node's
    outputs are numbered over tensors only, so a masked-out output must not take a slot."""
    return tuple(o for o in outs if o is not None)


# Note [Softmax rounding]
# ~~~~~~~~~~~~~~~~~~~~~~~
# Eager's CPU kernels for bf16/fp16 compute in float32 but store some intermediates in the input
# dtype, so they round more than once: softmax over a dim that is not the last stores exp(x - max)
# in the output before dividing by the (float32) sum of the unrounded exps; log_softmax over the
# last dim rounds the sum of exps, and its log, to the input dtype before subtracting. Softmax over
# the last dim and log_softmax over another dim round once. The rules round where eager does, so
# that what is computed from them (a cross-entropy) stays bit-equal to eager (opmath=False: the
# rules need the input dtype).
_LOW = (jnp.bfloat16, jnp.float16)


def _softmax_axis(x, dim):
    return _d(dim, x.ndim) if x.ndim else None


@lowering(aten._softmax.default, opmath=False)
def softmax(x, dim, half_to_float=False):
    axis = _softmax_axis(x, dim)
    if x.dtype not in _LOW:
        return jax.nn.softmax(x, axis=axis)
    xf = x.astype(jnp.float32)
    if half_to_float or axis == x.ndim - 1:
        return jax.nn.softmax(xf, axis=axis)
    e = jnp.exp(xf - lax.stop_gradient(jnp.max(xf, axis=axis, keepdims=True)))
    return e.astype(x.dtype).astype(jnp.float32) / jnp.sum(e, axis=axis, keepdims=True)


@lowering(aten._log_softmax.default, opmath=False)
def log_softmax(x, dim, half_to_float=False):
    axis = _softmax_axis(x, dim)
    if x.dtype not in _LOW:
        return jax.nn.log_softmax(x, axis=axis)
    xf = x.astype(jnp.float32)
    if half_to_float or x.ndim == 0 or axis != x.ndim - 1:
        return jax.nn.log_softmax(xf, axis=axis)
    shifted = xf - lax.stop_gradient(jnp.max(xf, axis=axis, keepdims=True))
    total = jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True).astype(x.dtype)
    return shifted - jnp.log(total.astype(jnp.float32)).astype(x.dtype).astype(jnp.float32)


@lowering(aten._softmax_backward_data.default)
def softmax_backward(grad, y, dim, input_dtype):
    d = _d(dim, y.ndim) if y.ndim else None
    return y * (grad - jnp.sum(grad * y, axis=d, keepdims=True))


@lowering(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad, y, dim, input_dtype):
    d = _d(dim, y.ndim) if y.ndim else None
    return grad - jnp.exp(y) * jnp.sum(grad, axis=d, keepdims=True)


def _nll(x, target, weight, reduction, ignore_index):
    # x: (N, C, ...) or (C,); target: (N, ...) or ()
    cdim = 1 if x.ndim > 1 else 0
    t = jnp.where(target == ignore_index, 0, target)
    picked = -jnp.take_along_axis(x, jnp.expand_dims(t, cdim), axis=cdim).squeeze(cdim)
    w = jnp.ones_like(picked) if weight is None else weight[t]
    w = jnp.where(target == ignore_index, 0, w).astype(x.dtype)
    loss = picked * w
    if reduction == 0:
        return loss, jnp.zeros((), x.dtype)
    total = jnp.sum(w)
    if reduction == 1:
        return jnp.sum(loss) / total, total
    return jnp.sum(loss), total


@lowering(aten.nll_loss_forward.default)
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    return _nll(x, target, weight, reduction, ignore_index)


@lowering(aten.nll_loss_backward.default)
def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    # PyTorch's formula: -w[t] * grad (/ total_weight for 'mean') at the target class, and nothing
    # for ignored targets (so an all-ignored batch has a zero gradient, not 0/0).
    cdim = 1 if x.ndim > 1 else 0
    ignored = target == ignore_index
    t = jnp.where(ignored, 0, target)
    w = jnp.ones(t.shape, x.dtype) if weight is None else weight[t].astype(x.dtype)
    g = grad.astype(x.dtype)
    if reduction == 1:
        g = g / total_weight.astype(x.dtype)
    val = jnp.where(ignored, jnp.zeros((), x.dtype), -w * g)
    onehot = jnp.arange(x.shape[cdim]).reshape(
        (-1,) + (1,) * (x.ndim - cdim - 1)
    ) == jnp.expand_dims(t, cdim)
    return jnp.where(onehot, jnp.expand_dims(val, cdim), jnp.zeros((), x.dtype))


@lowering(aten.nll_loss2d_forward.default)
def nll_loss2d_forward(x, target, weight, reduction, ignore_index):
    return _nll(x, target, weight, reduction, ignore_index)


@lowering(aten.nll_loss2d_backward.default)
def nll_loss2d_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    return nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight)


# Note [Float class targets]
# torch_xla's nll_loss takes a floating-point `target` and reads it as class indices (its lowering
# converts it); eager refuses one ("expected scalar type Long but found Float"). torch_xla
# programs rely on that (pytorch/xla's own syncfree-optimizer and sharding tests pass
# `torch.zeros(n)` as NLLLoss targets), so under the torch_xla alias the kernels of these ops
# convert a floating target with `.long()` (truncation, as torch_xla's convert does) before
# recording. A lazyxla program without the alias gets eager's error, as on any other device.
FLOAT_TARGET_POSITION = {
    aten.nll_loss_forward.default: 1,
    aten.nll_loss2d_forward.default: 1,
    aten.nll_loss_backward.default: 2,
    aten.nll_loss2d_backward.default: 2,
}


def float_target_as_index(kernel, pos: int):
    """`kernel` with a floating-point class target at `pos` read as int64 (Note [Float class
    targets])."""

    from .. import compat
    from ..meta import _dtype_name

    def with_index_target(*args, **kwargs):
        t = args[pos] if len(args) > pos else None
        if t is not None and t.dtype != torch.int64:
            if t.dtype == torch.uint8 or (t.is_floating_point() and compat.is_installed()):
                args = (*args[:pos], t.long(), *args[pos + 1 :])  # eager reads Byte as indices
            else:
                raise RuntimeError(
                    f"expected target dtype to be Long or Byte, but got {_dtype_name(t.dtype)}"
                )
        return kernel(*args, **kwargs)

    return with_index_target


def _layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.astype(x.dtype), mean, rstd


@lowering(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    return _layer_norm(x, normalized_shape, weight, bias, eps)


@lowering(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    def f(x_, w_, b_):
        return _layer_norm(x_, normalized_shape, w_, b_, 0.0)[0]

    # Recompute with the saved statistics' epsilon folded in: use the saved rstd directly.
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xhat = (x - mean) * rstd
    w = jnp.ones(normalized_shape, x.dtype) if weight is None else weight
    gx_hat = grad * w
    n = 1
    for s in normalized_shape:
        n *= s
    gx = rstd * (
        gx_hat
        - jnp.mean(gx_hat, axis=axes, keepdims=True)
        - xhat * jnp.mean(gx_hat * xhat, axis=axes, keepdims=True)
    )
    red = tuple(range(x.ndim - len(normalized_shape)))
    gw = jnp.sum(grad * xhat, axis=red) if weight is not None else None
    gb = jnp.sum(grad, axis=red) if bias is not None else None
    del f, n
    return _present(
        gx if output_mask[0] else None,
        gw if output_mask[1] else None,
        gb if output_mask[2] else None,
    )


@lowering(aten._fused_rms_norm.default, opmath=False)  # eps defaults to the input dtype's
def fused_rms_norm(x, normalized_shape, weight, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x
    if eps is None:
        eps = jnp.finfo(xf.dtype).eps
    rstd = lax.rsqrt(jnp.mean(xf * xf, axis=axes, keepdims=True) + eps)
    out = xf * rstd
    if weight is not None:  # eager multiplies by the weight in float32 too, and rounds once
        w = weight.astype(jnp.float32) if weight.dtype in (jnp.bfloat16, jnp.float16) else weight
        out = out * w
    return out.astype(x.dtype), rstd


@lowering(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowering(aten.embedding_renorm.default, opmath=False)
def embedding_renorm(weight, indices, max_norm, norm_type):
    """`nn.Embedding(max_norm=...)`'s in-place renorm, as eager's CPU kernel: each row some index
    names (once, however often it is named) whose norm (in the weight's dtype) exceeds `max_norm`
    is multiplied by `max_norm / (norm + 1e-7)`, computed in double, rounded to the weight's
    dtype (a bf16 weight's scale is a bf16), and applied in opmath."""
    from .reduction import vector_norm

    norms = vector_norm(weight, norm_type, (1,)).astype(weight.dtype).astype(jnp.float64)
    named = jnp.zeros(weight.shape[0], bool).at[indices.reshape(-1)].set(True)
    scale = jnp.where(named & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    wide = to_opmath(weight)
    scale = scale.astype(weight.dtype).astype(wide.dtype)
    return (wide * scale[:, None]).astype(weight.dtype)


@lowering(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = indices.reshape(-1)
    g = grad.reshape(idx.shape[0], -1)
    if padding_idx >= 0:
        g = jnp.where((idx == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        g = _by_frequency(g, idx, num_weights)
    out = jnp.zeros((num_weights, g.shape[1]), grad.dtype).at[idx].add(g)
    return out


def _by_frequency(g, idx, num_weights):
    """`scale_grad_by_freq`: each gradient row divided by how often its index occurs in the
    batch, as eager's CPU kernel scales it: by 1 / count, computed in double and rounded to the
    gradient's dtype (`add_`'s alpha), applied in opmath."""
    counts = jnp.zeros(num_weights, jnp.int32).at[idx].add(1)
    scale = (1.0 / counts[idx].astype(jnp.float64)).astype(g.dtype)
    return (to_opmath(g) * to_opmath(scale)[:, None]).astype(g.dtype)


# Note [Embedding bags]
# `nn.EmbeddingBag` / `F.embedding_bag` reach `_embedding_bag(weight, indices, offsets, ...)` with
# 1-d indices and each bag's start offset (a 2-d input is flattened by F.embedding_bag first).
# Bag ids come from the offsets (`searchsorted`), so shapes stay static and new offsets reuse the
# graph; entries equal to `padding_idx` count nowhere, nor (`include_last_offset`) entries past
# the last offset. Two eager CPU quirks are not followed, the documented semantics are (as CUDA's
# kernels and, since pytorch/pytorch#190264, the CPU's): its max mode folds such trailing entries
# into the last bag, and its `scale_grad_by_freq` backward divided some rows by another index's
# count (pytorch/pytorch#190063). Sum (optionally weighted per sample) and mean accumulate in
# opmath; an empty bag is zeros. Max takes, per bag and column, the first maximal row (eager's
# strict `>`), and `max_indices` names that row. The auxiliary outputs have eager's CPU shapes
# and values: `offset2bag` each entry's bag (empty on the CPU kernel's fast sum), `bag_size` each
# bag's count (0 in sum mode), `max_indices` (bags, dim) in max mode and `bag_size` otherwise; no
# caller reads them but the backward, which recomputes bags and counts from the offsets. The
# weight's gradient is dense (as the CPU fallback returned `sparse=True`'s before).
def _bags(indices, offsets, n_bags, padding_idx):
    """Each entry's bag (clipped into range), whether it counts, and each bag's count (in the
    offsets' dtype)."""
    bag = jnp.searchsorted(offsets, jnp.arange(indices.shape[0]), side="right") - 1
    keep = (bag >= 0) & (bag < n_bags) & (indices != padding_idx)
    bag = jnp.clip(bag, 0, max(n_bags - 1, 0))
    counts = jnp.zeros(n_bags, offsets.dtype).at[bag].add(keep.astype(offsets.dtype))
    return bag, keep, counts


def _embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset,
                   padding_idx):  # fmt: skip
    """The output, each entry's bag, each bag's count, and max mode's row indices."""
    n_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    bag, keep, counts = _bags(indices, offsets, n_bags, padding_idx)
    itype = offsets.dtype
    rows = to_opmath(jnp.take(weight, indices, axis=0, mode="clip"))
    shape = (n_bags, weight.shape[1])
    max_indices = None
    if mode == 2:
        vals = jnp.where(keep[:, None], rows, -jnp.inf)
        best = jnp.full(shape, -jnp.inf, rows.dtype).at[bag].max(vals)
        n = indices.shape[0]
        hit = keep[:, None] & (rows == best[bag])
        pos = jnp.where(hit, jnp.arange(n)[:, None], n)
        first = jnp.full(shape, n, pos.dtype).at[bag].min(pos)
        max_indices = jnp.where(first < n, indices[jnp.minimum(first, n - 1)], 0).astype(itype)
        out = jnp.where((counts > 0)[:, None], best, 0)
    else:
        if per_sample_weights is not None:
            rows = rows * to_opmath(per_sample_weights)[:, None]
        out = jnp.zeros(shape, rows.dtype).at[bag].add(jnp.where(keep[:, None], rows, 0))
        if mode == 1:
            out = jnp.where((counts > 0)[:, None], out / jnp.maximum(counts, 1)[:, None], 0)
    return out.astype(weight.dtype), bag.astype(itype), counts, max_indices


@lowering(aten._embedding_bag.default, opmath=False)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):  # fmt: skip
    out, bag, counts, max_indices = _embedding_bag(
        weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx
    )
    # eager's CPU kernel (PyTorch's meta follows it): a sum over float/half rows without padding
    # skips offset2bag; sum mode leaves bag_size 0; outside max mode max_indices is bag_size
    fast_sum = mode == 0 and weight.dtype in (jnp.float32, jnp.float16) and padding_idx < 0
    if fast_sum:
        bag = bag[:0]
    if mode == 0:
        counts = jnp.zeros_like(counts)
    return out, bag, counts, counts if max_indices is None else max_indices


@lowering(aten._embedding_bag_forward_only.default, opmath=False)
def embedding_bag_forward_only(weight, indices, offsets, scale_grad_by_freq=False, mode=0,
                               sparse=False, per_sample_weights=None, include_last_offset=False,
                               padding_idx=-1):  # fmt: skip
    out, bag, counts, max_indices = embedding_bag(
        weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
        include_last_offset, padding_idx,
    )  # fmt: skip
    # (its bag_size has the offsets' length: PyTorch's meta for it)
    sizes = jnp.zeros(offsets.shape, counts.dtype).at[: counts.shape[0]].set(counts)
    return out, bag, sizes, max_indices


@lowering(aten._embedding_bag_backward.default, opmath=False)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                           num_weights, scale_grad_by_freq, mode, sparse,
                           per_sample_weights, padding_idx=-1):  # fmt: skip
    n_bags, dim = grad.shape
    bag, keep, counts = _bags(indices, offsets, n_bags, padding_idx)
    g = to_opmath(grad)
    if mode == 2:
        cols = jnp.broadcast_to(jnp.arange(dim), (n_bags, dim))
        contrib = jnp.where((counts > 0)[:, None], g, 0)
        out = jnp.zeros((num_weights, dim), g.dtype).at[maximum_indices, cols].add(contrib)
        return out.astype(grad.dtype)
    rows = g[bag]
    if mode == 1:
        rows = rows / jnp.maximum(counts, 1)[bag][:, None]
    if per_sample_weights is not None:
        rows = rows * to_opmath(per_sample_weights)[:, None]
    rows = jnp.where(keep[:, None], rows, 0).astype(grad.dtype)
    if scale_grad_by_freq:
        rows = _by_frequency(rows, indices, num_weights)
    return jnp.zeros((num_weights, dim), grad.dtype).at[indices].add(rows)


@lowering(aten._embedding_bag_per_sample_weights_backward.default, opmath=False)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode,
                                              padding_idx=-1):  # fmt: skip
    bag, keep, _ = _bags(indices, offsets, grad.shape[0], padding_idx)
    rows = to_opmath(jnp.take(weight, indices, axis=0, mode="clip"))
    dots = jnp.sum(to_opmath(grad)[bag] * rows, axis=1)
    return jnp.where(keep, dots, 0).astype(grad.dtype)


def _acc_type(x):
    return jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else None


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    nd = x.ndim - 2
    spatial = "DHW"[-nd:] if nd <= 3 else None
    dn = lax.conv_dimension_numbers(
        x.shape, w.shape, ("NC" + spatial, "OI" + spatial, "NC" + spatial)
    )
    stride, padding, dilation = list(stride), list(padding), list(dilation)
    if len(stride) == 1:
        stride = stride * nd
    if len(padding) == 1:
        padding = padding * nd
    if len(dilation) == 1:
        dilation = dilation * nd
    if not transposed:
        return lax.conv_general_dilated(
            x,
            w,
            window_strides=stride,
            padding=[(p, p) for p in padding],
            rhs_dilation=dilation,
            dimension_numbers=dn,
            feature_group_count=groups,
            precision=lax.Precision.HIGHEST,
            preferred_element_type=_acc_type(x),
        )
    # Transposed conv = gradient of conv w.r.t. its input: dilate input by stride, flip the kernel.
    op = list(output_padding) if output_padding else [0] * nd
    if len(op) == 1:
        op = op * nd
    cin = w.shape[0]
    w_ = w.reshape((groups, cin // groups) + w.shape[1:])
    w_ = jnp.swapaxes(w_, 1, 2).reshape((w.shape[1] * groups, cin // groups) + w.shape[2:])
    w_ = jnp.flip(w_, axis=tuple(range(2, 2 + nd)))
    pads = [
        (d * (k - 1) - p, d * (k - 1) - p + o)
        for k, p, d, o in zip(w.shape[2:], padding, dilation, op)
    ]
    dn2 = lax.conv_dimension_numbers(
        x.shape, w_.shape, ("NC" + spatial, "OI" + spatial, "NC" + spatial)
    )
    return lax.conv_general_dilated(
        x,
        w_,
        window_strides=[1] * nd,
        padding=pads,
        lhs_dilation=stride,
        rhs_dilation=dilation,
        dimension_numbers=dn2,
        feature_group_count=groups,
        precision=lax.Precision.HIGHEST,
        preferred_element_type=_acc_type(x),
    )


# Convolutions keep bf16/fp16 inputs and accumulate in float32 (Note [Opmath]).
@lowering(aten.convolution.default, opmath=False)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * (out.ndim - 2))
    return out


@lowering(aten.convolution_backward.default, opmath=False)
def convolution_backward(
    grad,
    x,
    w,
    bias_sizes,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    output_mask,
):
    out, vjp = jax.vjp(
        lambda x_, w_: _conv(x_, w_, stride, padding, dilation, transposed, output_padding, groups),
        x,
        w,
    )
    gx, gw = vjp(grad.astype(out.dtype))
    gb = (
        jnp.sum(
            grad.astype(jnp.float32) if _acc_type(x) else grad,
            axis=(0,) + tuple(range(2, grad.ndim)),
        )
        if output_mask[2]
        else None
    )
    return _present(gx if output_mask[0] else None, gw if output_mask[1] else None, gb)


def _pool_cfg(x, kernel_size, stride, padding, dilation=1):
    nd = len(kernel_size)
    stride = list(stride) if stride else list(kernel_size)
    stride = stride * nd if len(stride) == 1 else stride
    padding = list(padding) * nd if len(padding) == 1 else list(padding)
    dilation = [dilation] * nd if isinstance(dilation, int) else list(dilation)
    dilation = dilation * nd if len(dilation) == 1 else dilation
    lead = x.ndim - nd
    window = (1,) * lead + tuple(kernel_size)
    strides = (1,) * lead + tuple(stride)
    pads = ((0, 0),) * lead + tuple((p, p) for p in padding)
    dil = (1,) * lead + tuple(dilation)
    return window, strides, pads, dil


def _ceil_extra(x, window, strides, pads, dil, ceil_mode):
    if not ceil_mode:
        return pads
    new = []
    for n, k, s, (lo, hi), d in zip(x.shape, window, strides, pads, dil):
        eff = d * (k - 1) + 1
        out_floor = (n + lo + hi - eff) // s + 1
        out_ceil = -(-(n + lo + hi - eff) // s) + 1
        if (out_ceil - 1) * s >= n + lo:
            out_ceil -= 1
        extra = max(0, (out_ceil - out_floor) * s)
        new.append((lo, hi + extra))
    return tuple(new)


def _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode):
    window, strides, pads, dil = _pool_cfg(x, kernel_size, stride, padding, dilation)
    pads = _ceil_extra(x, window, strides, pads, dil, ceil_mode)
    init = -np.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    # A concrete (numpy) init value: JAX recognises the max/add monoid and can differentiate it.
    return lax.reduce_window(
        x, np.array(init, x.dtype), lax.max, window, strides, pads, window_dilation=dil
    )


@lowering(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def max_pool_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    out = _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode)
    # Indices: flat position in the input's spatial plane of each window's maximum.
    nd = len(kernel_size)
    spatial = x.shape[-nd:]
    flat = jnp.arange(math.prod(spatial), dtype=jnp.int64).reshape(spatial)
    flat = jnp.broadcast_to(flat, x.shape)
    window, strides, pads, dil = _pool_cfg(x, kernel_size, stride, padding, dilation)
    pads = _ceil_extra(x, window, strides, pads, dil, ceil_mode)
    init = -np.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min

    def sel(a, b):
        av, ai = a
        bv, bi = b
        take_b = (bv > av) | ((bv == av) & (bi < ai))
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    _, idx = lax.reduce_window(
        (x, flat),
        (np.array(init, x.dtype), np.array(np.iinfo(np.int64).max, np.int64)),
        sel,
        window,
        strides,
        pads,
        window_dilation=dil,
    )
    return out, idx


@lowering(
    aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default
)
def max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    nd = len(kernel_size)
    lead = x.shape[:-nd]
    n = 1
    for s in x.shape[-nd:]:
        n *= s
    g = grad.reshape(lead + (-1,))
    idx = indices.reshape(lead + (-1,))
    out = jnp.zeros(lead + (n,), grad.dtype)
    out = jax.vmap(lambda o, i, v: o.at[i].add(v))(
        out.reshape(-1, n), idx.reshape(-1, idx.shape[-1]), g.reshape(-1, g.shape[-1])
    )
    return out.reshape(x.shape)


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    window, strides, pads, dil = _pool_cfg(x, kernel_size, stride, padding)
    pads_c = _ceil_extra(x, window, strides, pads, dil, ceil_mode)
    s = lax.reduce_window(x, np.array(0, x.dtype), lax.add, window, strides, pads_c)
    if divisor_override:
        return s / divisor_override
    if count_include_pad:
        # Padding counts, the ceil-mode overhang does not.
        padded = tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, pads))
        ones = jnp.ones(padded, x.dtype)
        extra = tuple((0, c[1] - p[1]) for c, p in zip(pads_c, pads))
        cnt = lax.reduce_window(ones, np.array(0, x.dtype), lax.add, window, strides, extra)
    else:
        cnt = lax.reduce_window(
            jnp.ones(x.shape, x.dtype), np.array(0, x.dtype), lax.add, window, strides, pads_c
        )
    return s / cnt


@lowering(aten.avg_pool2d.default, aten.avg_pool3d.default)
def avg_pool(
    x,
    kernel_size,
    stride=(),
    padding=(0,),
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
):
    return _avg_pool(
        x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


@lowering(aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default)
def avg_pool_backward(
    grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    _, vjp = jax.vjp(
        lambda v: _avg_pool(
            v, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
        ),
        x,
    )
    return vjp(grad)[0]


def _bn_stats_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _bshape(v, x):
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    axes = _bn_stats_axes(x)
    xf = x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x
    if training:
        mean = jnp.mean(xf, axis=axes)
        var = jnp.var(xf, axis=axes)
        n = xf.size // xf.shape[1]
        if running_mean is not None:
            new_rm = (1 - momentum) * running_mean + momentum * mean.astype(running_mean.dtype)
            new_rv = (1 - momentum) * running_var + momentum * (var * n / max(n - 1, 1)).astype(
                running_var.dtype
            )
        else:
            new_rm, new_rv = running_mean, running_var
    else:
        mean, var = running_mean.astype(xf.dtype), running_var.astype(xf.dtype)
        new_rm, new_rv = running_mean, running_var
    rstd = lax.rsqrt(var + eps)
    out = (xf - _bshape(mean, x)) * _bshape(rstd, x)
    if weight is not None:
        out = out * _bshape(weight, x)
    if bias is not None:
        out = out + _bshape(bias, x)
    return out.astype(x.dtype), mean, rstd, new_rm, new_rv


@lowering(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(
    x, weight, bias, running_mean, running_var, training, momentum, eps
):
    out, mean, rstd, rm, rv = _batch_norm(
        x, weight, bias, running_mean, running_var, training, momentum, eps
    )
    if not training:
        mean, rstd = jnp.zeros((0,), x.dtype), jnp.zeros((0,), x.dtype)
    return out, mean, rstd, rm, rv


@lowering(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    out, *_ = _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)
    return out, jnp.zeros((0,), x.dtype), jnp.zeros((0,), x.dtype)


@lowering(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(
    grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    axes = _bn_stats_axes(x)
    if train:
        mean, rstd = save_mean, save_invstd
    else:
        mean, rstd = running_mean, lax.rsqrt(running_var + eps)
    w = jnp.ones((x.shape[1],), x.dtype) if weight is None else weight
    xhat = (x - _bshape(mean, x)) * _bshape(rstd, x)
    gb = jnp.sum(grad, axis=axes)
    gw = jnp.sum(grad * xhat, axis=axes)
    if train:
        n = x.size // x.shape[1]
        gx = _bshape(w * rstd, x) * (grad - _bshape(gb / n, x) - xhat * _bshape(gw / n, x))
    else:
        gx = grad * _bshape(w * rstd, x)
    return _present(
        gx if output_mask[0] else None,
        gw if output_mask[1] else None,
        gb if output_mask[2] else None,
    )


@lowering(aten.mse_loss.default)
def mse_loss(x, y, reduction=1):
    d = jnp.square(x - y)
    return d if reduction == 0 else (jnp.mean(d) if reduction == 1 else jnp.sum(d))


@lowering(aten.mse_loss_backward.default)
def mse_loss_backward(grad, x, y, reduction):
    g = 2 * (x - y) * grad
    return g / x.size if reduction == 1 else g


@lowering(aten._fused_rms_norm_backward.default)
def fused_rms_norm_backward(grad, x, normalized_shape, rstd, weight, output_mask):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x
    xhat = xf * rstd
    g = grad.astype(xf.dtype)
    gxhat = g * weight if weight is not None else g
    n = 1
    for s in normalized_shape:
        n *= s
    gx = rstd * (gxhat - xhat * jnp.sum(gxhat * xhat, axis=axes, keepdims=True) / n)
    red = tuple(range(x.ndim - len(normalized_shape)))
    gw = jnp.sum(g * xhat, axis=red) if weight is not None and output_mask[1] else None
    return _present((gx.astype(x.dtype) if output_mask[0] else None), gw)


# Note [Weight norm]
# `torch._weight_norm` (nn.utils.weight_norm and its parametrization: wav2vec2's and HuBERT's
# positional convolution, audio vocoders) calls the fused `_weight_norm_interface` on any device
# when `dim` is the first or the last; it ran through the CPU fallback, forward and backward, each
# step. As eager's kernel: the norm of `v` over every dim but `dim` (kept as size-1 dims, in
# float32 for bf16/fp16), w = v * (g / norm) rounded once; the backward's
# grad_g = sum(grad_w * v) / norm and grad_v = (g / norm) * (grad_w - v * grad_g / norm).
def _norm_axes(v, dim):
    return tuple(i for i in range(v.ndim) if i != dim % max(v.ndim, 1))


@lowering(aten._weight_norm_interface.default)
def weight_norm_interface(v, g, dim=0):
    norms = jnp.sqrt(jnp.sum(v * v, axis=_norm_axes(v, dim), keepdims=True))
    return v * (g / norms), norms


@lowering(aten._weight_norm_interface_backward.default)
def weight_norm_interface_backward(grad_w, v, g, norms, dim):
    grad_g = jnp.sum(grad_w * v, axis=_norm_axes(v, dim), keepdims=True) / norms
    grad_v = (g / norms) * (grad_w - v * (grad_g / norms))
    return grad_v, grad_g


# Long-tail families (ops/__init__.py imports this module; importing these registers them).
# Attention's custom ops and the scaled_dot_product_attention kernel (Note [Blockwise attention]),
# and torch.utils.checkpoint on lazy tensors (Note [Checkpointing]): both register on import.
from .. import attention as _attention  # noqa: E402,F401
from .. import ctc as _ctc  # noqa: E402,F401  (Note [CTC loss])
from .. import einsum as _einsum  # noqa: E402,F401  (Note [Einsum kept whole])
from .. import prod_grad as _prod_grad  # noqa: E402,F401  (Note [Product gradients without a sync])
from .. import products as _products  # noqa: E402,F401  (Note [Products kept whole])
from .. import remat as _remat  # noqa: E402,F401
from . import (  # noqa: E402,F401
    activations,
    decompositions,
    distances,
    fft,
    losses,
    ordering,
    pooling,
    special_functions,
)
