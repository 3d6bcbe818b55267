"""Activation functions and their backward kernels: log_sigmoid, the shrinks, hard sigmoid/swish,
logit, glu and prelu (the common activations are in nn.py and elementwise.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .elementwise import _true_divide, logit_steps
from .registry import axis_of, float_operand, lowering

aten = torch.ops.aten


@lowering(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(x):
    x = float_operand(x)
    # eager CPU's formula and buffer: log_sigmoid(1e5) is its +0.0 (jax's -softplus(-x) is -0.0)
    buffer = jnp.exp(-jnp.abs(x))
    return jnp.minimum(x, 0) - jnp.log1p(buffer), buffer


@lowering(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad, x, buffer):
    return float_operand(grad) * jax.nn.sigmoid(-float_operand(x))


@lowering(aten.mish_backward.default)
def mish_backward(grad, x):
    # Eager CPU's kernel, in float32 (Note [Opmath]). Without a lowering, PrivateUse1 gets the op's
    # CompositeImplicitAutograd formula, which rounds each intermediate to bf16/fp16.
    t = jnp.tanh(jax.nn.softplus(x))
    return grad * (t + x * jax.nn.sigmoid(x) * (1 - t * t))


@lowering(aten.hardshrink.default)
def hardshrink(x, lambd=0.5):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros_like(x), x)


@lowering(aten.hardshrink_backward.default)
def hardshrink_backward(grad, x, lambd):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros_like(grad), grad)


@lowering(aten.softshrink.default)
def softshrink(x, lambd=0.5):
    out = jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, jnp.zeros_like(x)))
    return jnp.where(jnp.isnan(x), x, out)  # (NaN is in neither tail: eager gives NaN)


@lowering(aten.softshrink_backward.default)
def softshrink_backward(grad, x, lambd):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros_like(grad), grad)


@lowering(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad, x):
    return jnp.where((x > -3) & (x < 3), grad / 6, jnp.zeros_like(grad))


@lowering(aten.hardswish_backward.default)
def hardswish_backward(grad, x):
    # Eager's kernel: 0 up to -3 included, grad from 3 included (the one-sided derivatives PyTorch
    # picked at the kinks), x / 3 correctly rounded (Note [Broadcast divisors]).
    mid = grad * (_true_divide(x, 3) + 0.5)
    return jnp.where(x <= -3, jnp.zeros_like(grad), jnp.where(x < 3, mid, grad))


@lowering(aten.logit_backward.default, opmath=False)
def logit_backward(grad, x, eps=None):
    x, r, bounds = logit_steps(x, eps)  # eager's per-step rounding (elementwise.logit_steps)
    g = grad.astype(x.dtype) / r(x * r(1 - x))
    if bounds is None:
        return jnp.where((x < 0) | (x > 1), jnp.nan, g)
    return jnp.where((x < bounds[0]) | (x > bounds[1]), jnp.zeros_like(g), g)


@lowering(aten.glu.default)
def glu(x, dim=-1):
    a, b = jnp.split(x, 2, axis=axis_of(x, dim))
    return a * jax.nn.sigmoid(float_operand(b)).astype(x.dtype)


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
