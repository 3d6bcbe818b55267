"""Losses: their forward rules, and backwards as the vjp of the forward where eager's formula is
the plain derivative."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .elementwise import _true_divide
from .registry import lowering

aten = torch.ops.aten


def _reduce(loss, reduction):
    if reduction == 0:
        return loss
    return jnp.mean(loss) if reduction == 1 else jnp.sum(loss)


@lowering(aten.smooth_l1_loss.default)
def smooth_l1_loss(x, y, reduction=1, beta=1.0):
    d = jnp.abs(x - y)
    if beta == 0:
        return _reduce(d, reduction)
    # ((0.5 * d) * d) / beta as eager, the division a division (Note [Broadcast divisors])
    quadratic = _true_divide(0.5 * d * d, jnp.asarray(beta, d.dtype))
    return _reduce(jnp.where(d < beta, quadratic, d - 0.5 * beta), reduction)


@lowering(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad, x, y, reduction, beta):
    return jax.vjp(lambda v: smooth_l1_loss(v, y, reduction, beta), x)[1](grad)[0]


@lowering(aten.huber_loss.default)
def huber_loss(x, y, reduction=1, delta=1.0):
    d = jnp.abs(x - y)
    return _reduce(jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


@lowering(aten.huber_loss_backward.default)
def huber_loss_backward(grad, x, y, reduction, delta):
    return jax.vjp(lambda v: huber_loss(v, y, reduction, delta), x)[1](grad)[0]


@lowering(aten.binary_cross_entropy.default)
def binary_cross_entropy(x, y, weight=None, reduction=1):
    lx = jnp.maximum(jnp.log(x), -100)
    l1x = jnp.maximum(jnp.log1p(-x), -100)
    loss = -(y * lx + (1 - y) * l1x)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@lowering(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad, x, y, weight=None, reduction=1):
    eps = 1e-12
    g = grad * (x - y) / jnp.maximum((1 - x) * x, eps)
    if weight is not None:
        g = g * weight
    return g / x.size if reduction == 1 else g


@lowering(aten.multi_margin_loss.default, static=("p",))  # 1 or 2: picks the formula
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=1):
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    t = target.reshape(-1)
    xt = jnp.take_along_axis(x2, t[:, None], axis=1)
    z = jnp.maximum(margin - xt + x2, 0)
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * weight[t][:, None]
    onehot = jnp.arange(x2.shape[1])[None, :] == t[:, None]
    z = jnp.where(onehot, 0, z)
    loss = jnp.sum(z, axis=1) / x2.shape[1]
    if reduction == 0:
        return loss.reshape(target.shape) if x.ndim > 1 else loss.reshape(())
    return _reduce(loss, reduction)


@lowering(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(x, target, reduction):
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    t2 = target.reshape(x2.shape)
    c = x2.shape[1]
    # targets are read up to the first -1
    valid = jnp.cumprod(t2 >= 0, axis=1).astype(bool)
    tt = jnp.where(valid, t2, 0)
    is_target = jnp.zeros(x2.shape, x.dtype)
    is_target = jax.vmap(lambda it, t, v: it.at[t].max(v.astype(x.dtype)))(is_target, tt, valid)
    xt = jnp.take_along_axis(x2, tt, axis=1)  # (N, C) value at each listed target
    z = jnp.maximum(1 - xt[:, :, None] + x2[:, None, :], 0)  # (N, T, C)
    mask = valid[:, :, None] & (is_target[:, None, :] == 0)
    loss = jnp.sum(jnp.where(mask, z, 0), axis=(1, 2)) / c
    if reduction == 0:
        loss = loss.reshape(x.shape[:-1]) if x.ndim > 1 else loss.reshape(())
    else:
        loss = _reduce(loss, reduction)
    return loss, is_target.reshape(target.shape)


@lowering(aten.soft_margin_loss.default)
def soft_margin_loss(x, y, reduction=1):
    return _reduce(jnp.log1p(jnp.exp(-y * x)), reduction)


@lowering(aten.soft_margin_loss_backward.default)
def soft_margin_loss_backward(grad, x, y, reduction):
    return jax.vjp(lambda v: soft_margin_loss(v, y, reduction), x)[1](grad)[0]


@lowering(aten.multi_margin_loss_backward.default, static=("p",))
def multi_margin_loss_backward(grad, x, target, p, margin, weight=None, reduction=1):
    out, vjp = jax.vjp(lambda v: multi_margin_loss(v, target, p, margin, weight, reduction), x)
    return vjp(grad.astype(out.dtype).reshape(out.shape))[0]


@lowering(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad, x, target, reduction, is_target):
    _, vjp = jax.vjp(lambda v: multilabel_margin_loss_forward(v, target, reduction)[0], x)
    return vjp(grad.astype(x.dtype))[0]
