"""Matrix products."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .registry import is_const, lowering

aten = torch.ops.aten
_HIGHEST = lax.Precision.HIGHEST


@lowering(aten.mm.default)
def mm(a, b):
    return jnp.matmul(a, b, precision=_HIGHEST)


@lowering(aten.bmm.default)
def bmm(a, b):
    return jnp.matmul(a, b, precision=_HIGHEST)


@lowering(aten.addmm.default, aten.baddbmm.default)
def addmm(bias, a, b, beta=1, alpha=1):
    out = jnp.matmul(a, b, precision=_HIGHEST)
    if not is_const(alpha, 1):
        out = out * alpha
    return out + (bias if is_const(beta, 1) else bias * beta) if not is_const(beta, 0) else out


@lowering(aten.addbmm.default)
def addbmm(bias, a, b, beta=1, alpha=1):
    out = jnp.sum(jnp.matmul(a, b, precision=_HIGHEST), axis=0) * alpha
    return out + bias * beta if not is_const(beta, 0) else out


@lowering(aten.dot.default, aten.vdot.default)
def dot(a, b):
    return jnp.dot(a, b, precision=_HIGHEST)


@lowering(aten.mv.default)
def mv(a, b):
    return jnp.matmul(a, b, precision=_HIGHEST)
