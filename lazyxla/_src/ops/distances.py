"""Pairwise distances: `cdist` and `pdist` with their backward kernels (eager's p-norm special
cases at p = 0, 1, 2 and inf)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from .registry import lowering

aten = torch.ops.aten


def _pnorm(d, p, axis):
    if p == 0:
        return jnp.sum((d != 0).astype(d.dtype), axis=axis)
    if p == float("inf"):
        return jnp.max(d, axis=axis)
    if p == 1:
        return jnp.sum(d, axis=axis)
    if p == 2:
        return jnp.sqrt(jnp.sum(d * d, axis=axis))
    return jnp.sum(d**p, axis=axis) ** (1.0 / p)


@lowering(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    d = jnp.abs(x1[..., :, None, :] - x2[..., None, :, :])
    return _pnorm(d, p, -1)


@lowering(aten._pdist_forward.default)
def pdist_forward(x, p=2.0):
    n = x.shape[0]
    i, j = np.triu_indices(n, 1)
    d = jnp.abs(x[i] - x[j])
    return _pnorm(d, p, -1)


def _pnorm_grad(diff, dist, p):
    """d dist / d diff for dist = ||diff||_p over the last axis (eager's _cdist_backward formula:
    0 where the distance is 0)."""
    dist = dist[..., None]
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return jnp.sign(diff)
    if p == float("inf"):
        return jnp.sign(diff) * (jnp.abs(diff) == dist)
    safe = jnp.where(dist == 0, 1.0, dist)
    if p == 2:
        g = diff / safe
    else:
        g = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1)
    return jnp.where(dist == 0, 0.0, g)


@lowering(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, cdist):
    if 0 in x1.shape or 0 in x2.shape or 0 in grad.shape:
        return jnp.zeros_like(x1)  # eager: x1's own shape when anything is empty
    diff = x1[..., :, None, :] - x2[..., None, :, :]  # else x1 broadcast to the batch shape
    return jnp.sum(grad[..., None] * _pnorm_grad(diff, cdist, p), axis=-2)


@lowering(aten._pdist_backward.default)
def pdist_backward(grad, x, p, pdist):
    i, j = np.triu_indices(x.shape[0], 1)
    g = grad[:, None] * _pnorm_grad(x[i] - x[j], pdist, p)
    return jnp.zeros_like(x).at[i].add(g).at[j].add(-g)
