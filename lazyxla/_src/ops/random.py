"""Random ops. Each gets `key`: (seed, counter) lifted inputs, see random_state.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .registry import lowering

aten = torch.ops.aten


def _key(key):
    seed, offset = key
    return jax.random.fold_in(jax.random.key(seed.astype(jnp.uint32)), offset.astype(jnp.uint32))


def _float(dtype):
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32


@lowering(aten.uniform.default, aten.uniform_.default, random=True)
def uniform(x, from_=0.0, to=1.0, *, key):
    u = jax.random.uniform(_key(key), x.shape, _float(x.dtype))
    return (u * (to - from_) + from_).astype(x.dtype)


@lowering(aten.normal_.default, random=True)
def normal_(x, mean=0.0, std=1.0, *, key):
    return (jax.random.normal(_key(key), x.shape, _float(x.dtype)) * std + mean).astype(x.dtype)


@lowering(getattr(aten.random_, "from"), random=True)
def random_from(x, from_, to=None, *, key):
    hi = to if to is not None else 2**63 - 1
    return jax.random.randint(_key(key), x.shape, from_, hi, jnp.int64).astype(x.dtype)


@lowering(aten.random_.to, random=True)
def random_to(x, to, *, key):
    return jax.random.randint(_key(key), x.shape, 0, to, jnp.int64).astype(x.dtype)


@lowering(aten.random_.default, random=True)
def random_(x, *, key):
    """`x.random_()`: eager's full ranges, inclusive: 0 or 1 for bool, [0, max] for an integer
    dtype, [0, 2**digits] for a floating one (every integer in it representable: 2**24 for
    float32, 2**8 for bfloat16), as ATen's uniform_int transformation gives them."""
    dt = x.dtype
    if dt == jnp.int64:  # [0, 2**63 - 1]: the top bit of 64 random ones dropped
        return (jax.random.bits(_key(key), x.shape, jnp.uint64) >> 1).astype(dt)
    if dt == jnp.bool_:
        hi = 1
    elif jnp.issubdtype(dt, jnp.floating):
        hi = 2 ** (jnp.finfo(dt).nmant + 1)  # (nmant + 1: the digits, with the implicit bit)
    else:
        hi = int(jnp.iinfo(dt).max)
    return jax.random.randint(_key(key), x.shape, 0, hi + 1, jnp.int64).astype(dt)


@lowering(aten.bernoulli.p, aten.bernoulli_.float, random=True)
def bernoulli_p(x, p=0.5, *, key):
    return jax.random.bernoulli(_key(key), p, x.shape).astype(x.dtype)


@lowering(aten.bernoulli.default, random=True)
def bernoulli(x, *, key):
    return jax.random.bernoulli(_key(key), x, x.shape).astype(x.dtype)


@lowering(aten.bernoulli_.Tensor, random=True)
def bernoulli_tensor_(x, p, *, key):
    """`x.bernoulli_(p)`: p broadcast to x's shape; 0/1 draws in x's dtype (an integer x too)."""
    p = jnp.broadcast_to(
        jnp.asarray(p, jnp.float32 if x.dtype != jnp.float64 else x.dtype), x.shape
    )
    return jax.random.bernoulli(_key(key), p, x.shape).astype(x.dtype)


@lowering(aten.exponential_.default, random=True)
def exponential_(x, lambd=1.0, *, key):
    return (jax.random.exponential(_key(key), x.shape, _float(x.dtype)) / lambd).astype(x.dtype)


@lowering(aten.native_dropout.default, random=True)
def native_dropout(x, p, train, *, key):
    # `train=None` means training, as in ATen (only an explicit False skips the dropout)
    if train is False or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(_key(key), 1.0 - p, x.shape)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)  # ATen's scale: p == 1 drops everything
    return jnp.where(keep, x * scale, 0).astype(x.dtype), keep


@lowering(aten.native_dropout_backward.default)
def native_dropout_backward(grad, mask, scale):
    return grad * mask.astype(grad.dtype) * scale


@lowering(aten.randperm.default, random=True)
def randperm(n, dtype=None, layout=None, device=None, pin_memory=None, *, key):
    return jax.random.permutation(_key(key), n)


@lowering(aten.cauchy_.default, random=True)
def cauchy_(x, median=0.0, sigma=1.0, *, key):
    u = jax.random.uniform(_key(key), x.shape, _float(x.dtype))
    return (median + sigma * jnp.tan(jnp.pi * (u - 0.5))).astype(x.dtype)


@lowering(aten.log_normal_.default, random=True)
def log_normal_(x, mean=1.0, std=2.0, *, key):
    z = jax.random.normal(_key(key), x.shape, _float(x.dtype))
    return jnp.exp(mean + std * z).astype(x.dtype)


@lowering(aten.geometric_.default, random=True)
def geometric_(x, p, *, key):
    """The number of Bernoulli(p) trials up to the first success: ceil(log(u) / log(1 - p))."""
    u = jax.random.uniform(_key(key), x.shape, jnp.float32, minval=jnp.finfo(jnp.float32).tiny)
    return jnp.maximum(jnp.ceil(jnp.log(u) / jnp.log1p(-p)), 1).astype(x.dtype)


@lowering(
    aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, random=True
)
def normal(mean, std=1.0, *, key):
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    dt = jnp.result_type(mean, std)
    return mean + std * jax.random.normal(_key(key), shape, _float(dt))


@lowering(aten.multinomial.default, random=True)
def multinomial(probs, num_samples, replacement=False, *, key):
    """Draws by category weight; without replacement, the Gumbel top-k trick (exact for
    sequential draws without replacement); zero-weight categories are never drawn."""
    logits = jnp.log(probs.astype(jnp.float32))
    k = _key(key)
    if replacement:
        draws = jax.random.categorical(k, logits, axis=-1, shape=(num_samples,) + probs.shape[:-1])
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int64)
    g = jax.random.gumbel(k, probs.shape, jnp.float32)
    return lax.top_k(logits + g, num_samples)[1].astype(jnp.int64)
