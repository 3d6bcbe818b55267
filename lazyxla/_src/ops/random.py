"""Random ops. Each gets `key`: (seed, counter) lifted inputs, see random_state.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

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


@lowering(aten.bernoulli.p, aten.bernoulli_.float, random=True)
def bernoulli_p(x, p=0.5, *, key):
    return jax.random.bernoulli(_key(key), p, x.shape).astype(x.dtype)


@lowering(aten.bernoulli.default, random=True)
def bernoulli(x, *, key):
    return jax.random.bernoulli(_key(key), x, x.shape).astype(x.dtype)


@lowering(aten.exponential_.default, random=True)
def exponential_(x, lambd=1.0, *, key):
    return (jax.random.exponential(_key(key), x.shape, _float(x.dtype)) / lambd).astype(x.dtype)


@lowering(aten.native_dropout.default, random=True)
def native_dropout(x, p, train, *, key):
    if not train or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(_key(key), 1.0 - p, x.shape)
    return jnp.where(keep, x / (1.0 - p), 0).astype(x.dtype), keep


@lowering(aten.native_dropout_backward.default)
def native_dropout_backward(grad, mask, scale):
    return grad * mask.astype(grad.dtype) * scale


@lowering(aten.randperm.default, random=True)
def randperm(n, dtype=None, layout=None, device=None, pin_memory=None, *, key):
    return jax.random.permutation(_key(key), n)
