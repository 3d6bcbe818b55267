"""Factories and dtype conversion."""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

from ..runtime import jnp_dtype
from .registry import bool_to, lowering

aten = torch.ops.aten


def convert_rule(x: Any, dtype: torch.dtype) -> Any:
    dt = jnp_dtype(dtype)
    via = _FLOAT_TO_INT_VIA.get(dt)
    if via is not None and jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.real(x)  # eager discards the imaginary part (with a warning), then converts
    if via is not None and jnp.issubdtype(x.dtype, jnp.floating):
        return _float_to_int(x, dt, via)
    return bool_to(x, dt)


# Note [Float to integer conversion]
# C++ leaves a float -> int cast of a value out of the integer's range (or NaN) undefined; eager
# on x86 computes it with the CPU's truncating conversion, whose out-of-range result is the
# "integer indefinite" value (INT_MIN of 32 or 64 bits), then keeps the low bits for a narrower
# type: int8/int16/int32 go through 32 bits (300.0 -> int8 44, 1e10 -> int32 -2147483648, NaN ->
# 0 as int16), uint8 through 64 bits (-3.7 -> 253, 256.0 -> 0), int64 directly. The same holds
# for every size (vectorized or not) and every x86 CPU. XLA's conversion saturates instead (1e10
# -> 2147483647, -3.7 -> uint8 0, NaN -> 0), which would silently differ from eager in programs
# such as `(x * 255).to(torch.uint8)`, so a float -> int conversion is lowered as eager's: in-range
# values truncate (the same in both), the others become the indefinite value, then wrap. A complex
# value converts its real part so (eager discards the imaginary part: -3.7+1j -> uint8 253).
_FLOAT_TO_INT_VIA = {
    jnp.dtype(jnp.int8): jnp.dtype(jnp.int32),
    jnp.dtype(jnp.int16): jnp.dtype(jnp.int32),
    jnp.dtype(jnp.int32): jnp.dtype(jnp.int32),
    jnp.dtype(jnp.uint8): jnp.dtype(jnp.int64),
    jnp.dtype(jnp.int64): jnp.dtype(jnp.int64),
}


def _float_to_int(x: Any, dt: Any, via: Any) -> Any:
    """Eager's x86 float -> int conversion; see Note [Float to integer conversion]."""
    if x.dtype not in (jnp.float32, jnp.float64):
        x = x.astype(jnp.float32)  # (exact for every 16-bit float)
    bits = jnp.iinfo(via).bits - 1
    # In range: -2**bits <= x < 2**bits (NaN compares false). What lies between -2**bits - 1 and
    # -2**bits truncates to -2**bits, the indefinite value itself.
    fits = (x >= -(2.0**bits)) & (x < 2.0**bits)
    i = jnp.where(fits, x, 0).astype(via)
    i = jnp.where(fits, i, jnp.iinfo(via).min)
    return i if via == dt else i.astype(dt)


def expand_rule(x: Any, size: tuple[int, ...], implicit: bool = False) -> Any:
    size = tuple(s if s != -1 else x.shape[i - (len(size) - x.ndim)] for i, s in enumerate(size))
    return jnp.broadcast_to(x, size)


def _dt(dtype: torch.dtype | None) -> Any:
    return jnp_dtype(dtype if dtype is not None else torch.get_default_dtype())


@lowering(aten.empty.memory_format)
def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(size, _dt(dtype))


@lowering(aten.empty_strided.default)
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, _dt(dtype))


@lowering(aten.full.default)
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(size, fill_value, _dt(dtype))


@lowering(aten.zeros.default)
def zeros(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, _dt(dtype))


@lowering(aten.ones.default)
def ones(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(size, _dt(dtype))


@lowering(aten.scalar_tensor.default)
def scalar_tensor(s, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s, _dt(dtype))


@lowering(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    return jnp.full(x.shape, value, x.dtype)


@lowering(aten.zero.default)
def zero(x):
    return jnp.zeros_like(x)


@lowering(aten.clone.default)
def clone(x, memory_format=None):
    return x


@lowering(aten.copy.default)
def copy(x, src, non_blocking=False):
    return jnp.broadcast_to(src.astype(x.dtype), x.shape)


@lowering(aten.lift_fresh_copy.default)
def lift_fresh_copy(x):
    return x


@lowering(aten.full_like.default)
def full_like(
    x, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    return jnp.full(x.shape, fill_value, jnp_dtype(dtype) if dtype is not None else x.dtype)


@lowering(aten.zeros_like.default)
def zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, jnp_dtype(dtype) if dtype is not None else x.dtype)


@lowering(aten.ones_like.default)
def ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(x.shape, jnp_dtype(dtype) if dtype is not None else x.dtype)


@lowering(aten.empty_like.default)
def empty_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, jnp_dtype(dtype) if dtype is not None else x.dtype)


@lowering(aten.arange.start_step, static=("start", "end", "step"))
def arange(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is not None and not dtype.is_floating_point and not dtype.is_complex:
        # Eager's integer arange: values from the truncated start and step; its length from the
        # truncated bounds for int64, but from the bounds as given (in double) for the narrower
        # integer dtypes: arange(0., -8.000001, -4., dtype=uint8) has 3 elements, int64's 2.
        n = None
        if dtype != torch.int64:
            n = max(0, math.ceil((float(end) - float(start)) / float(step)))
        start, end, step = int(start), int(end), int(step)
        if n is not None:
            return (start + jnp.arange(n, dtype=jnp.int64) * step).astype(_dt(dtype))
    return jnp.arange(start, end, step, dtype=_dt(dtype) if dtype is not None else None)


@lowering(aten.arange.default, static=("end",))
def arange_end(end, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(0, end, 1, dtype)


@lowering(aten.arange.start, static=("start", "end"))
def arange_start(start, end, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(start, end, 1, dtype)


@lowering(aten.linspace.default, static=("start", "end"))
def linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    dt = _dt(dtype)
    if jnp.issubdtype(dt, jnp.integer):  # eager: integer bounds, a float64 step, truncation
        return eager_linspace(int(start), int(end), steps, jnp.float64).astype(dt)
    acc = jnp.float32 if dt in (jnp.bfloat16, jnp.float16) else dt  # rounded once
    return eager_linspace(start, end, steps, acc).astype(dt)


def eager_linspace(start, end, steps, acc):
    """Eager's formula: start + i * step for the first half, end - (steps - 1 - i) * step for
    the second (so both ends are exact), in dtype `acc`."""
    if steps <= 1:
        return jnp.full((steps,), start, acc)
    i = jnp.arange(steps, dtype=acc)
    step = jnp.asarray((end - start) / (steps - 1), acc)
    return jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))


@lowering(aten.eye.default)
def eye(n, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, dtype=_dt(dtype))


@lowering(aten.eye.m)
def eye_m(n, m, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, m, dtype=_dt(dtype))


@lowering(aten.logspace.default, static=("start", "end"))
def logspace(
    start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None
):
    dt = jnp_dtype(dtype if dtype is not None else torch.get_default_dtype())
    if jnp.issubdtype(dt, jnp.integer):  # eager: integer bounds, float64 exponents
        exps = eager_linspace(int(start), int(end), steps, jnp.float64)
        return jnp.power(float(base), exps).astype(dt)
    acc = jnp.float32 if dt in (jnp.bfloat16, jnp.float16) else dt  # rounded once
    return jnp.power(jnp.asarray(base, acc), eager_linspace(start, end, steps, acc)).astype(dt)


def _tri_indices(row, col, offset, lower):
    r, c = np.indices((row, col))
    keep = (c - r <= offset) if lower else (c - r >= offset)
    return np.stack([r[keep], c[keep]])


@lowering(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(_tri_indices(row, col, offset, False), jnp.int64)


@lowering(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(_tri_indices(row, col, offset, True), jnp.int64)
