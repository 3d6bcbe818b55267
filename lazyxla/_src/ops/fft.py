"""The FFT primitives PyTorch's torch.fft functions decompose to (`_fft_r2c`, `_fft_c2c`,
`_fft_c2r`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from .registry import lowering, wrap_dim

aten = torch.ops.aten


def _fft_scale(y, n, normalization):
    if normalization == 1:
        return y / np.sqrt(n).astype(np.float32)
    if normalization == 2:
        return y / n
    return y


@lowering(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    axes = tuple(wrap_dim(d, x.ndim) for d in dim)
    n = int(np.prod([x.shape[a] for a in axes]))
    y = jnp.fft.rfftn(x, axes=axes) if onesided else jnp.fft.fftn(x, axes=axes)
    return _fft_scale(y, n, normalization)


@lowering(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    axes = tuple(wrap_dim(d, x.ndim) for d in dim)
    n = int(np.prod([x.shape[a] for a in axes]))
    if not axes:
        return x
    y = jnp.fft.fftn(x, axes=axes) if forward else jnp.fft.ifftn(x, axes=axes) * n
    return _fft_scale(y, n, normalization)


@lowering(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    axes = tuple(wrap_dim(d, x.ndim) for d in dim)
    s = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    n = int(np.prod(s))
    y = jnp.fft.irfftn(x, s=s, axes=axes) * n
    return _fft_scale(y, n, normalization)
