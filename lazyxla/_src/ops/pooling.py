"""Adaptive and unpooling, upsampling/interpolation, reflection/replication padding, im2col/col2im,
group norm.

Interpolation follows PyTorch's index math (`area_pixel_compute_source_index` and the nearest
rules in UpSample.h), not `jax.image.resize`, whose half-pixel and align-corners conventions differ.
Backward ops are the VJP of the forward rule.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from torch._prims_common import suggest_memory_format

from ..meta import META_RULES
from .registry import lowering

aten = torch.ops.aten
_HI = lax.Precision.HIGHEST


def _f(x):
    return x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x


# --- adaptive pooling -----------------------------------------------------------------------------


def _adaptive_bounds(n_in, n_out):
    starts = [(i * n_in) // n_out for i in range(n_out)]
    ends = [-(-((i + 1) * n_in) // n_out) for i in range(n_out)]
    return starts, ends


def _adaptive_avg(x, output_size):
    nd = len(output_size)
    out = _f(x)
    for k in range(nd):
        ax = x.ndim - nd + k
        n_in, n_out = x.shape[ax], output_size[k]
        s, e = _adaptive_bounds(n_in, n_out)
        w = np.zeros((n_in, n_out), np.float64)
        for o in range(n_out):
            w[s[o] : e[o], o] = 1.0 / (e[o] - s[o])
        out = jnp.moveaxis(
            jnp.tensordot(jnp.moveaxis(out, ax, -1), w.astype(out.dtype), axes=1, precision=_HI),
            -1,
            ax,
        )
    return out


@lowering(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool(x, output_size):
    return _adaptive_avg(x, output_size)


def _adaptive_avg_backward(nd):
    def rule(grad, x):
        size = grad.shape[-nd:]
        return jax.vjp(lambda v: _adaptive_avg(v, size), x)[1](_f(grad).astype(_f(x).dtype))[0]

    return rule


lowering(aten._adaptive_avg_pool2d_backward.default)(_adaptive_avg_backward(2))
lowering(aten._adaptive_avg_pool3d_backward.default)(_adaptive_avg_backward(3))


def _adaptive_max(x, output_size):
    nd = len(output_size)
    spatial = x.shape[-nd:]
    # per dimension: (n_out, L) window positions and validity
    idxs, valid = [], []
    for n_in, n_out in zip(spatial, output_size):
        s, e = _adaptive_bounds(n_in, n_out)
        L = max(b - a for a, b in zip(s, e))
        pos = np.array([[min(a + j, n_in - 1) for j in range(L)] for a in s])
        ok = np.array([[a + j < b for j in range(L)] for a, b in zip(s, e)])
        idxs.append(pos)
        valid.append(ok)
    flat = x.reshape(x.shape[:-nd] + (-1,))
    # Build the flat gather index of shape out_1..out_nd, L_1..L_nd
    strides = [int(np.prod(spatial[k + 1 :])) for k in range(nd)]
    gidx = np.zeros(tuple(output_size) + tuple(p.shape[1] for p in idxs), np.int64)
    gok = np.ones(gidx.shape, bool)
    for k in range(nd):
        shape = [1] * (2 * nd)
        shape[k] = output_size[k]
        shape[nd + k] = idxs[k].shape[1]
        gidx = gidx + idxs[k].reshape(shape) * strides[k]
        gok = gok & valid[k].reshape(shape)
    win = int(np.prod(gidx.shape[nd:]))
    gidx = gidx.reshape(tuple(output_size) + (win,))
    gok = gok.reshape(gidx.shape)
    vals = flat[..., gidx]  # lead + out + (win,)
    neg = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    vals = jnp.where(gok, vals, neg)
    isnan = jnp.isnan(vals) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.zeros_like(gok)
    # first NaN wins, otherwise the first maximum
    has_nan = jnp.any(isnan, axis=-1, keepdims=True)
    key = jnp.where(has_nan, isnan.astype(vals.dtype), vals)
    arg = jnp.argmax(key, axis=-1)
    out = jnp.take_along_axis(vals, arg[..., None], axis=-1)[..., 0]
    ind = jnp.take_along_axis(jnp.broadcast_to(gidx, vals.shape), arg[..., None], axis=-1)[..., 0]
    return out, ind.astype(jnp.int64)


@lowering(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(x, output_size):
    return _adaptive_max(x, output_size)


def _adaptive_max_backward(nd):
    def rule(grad, x, indices):
        return _unpool_flat(grad, indices, x.shape[-nd:], add=True).reshape(x.shape)

    return rule


lowering(aten.adaptive_max_pool2d_backward.default)(_adaptive_max_backward(2))
lowering(aten.adaptive_max_pool3d_backward.default)(_adaptive_max_backward(3))


def _unpool_flat(v, indices, spatial, add=False):
    nd = len(spatial)
    lead = v.shape[: v.ndim - nd]
    n = int(np.prod(spatial))
    vf = v.reshape((-1, int(np.prod(v.shape[v.ndim - nd :]))))
    idx = indices.reshape(vf.shape)
    out = jnp.zeros((vf.shape[0], n), v.dtype)
    if add:
        out = jax.vmap(lambda o, i, s: o.at[i].add(s))(out, idx, vf)
    else:
        out = jax.vmap(lambda o, i, s: o.at[i].set(s))(out, idx, vf)
    return out.reshape(lead + tuple(spatial))


@lowering(aten.max_unpool2d.default)
def max_unpool2d(x, indices, output_size):
    return _unpool_flat(x, indices, tuple(output_size))


def _max_unpool2d_meta(x, indices, output_size):
    """PyTorch's meta output in eager CPU's layout: the kernel allocates it in the input's
    suggested memory format (a channels_last input unpools to channels_last); the meta kernel
    allocates it contiguous."""
    out = aten.max_unpool2d.default(x, indices, output_size)
    return out.contiguous(memory_format=suggest_memory_format(x))


META_RULES[aten.max_unpool2d.default] = _max_unpool2d_meta


@lowering(aten.max_unpool3d.default)
def max_unpool3d(x, indices, output_size, stride, padding):
    return _unpool_flat(x, indices, tuple(output_size))


# --- upsampling -----------------------------------------------------------------------------------


def _scale(n_in, n_out, align_corners, scale):
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n_in / n_out


def _nearest_index(n_in, n_out, scale, exact):
    s = np.float32(_scale(n_in, n_out, False, scale))
    i = np.arange(n_out, dtype=np.float32)
    if exact:
        src = np.floor((i + np.float32(0.5)) * s).astype(np.int64)
    else:
        src = np.floor(i * s).astype(np.int64)
    return np.minimum(src, n_in - 1)


def _nearest(x, output_size, scales, exact):
    nd = len(output_size)
    for k in range(nd):
        ax = x.ndim - nd + k
        idx = _nearest_index(x.shape[ax], output_size[k], scales[k], exact)
        x = jnp.take(x, idx, axis=ax)
    return x


def _scales(scales, nd):
    return list(scales) if scales else [None] * nd


def _up_nearest(exact):
    def rule(x, output_size, *scales):
        return _nearest(x, output_size, _scales(scales, len(output_size)), exact)

    return rule


for _op in (aten.upsample_nearest1d.default, aten.upsample_nearest2d.default):
    lowering(_op)(_up_nearest(False))
lowering(aten.upsample_nearest3d.default)(_up_nearest(False))
for _op in (
    aten._upsample_nearest_exact1d.default,
    aten._upsample_nearest_exact2d.default,
    aten._upsample_nearest_exact3d.default,
):
    lowering(_op)(_up_nearest(True))


def _up_nearest_backward(exact):
    def rule(grad, output_size, input_size, *scales):
        x0 = jnp.zeros(tuple(input_size), grad.dtype)
        s = _scales(scales, len(output_size))
        return jax.vjp(lambda v: _nearest(v, output_size, s, exact), x0)[1](grad)[0]

    return rule


for _op in (
    aten.upsample_nearest1d_backward.default,
    aten.upsample_nearest2d_backward.default,
    aten.upsample_nearest3d_backward.default,
):
    lowering(_op)(_up_nearest_backward(False))
for _op in (
    aten._upsample_nearest_exact1d_backward.default,
    aten._upsample_nearest_exact2d_backward.default,
    aten._upsample_nearest_exact3d_backward.default,
):
    lowering(_op)(_up_nearest_backward(True))


def _index_dtype(x):
    """Eager computes source indices and weights in the op-math type: double for float64."""
    return np.float64 if x.dtype == jnp.float64 else np.float32


def _linear_axis(x, ax, n_out, align_corners, scale, wdtype):
    n_in = x.shape[ax]
    f = _index_dtype(x)
    s = f(_scale(n_in, n_out, align_corners, scale))
    i = np.arange(n_out, dtype=f)
    if align_corners:
        src = i * s
    else:
        src = np.maximum((i + f(0.5)) * s - f(0.5), f(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    lam1 = (src - i0).astype(f)
    shape = [1] * x.ndim
    shape[ax] = n_out
    if wdtype is None:
        lam1 = jnp.asarray(lam1.reshape(shape), x.dtype)
        lam0 = 1 - lam1
    else:  # weights kept in the input dtype: lambda1 rounded, then lambda0 = 1 - lambda1 rounded
        lam1 = lam1.astype(wdtype).astype(np.float32)
        lam0 = (np.float32(1) - lam1).astype(wdtype).astype(np.float32)
        lam0, lam1 = (jnp.asarray(w.reshape(shape), x.dtype) for w in (lam0, lam1))
    return jnp.take(x, i0, axis=ax) * lam0 + jnp.take(x, i1, axis=ax) * lam1


def _linear(x, output_size, align_corners, scales):
    """bf16/fp16 inputs are interpolated in float32 and rounded once, as eager does; its 1d and 3d
    kernels keep the weights in the input dtype (UpSample.h's scalar_t lambdas: ~40% of the
    elements differed by an ulp with float32 weights), its bilinear kernel in float32. The last dim
    is interpolated first, as eager nests the sums. Integer images: Note [Resampling uint8]."""
    nd = len(output_size)
    if _is_int(x):
        return _int_passes(
            x,
            output_size,
            lambda y, ax, k: _linear_axis(y, ax, output_size[k], align_corners, scales[k], None),
        )
    y = _f(x)
    rounded = nd != 2 and x.dtype in (jnp.bfloat16, jnp.float16)
    wdtype = np.dtype(x.dtype) if rounded else None
    for k in reversed(range(nd)):
        y = _linear_axis(y, x.ndim - nd + k, output_size[k], align_corners, scales[k], wdtype)
    return y


# Note [Resampling uint8]
# Eager resizes uint8 images (bilinear, bicubic, antialiased or not) with a fixed-point kernel
# from Pillow-SIMD (UpSampleKernelAVXAntialias.h): one pass per axis, the last dim first, each
# pass's sum rounded and clamped to 0..255. Computed in the image's own dtype, as float images
# are, the fractional weights truncated to 0 and every output was its source pixel's neighbour
# (98 % of the elements of a 270x270 -> 130x130 resize wrong by up to 255). lazyxla runs each
# pass in float32 and rounds and clamps its result the same way; eager's 16-bit quantized
# weights can still round an element the other way (within 1 of eager for bilinear).


def _is_int(x):
    return jnp.issubdtype(x.dtype, jnp.integer)


def _int_passes(x, output_size, axis_pass):
    info = jnp.iinfo(x.dtype)
    nd = len(output_size)
    y = x.astype(jnp.float32)
    for k in reversed(range(nd)):
        y = axis_pass(y, x.ndim - nd + k, k)
        y = jnp.clip(jnp.floor(y + 0.5), info.min, info.max)
    return y.astype(x.dtype)


def _up_linear(x, output_size, align_corners, *scales):
    return _linear(x, output_size, align_corners, _scales(scales, len(output_size)))


for _op in (
    aten.upsample_linear1d.default,
    aten.upsample_bilinear2d.default,
    aten.upsample_trilinear3d.default,
):
    lowering(_op, opmath=False)(_up_linear)  # _linear needs the input dtype for the weights


@lowering(
    aten.upsample_linear1d_backward.default,
    aten.upsample_bilinear2d_backward.default,
    aten.upsample_trilinear3d_backward.default,
)
def up_linear_backward(grad, output_size, input_size, align_corners, *scales):
    x0 = jnp.zeros(tuple(input_size), _f(grad).dtype)
    s = _scales(scales, len(output_size))
    return jax.vjp(lambda v: _linear(v, output_size, align_corners, s), x0)[1](_f(grad))[0]


def _cubic_near(s, a):  # the cubic convolution kernel for |s| <= 1
    return ((a + 2) * s - (a + 3)) * s * s + 1


def _cubic_far(s, a):  # and for 1 < |s| < 2
    return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a


def _cubic_weights(t, a=-0.75):
    """The 4 taps' weights at fractional offset t (PyTorch's bicubic, A = -0.75)."""
    return [_cubic_far(t + 1, a), _cubic_near(t, a), _cubic_near(1 - t, a), _cubic_far(2 - t, a)]


def _cubic_axis(x, ax, n_out, align_corners, scale):
    n_in = x.shape[ax]
    f = _index_dtype(x)
    s = f(_scale(n_in, n_out, align_corners, scale))
    i = np.arange(n_out, dtype=f)
    src = i * s if align_corners else (i + f(0.5)) * s - f(0.5)
    fl = np.floor(src)
    t = (src - fl).astype(f)
    fl = fl.astype(np.int64)
    ws = _cubic_weights(t)
    shape = [1] * x.ndim
    shape[ax] = n_out
    out = 0
    for k in range(4):
        idx = np.clip(fl - 1 + k, 0, n_in - 1)
        out = out + jnp.take(x, idx, axis=ax) * jnp.asarray(ws[k].astype(f).reshape(shape), x.dtype)
    return out


def _cubic(x, output_size, align_corners, scales):
    if _is_int(x):  # Note [Resampling uint8]
        return _int_passes(
            x,
            output_size,
            lambda y, ax, k: _cubic_axis(y, ax, output_size[k], align_corners, scales[k]),
        )
    y = _f(x)
    for k in range(2):
        y = _cubic_axis(y, x.ndim - 2 + k, output_size[k], align_corners, scales[k])
    return y


@lowering(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _cubic(x, output_size, align_corners, [scales_h, scales_w])


@lowering(aten.upsample_bicubic2d_backward.default)
def upsample_bicubic2d_backward(
    grad, output_size, input_size, align_corners, scales_h=None, scales_w=None
):
    x0 = jnp.zeros(tuple(input_size), _f(grad).dtype)
    f = lambda v: _cubic(v, output_size, align_corners, [scales_h, scales_w])
    return jax.vjp(f, x0)[1](_f(grad))[0]


# --- padding --------------------------------------------------------------------------------------


def _pad(x, padding, mode):
    """Reflection/replication padding as a gather: output i reads input i - left, reflected or
    clamped into range (so negative padding crops, as in PyTorch)."""
    nd = len(padding) // 2
    for i in range(nd):
        ax = x.ndim - 1 - i
        lo, hi = padding[2 * i], padding[2 * i + 1]
        n = x.shape[ax]
        j = np.arange(n + lo + hi) - lo
        if mode == "reflect":
            j = np.abs(j)
            j = (n - 1) - np.abs((n - 1) - j)
        j = np.clip(j, 0, n - 1)
        x = jnp.take(x, j, axis=ax)
    return x


def _pad_rule(mode):
    return lambda x, padding: _pad(x, padding, mode)


def _pad_backward_rule(mode):
    def rule(grad, x, padding):
        return jax.vjp(lambda v: _pad(v, padding, mode), x)[1](grad)[0]

    return rule


for _ops, _mode in (
    (("reflection_pad1d", "reflection_pad2d", "reflection_pad3d"), "reflect"),
    (("replication_pad1d", "replication_pad2d", "replication_pad3d"), "edge"),
):
    for _name in _ops:
        lowering(getattr(aten, _name).default)(_pad_rule(_mode))
        lowering(getattr(aten, _name + "_backward").default)(_pad_backward_rule(_mode))


# --- im2col / col2im ------------------------------------------------------------------------------


def _im2col(x, kernel_size, dilation, padding, stride):
    batched = x.ndim == 4
    xb = x if batched else x[None]
    if xb.size == 0:
        oh, ow = (
            (n + 2 * p - d * (k - 1) - 1) // s + 1
            for n, p, d, k, s in zip(xb.shape[2:], padding, dilation, kernel_size, stride)
        )
        out = jnp.zeros((xb.shape[0], xb.shape[1] * math.prod(kernel_size), oh * ow), xb.dtype)
        return out if batched else out[0]
    p = lax.conv_general_dilated_patches(
        _f(xb),
        tuple(kernel_size),
        tuple(stride),
        [(p, p) for p in padding],
        rhs_dilation=tuple(dilation),
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
        precision=_HI,
    )
    out = p.reshape(p.shape[0], p.shape[1], -1)
    return out if batched else out[0]


@lowering(aten.im2col.default)
def im2col(x, kernel_size, dilation, padding, stride):
    return _im2col(x, kernel_size, dilation, padding, stride)


@lowering(aten.col2im.default)
def col2im(cols, output_size, kernel_size, dilation, padding, stride):
    batched = cols.ndim == 3
    c = cols.shape[-2] // math.prod(kernel_size)
    shape = ((cols.shape[0],) if batched else ()) + (c,) + tuple(output_size)
    x0 = jnp.zeros(shape, _f(cols).dtype)
    f = lambda v: _im2col(v, kernel_size, dilation, padding, stride)
    return jax.vjp(f, x0)[1](_f(cols))[0]


@lowering(aten.channel_shuffle.default, aten.native_channel_shuffle.default)
def channel_shuffle(x, groups):
    n, c = x.shape[:2]
    rest = x.shape[2:]
    y = x.reshape((n, groups, c // groups) + rest)
    return jnp.swapaxes(y, 1, 2).reshape(x.shape)


# --- group norm -----------------------------------------------------------------------------------


def _group_norm(x, weight, bias, n, c, hxw, group, eps):
    xf = _f(x).reshape(n, group, c // group * hxw)  # (-1 is ambiguous for an empty batch)
    mean = jnp.mean(xf, axis=-1)
    var = jnp.mean(jnp.square(xf - mean[..., None]), axis=-1)
    rstd = lax.rsqrt(var + eps)
    out = ((xf - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    bshape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * _f(weight).reshape(bshape)
    if bias is not None:
        out = out + _f(bias).reshape(bshape)
    return out.astype(x.dtype), mean, rstd


@lowering(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    return _group_norm(x, weight, bias, n, c, hxw, group, eps)


@lowering(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad, x, mean, rstd, weight, n, c, hxw, group, output_mask):
    xf, g = _f(x), _f(grad)
    xg = xf.reshape(n, group, c // group * hxw)
    xhat = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    bshape = (1, c) + (1,) * (x.ndim - 2)
    w = _f(weight).reshape(bshape) if weight is not None else 1.0
    gxhat = (g * w).reshape(xg.shape)
    xh = xhat.reshape(xg.shape)
    gx = rstd[..., None] * (
        gxhat - jnp.mean(gxhat, -1, keepdims=True) - xh * jnp.mean(gxhat * xh, -1, keepdims=True)
    )
    red = (0,) + tuple(range(2, x.ndim))
    gw = jnp.sum(g * xhat, axis=red) if output_mask[1] else None
    gb = jnp.sum(g, axis=red) if output_mask[2] else None
    return tuple(
        o for o in (gx.reshape(x.shape) if output_mask[0] else None, gw, gb) if o is not None
    )


# --- grid_sample (PyTorch's GridSampler.h index math) --------------------------------------------
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _reflect(coord, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra, flips = jnp.fmod(coord, span), jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad_coord(coord, size, padding, align_corners):
    if padding == _BORDER:
        return jnp.clip(coord, 0, size - 1)
    if padding == _REFLECTION:
        coord = (
            _reflect(coord, 0, 2 * (size - 1))
            if align_corners
            else _reflect(coord, -1, 2 * size - 1)
        )
        return jnp.clip(coord, 0, size - 1)
    return coord


def _unnormalize(coord, size, align_corners):
    return (coord + 1) / 2 * (size - 1) if align_corners else ((coord + 1) * size - 1) / 2


def _taps(x, yi, xi):
    """x[n, :, yi, xi] for integer (N, Ho, Wo) coordinates, 0 where they fall outside x."""
    h, w = x.shape[2:]
    inside = (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
    yc, xc = jnp.clip(yi, 0, h - 1), jnp.clip(xi, 0, w - 1)
    v = jax.vmap(lambda img, y, x_: img[:, y, x_])(x, yc, xc)  # (N, C, Ho, Wo)
    return v * inside[:, None].astype(x.dtype)


@lowering(aten.grid_sampler_2d.default)
def grid_sampler_2d(x, grid, interpolation_mode, padding_mode, align_corners):
    h, w = x.shape[2:]
    gx, gy = grid[..., 0], grid[..., 1]
    if interpolation_mode == _BICUBIC:  # padding applies to each of the 4x4 taps
        ix, iy = _unnormalize(gx, w, align_corners), _unnormalize(gy, h, align_corners)
        x0, y0 = jnp.floor(ix), jnp.floor(iy)
        wx, wy = _cubic_weights(ix - x0), _cubic_weights(iy - y0)
        out = 0
        for i in range(4):
            yy = _pad_coord(y0 - 1 + i, h, padding_mode, align_corners).astype(jnp.int32)
            row = 0
            for j in range(4):
                xx = _pad_coord(x0 - 1 + j, w, padding_mode, align_corners).astype(jnp.int32)
                row = row + _taps(x, yy, xx) * wx[j][:, None]
            out = out + row * wy[i][:, None]
        return out
    ix = _pad_coord(_unnormalize(gx, w, align_corners), w, padding_mode, align_corners)
    iy = _pad_coord(_unnormalize(gy, h, align_corners), h, padding_mode, align_corners)
    if interpolation_mode == _NEAREST:
        return _taps(x, jnp.round(iy).astype(jnp.int32), jnp.round(ix).astype(jnp.int32))
    x0, y0 = jnp.floor(ix), jnp.floor(iy)
    tx, ty = (ix - x0)[:, None], (iy - y0)[:, None]
    x0i, y0i = x0.astype(jnp.int32), y0.astype(jnp.int32)
    return (
        _taps(x, y0i, x0i) * (1 - tx) * (1 - ty)
        + _taps(x, y0i, x0i + 1) * tx * (1 - ty)
        + _taps(x, y0i + 1, x0i) * (1 - tx) * ty
        + _taps(x, y0i + 1, x0i + 1) * tx * ty
    )


@lowering(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(
    grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask
):
    out, vjp = jax.vjp(
        lambda x_, g_: grid_sampler_2d(x_, g_, interpolation_mode, padding_mode, align_corners),
        x,
        grid,
    )
    gx, gg = vjp(grad.astype(out.dtype))
    return (gx, gg) if output_mask[0] else (gg,)  # masked-out outputs take no slot


# --- antialiased resampling (PyTorch's _compute_weights_aa): a static weight matrix per axis ------


def _aa_scale(n_in, n_out, align_corners, scale):
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n_in / n_out


def _aa_weights(n_in, n_out, align_corners, scale, interp_size, filter_fn):
    """(n_out, n_in) matrix: row i holds the normalized filter taps of output i."""
    s = _aa_scale(n_in, n_out, align_corners, scale)
    support = interp_size * 0.5 * s if s >= 1.0 else interp_size * 0.5
    inv = 1.0 / s if s >= 1.0 else 1.0
    w = np.zeros((n_out, n_in))
    for i in range(n_out):
        center = s * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        taps = np.array([filter_fn((j - center + 0.5) * inv) for j in range(lo, hi)])
        total = taps.sum()
        w[i, lo:hi] = taps / total if total != 0 else taps
    return w


def _triangle(x):
    return max(0.0, 1.0 - abs(x))


def _cubic_aa(x, a=-0.5):  # antialiasing uses A = -0.5
    x = abs(x)
    return _cubic_near(x, a) if x < 1 else _cubic_far(x, a) if x < 2 else 0.0


def _resample_aa(x, size, align_corners, scales_h, scales_w, interp_size, filter_fn):
    (h, w), (oh, ow) = x.shape[-2:], tuple(size)
    wh = _aa_weights(h, oh, align_corners, scales_h, interp_size, filter_fn)
    ww = _aa_weights(w, ow, align_corners, scales_w, interp_size, filter_fn)
    dt = x.dtype
    if _is_int(x):  # Note [Resampling uint8]
        hi = lax.Precision.HIGHEST
        passes = (  # by output dim: height, then width (`_int_passes` runs width first)
            lambda y: jnp.einsum("oh,nchw->ncow", wh.astype(jnp.float32), y, precision=hi),
            lambda y: jnp.einsum("nchw,pw->nchp", y, ww.astype(jnp.float32), precision=hi),
        )
        return _int_passes(x, size, lambda y, ax, k: passes[k](y))
    return jnp.einsum(
        "oh,nchw,pw->ncop", wh.astype(dt), x, ww.astype(dt), precision=lax.Precision.HIGHEST
    )


@lowering(aten._upsample_bilinear2d_aa.default)
def upsample_bilinear2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _resample_aa(x, output_size, align_corners, scales_h, scales_w, 2, _triangle)


@lowering(aten._upsample_bicubic2d_aa.default)
def upsample_bicubic2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _resample_aa(x, output_size, align_corners, scales_h, scales_w, 4, _cubic_aa)


def _aa_backward(grad, output_size, input_size, align_corners, sh, sw, interp_size, filter_fn):
    x = jnp.zeros(tuple(input_size), grad.dtype)
    _, vjp = jax.vjp(
        lambda v: _resample_aa(v, output_size, align_corners, sh, sw, interp_size, filter_fn), x
    )
    return vjp(grad)[0]


@lowering(aten._upsample_bilinear2d_aa_backward.default)
def upsample_bilinear2d_aa_backward(
    grad, output_size, input_size, align_corners, scales_h=None, scales_w=None
):
    return _aa_backward(
        grad, output_size, input_size, align_corners, scales_h, scales_w, 2, _triangle
    )


@lowering(aten._upsample_bicubic2d_aa_backward.default)
def upsample_bicubic2d_aa_backward(
    grad, output_size, input_size, align_corners, scales_h=None, scales_w=None
):
    return _aa_backward(
        grad, output_size, input_size, align_corners, scales_h, scales_w, 4, _cubic_aa
    )
