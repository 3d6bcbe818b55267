"""Elementwise math, comparisons and activations (and their backward formulas)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..meta import META_RULES
from . import libm
from .registry import (
    bool_to,
    float_operand,
    floating_result,
    is_const,
    lowering,
    out_dtype,
    register,
    to_opmath,
)

aten = torch.ops.aten


# Ops PyTorch implements as CompositeImplicitAutograd (square, positive, isfinite, outer) have no
# lowering on purpose: a PrivateUse1 kernel would replace their decomposition *and* their autograd
# formula, leaving them without a gradient.
def digamma(x):
    """digamma with eager's poles: -inf at +0, +inf at -0 (jax gives nan)."""
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), jax.scipy.special.digamma(x))


_UNARY = {
    aten.abs.default: jnp.abs,
    aten.neg.default: jnp.negative,
    aten.exp.default: jnp.exp,
    aten.exp2.default: libm.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.log1p.default: libm.log1p,
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: libm.atanh,
    aten.sigmoid.default: jax.nn.sigmoid,
    aten.erf.default: jax.scipy.special.erf,
    aten.reciprocal.default: jnp.reciprocal,
    aten.sign.default: lambda x: _sign(x),
    aten.sgn.default: lambda x: _sign(x),
    aten.floor.default: jnp.floor,
    aten.ceil.default: jnp.ceil,
    aten.round.default: jnp.round,
    aten.trunc.default: jnp.trunc,
    aten.frac.default: lambda x: x - jnp.trunc(x),
    aten.relu.default: lambda x: jnp.where(x < 0, jnp.zeros_like(x), x),  # relu(-0.0) is -0.0
    aten.silu.default: jax.nn.silu,
    aten.mish.default: jax.nn.mish,
    aten.logical_not.default: jnp.logical_not,
    aten.bitwise_not.default: lambda x: jnp.logical_not(x) if x.dtype == bool else ~x,
    aten.isnan.default: jnp.isnan,
    aten.isinf.default: jnp.isinf,
    aten.lgamma.default: libm.lgamma,
    aten.digamma.default: digamma,
    aten.signbit.default: jnp.signbit,
    aten.deg2rad.default: jnp.deg2rad,
    aten.rad2deg.default: jnp.rad2deg,
    aten.i0.default: jax.scipy.special.i0,
}


def _multiply(x, y):
    """`x * y`, a bool operand converted as eager's promotion does (Note [Booleans times a
    value])."""
    x, y = jnp.asarray(x), jnp.asarray(y)
    if (x.dtype == jnp.bool_) != (y.dtype == jnp.bool_):
        dt = jnp.result_type(x, y)
        x, y = bool_to(x, dt), bool_to(y, dt)
    return jnp.multiply(x, y)


# Note [fmax and fmin at a tie]
# Eager's float16/32/64 fmax/fmin (scalar and vectorized kernels alike) keep their first operand
# when the two compare equal: fmax(0.0, -0.0) is 0.0 and fmax(-0.0, 0.0) is -0.0; its bfloat16
# kernel, like jnp's, keeps the second. A NaN operand gives the other, as in both. The rules see
# the operands' own dtype (no opmath: a selection rounds nothing). (maximum/minimum and clamp with
# tensor bounds are not pinned: eager's scalar kernel keeps the first operand at a tie and its
# vectorized one the second, so eager's own result depends on the tensor's length.)
def _nan_ignoring(x, y, second_wins, jnp_fn):
    """fmax/fmin: `y` where it is a number and `x` is NaN or loses to it, else `x`."""
    if jnp.result_type(x, y) not in (jnp.float16, jnp.float32, jnp.float64):
        return jnp_fn(x, y)
    return jnp.where(~jnp.isnan(y) & (jnp.isnan(x) | second_wins(y, x)), y, x)


def _fmax(x, y):
    return _nan_ignoring(x, y, jnp.greater, jnp.fmax)


def _fmin(x, y):
    return _nan_ignoring(x, y, jnp.less, jnp.fmin)


_BINARY = {
    aten.mul.Tensor: _multiply,
    aten.mul.Scalar: _multiply,
    aten.maximum.default: jnp.maximum,
    aten.minimum.default: jnp.minimum,
    aten.eq.Tensor: jnp.equal,
    aten.eq.Scalar: jnp.equal,
    aten.ne.Tensor: jnp.not_equal,
    aten.ne.Scalar: jnp.not_equal,
    aten.lt.Tensor: jnp.less,
    aten.lt.Scalar: jnp.less,
    aten.le.Tensor: jnp.less_equal,
    aten.le.Scalar: jnp.less_equal,
    aten.gt.Tensor: jnp.greater,
    aten.gt.Scalar: jnp.greater,
    aten.ge.Tensor: jnp.greater_equal,
    aten.ge.Scalar: jnp.greater_equal,
    aten.logical_and.default: jnp.logical_and,
    aten.logical_or.default: jnp.logical_or,
    aten.logical_xor.default: jnp.logical_xor,
    aten.bitwise_and.Tensor: jnp.bitwise_and,
    aten.bitwise_and.Scalar: jnp.bitwise_and,
    aten.bitwise_or.Tensor: jnp.bitwise_or,
    aten.bitwise_or.Scalar: jnp.bitwise_or,
    aten.bitwise_xor.Tensor: jnp.bitwise_xor,
    aten.bitwise_xor.Scalar: jnp.bitwise_xor,
    aten.atan2.default: jnp.arctan2,
    aten.copysign.Tensor: jnp.copysign,
    aten.copysign.Scalar: jnp.copysign,
}


def _sign(x: jax.Array) -> jax.Array:
    """Eager's sign/sgn: `(0 < x) - (x < 0)` for reals, so NaN and -0.0 give +0 (jnp.sign keeps
    them); for complex `x / |x|` as a complex division (eager's inf+0j gives nan+nanj), 0 at 0."""
    if x.dtype == jnp.bool_:
        return x
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        mag = jnp.abs(x)
        quotient = x / jax.lax.complex(mag, jnp.zeros_like(mag))
        return jnp.where(mag == 0, jnp.zeros_like(x), quotient)
    one, zero = jnp.ones_like(x), jnp.zeros_like(x)
    return jnp.where(x > 0, one, zero) - jnp.where(x < 0, one, zero)


# Unary ops whose integer/bool input keeps its dtype; every other one computes an integer or bool
# input in its float result dtype, as eager does (sigmoid(int64) is float32, or float64 under
# that default dtype: Note [Integer inputs, floating results]).
_KEEPS_INT = {
    aten.abs.default,
    aten.neg.default,
    aten.sign.default,
    aten.sgn.default,
    aten.floor.default,
    aten.ceil.default,
    aten.round.default,
    aten.trunc.default,
    aten.relu.default,
    aten.logical_not.default,
    aten.bitwise_not.default,
    aten.isnan.default,
    aten.isinf.default,
    aten.signbit.default,
}


_float_in = floating_result


# Complex functions as eager's (Note [Complex functions by symmetry], libm.py): the branch-cut
# functions by their symmetry, exp and the (hyperbolic) sine and cosine by C99's formulas.
_SYMMETRY = {
    aten.sqrt.default: libm.CONJ,
    aten.log.default: libm.CONJ,
    aten.log2.default: libm.CONJ,
    aten.log10.default: libm.CONJ,
    aten.log1p.default: libm.CONJ,
    aten.expm1.default: libm.CONJ,
    aten.acos.default: libm.CONJ,
    aten.acosh.default: libm.CONJ,
    aten.tan.default: libm.ODD,
    aten.asin.default: libm.ODD,
    aten.atan.default: libm.ODD,
    aten.tanh.default: libm.ODD,
    aten.asinh.default: libm.ODD,
    aten.atanh.default: libm.ODD,
}
for _op, _sym in _SYMMETRY.items():
    _UNARY[_op] = libm.by_symmetry(_UNARY[_op], _sym)
_UNARY[aten.atanh.default] = libm.complex_atanh_nan(_UNARY[aten.atanh.default])
_UNARY[aten.exp.default] = libm.cexp
_UNARY[aten.sin.default] = libm.csin
_UNARY[aten.cos.default] = libm.ccos
_UNARY[aten.sinh.default] = libm.csinh
_UNARY[aten.cosh.default] = libm.ccosh


def _complex_atan(z, atan=_UNARY[aten.atan.default], atanh=_UNARY[aten.atanh.default]):
    """atan(z) = -i atanh(iz), as C99 defines it (XLA's atan(0.5 + 0j) has a -0 imaginary part;
    its atanh, by symmetry, agrees with C99). iz is formed exactly: (-b, a)."""
    if not jnp.issubdtype(z.dtype, jnp.complexfloating):
        return atan(z)
    w = atanh(lax.complex(-jnp.imag(z), jnp.real(z)))
    return lax.complex(jnp.imag(w), -jnp.real(w))


def _rsqrt(z, sqrt=_UNARY[aten.sqrt.default]):
    """Eager's complex rsqrt is 1 / sqrt(z) (XLA's left ~1e-8 real parts where that is -0)."""
    if not jnp.issubdtype(z.dtype, jnp.complexfloating):
        return lax.rsqrt(z)
    root = sqrt(z)
    return _true_divide(jnp.ones_like(root), root)


_UNARY[aten.atan.default] = _complex_atan
_UNARY[aten.rsqrt.default] = _rsqrt


for _op, _fn in _UNARY.items():
    register(_op, _fn if _op in _KEEPS_INT else lambda x, _fn=_fn: _fn(_float_in(x)))
for _op, _fn in _BINARY.items():
    register(_op, lambda x, y, _fn=_fn: _fn(x, y))
register(aten.fmax.default, _fmax, opmath=False)  # Note [fmax and fmin at a tie]
register(aten.fmin.default, _fmin, opmath=False)


def _pair(x, y):
    """Bring a tensor and a (possibly lifted) scalar to one dtype, as PyTorch's kernels do."""
    x, y = jnp.asarray(x), jnp.asarray(y)
    if x.dtype != y.dtype:
        dt = jnp.result_type(x, y)
        if (
            x.ndim
            and not y.ndim
            and jnp.issubdtype(x.dtype, jnp.inexact) == jnp.issubdtype(dt, jnp.inexact)
        ):
            dt = x.dtype
        x, y = bool_to(x, dt), bool_to(y, dt)
    return x, y


def xlog(x, y, log, xlog):
    """xlogy (log = jnp.log) or xlog1py (jnp.log1p) as eager computes it. In bf16/fp16 eager
    takes the log through c10's reduced-precision std::log/std::log1p (BFloat16-math.h), which
    round it to the dtype before the product is rounded again: ~1/4 of the elements differ from
    one rounding, and a kl_div built on it drifted from eager's. NaN where y is NaN, else 0 where
    x == 0 (eager's order). The rules take their inputs in their own dtypes (opmath=False)."""
    dt = jnp.result_type(x, y)
    if dt not in (jnp.bfloat16, jnp.float16):
        return xlog(*to_opmath((x, y)))
    xf, yf = (jnp.asarray(v, dt).astype(jnp.float32) for v in (x, y))
    out = jnp.where(xf == 0, 0.0, xf * log(yf).astype(dt).astype(jnp.float32))
    return jnp.where(jnp.isnan(yf), jnp.nan, out)


@lowering(aten.xlogy.Tensor, opmath=False)
def xlogy(x, y):
    return xlog(x, y, jnp.log, jax.scipy.special.xlogy)


@lowering(aten.add.Tensor, aten.add.Scalar)
def add(x, y, alpha=1):
    # (an add of a constant zero: Note [Adding a constant zero] in lower.py)
    return x + y if is_const(alpha, 1) else x + y * alpha


@lowering(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, alpha=1):
    return x - y if is_const(alpha, 1) else x - y * alpha


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(x, y, alpha=1):
    return y - x if is_const(alpha, 1) else y - x * alpha


# Note [Broadcast divisors]: XLA's algebraic simplifier rewrites a / broadcast(b) as
# a * broadcast(1 / b) (on the CPU for any b, on every backend when b is a constant). That rounds
# twice, once for 1 / b and once for the product: up to ~1 ulp instead of eager's 0.5, and biased
# the same way for every element (all of them share the one rounded reciprocal). Adam divides its
# whole sqrt(exp_avg_sq) by the Python float sqrt(1 - beta2**step) every step, so the bias
# compounds (tests/test_optim_precision.py). A float32 quotient with a broadcast divisor is
# therefore computed in float64 (XLA may still use the reciprocal there) and rounded once to
# float32: float64's error is far below the distance from any float32 quotient to a float32
# rounding boundary, so the result is the correctly rounded float32 quotient, bit for bit eager's.
# A float64 quotient divides by the broadcast divisor materialised behind an optimization barrier.


def _rewrites_divisions() -> bool:
    """XLA:CPU rewrites every broadcast divisor; GPU/TPU only constant ones, which lifted scalars
    are not (and TPUs have no float64)."""
    from ..runtime import default_device

    return default_device().platform == "cpu"


def _true_divide(x, y):
    """`x / y` for a floating result, correctly rounded (Note [Broadcast divisors])."""
    out = jnp.result_type(x, y)
    # A bool converts as a select: XLA's simplifier turns convert(p) / 0 into select(p, inf, 0)
    # where eager divides 0 by 0 (Note [Booleans times a value]).
    x, y = (bool_to(v, out) if getattr(v, "dtype", None) == jnp.bool_ else v for v in (x, y))
    if jnp.issubdtype(out, jnp.complexfloating):
        # By a zero, eager's complex division (c10::complex's, numpy's) divides each part by
        # the zero's magnitude: (1+1j)/0 is inf+infj, -2j/0 nan-infj; XLA's is NaN throughout.
        x, y = jnp.asarray(x, out), jnp.asarray(y, out)
        by_zero = lax.complex(
            jnp.real(x) / jnp.abs(jnp.real(y)), jnp.imag(x) / jnp.abs(jnp.imag(y))
        )
        return jnp.where(y == 0, by_zero, jnp.true_divide(x, y))
    shape = jnp.broadcast_shapes(jnp.shape(x), jnp.shape(y))
    if out in (jnp.float32, jnp.float64) and jnp.shape(y) != shape and _rewrites_divisions():
        if out == jnp.float32:
            wide = jnp.asarray(x, out).astype(jnp.float64) / jnp.asarray(y, out).astype(jnp.float64)
            return wide.astype(out)
        # float64 has no wider type: the divisor is broadcast behind a barrier the simplifier
        # cannot see through, so the division stays a division (a third of the quotients of
        # `f64_tensor / 0.37` were an ulp off).
        return jnp.true_divide(x, lax.optimization_barrier(jnp.broadcast_to(y, shape)))
    return jnp.true_divide(x, y)


def _div(x, y, rounding_mode=None):
    if rounding_mode is None:
        if not jnp.issubdtype(jnp.result_type(x, y), jnp.inexact):
            x = floating_result(jnp.asarray(x))
        return _true_divide(x, y)
    q = jnp.true_divide(x, y) if jnp.issubdtype(jnp.result_type(x, y), jnp.inexact) else None
    if q is None:  # integer operands, in the result's dtype (jnp divides no bools)
        dt = out_dtype() or jnp.result_type(x, y)
        x, y = jnp.asarray(x).astype(dt), jnp.asarray(y).astype(dt)
    if rounding_mode == "trunc":
        if q is None:
            return lax.div(*jnp.broadcast_arrays(*_pair(x, y)))
        return _div_trunc_float(*_pair(x, y))
    return _div_floor_float(*_pair(x, y)) if q is not None else jnp.floor_divide(x, y)


# Note [Exact quotients]: XLA rewrites a / broadcast(b) as a * broadcast(1 / b), a quotient that
# can land an ulp under an integer (5.125 / 5.125 -> 0.99999994), which trunc/floor would turn
# into the integer below. Eager's trunc division is `trunc(a / b)` of the correctly rounded
# quotient, which `_true_divide` computes (Note [Broadcast divisors]): -3 / 0.3f is -9.9999996,
# rounded to -10.0, so eager's trunc is -10 (rounding the quotient of a - fmod(a, b), an exact
# multiple of b, gave -9). Its floor division divides that multiple (div_floor_floating).


def _div_trunc_float(a, b):
    """trunc(a / b) of the correctly rounded quotient (Note [Exact quotients]). A bf16/fp16
    quotient is rounded to its dtype first, as eager's kernel divides in it, unless `b` is one
    element, which eager reads at float32 (Note [Scalar precision] in dispatch.py)."""
    q = _true_divide(a, b)
    out = out_dtype()
    if out in (jnp.bfloat16, jnp.float16) and jnp.size(b) != 1:
        q = q.astype(out).astype(q.dtype)
    return jnp.trunc(q)


def _div_floor_float(a, b):
    """Eager's div_floor_floating (Note [Exact quotients])."""
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    floordiv = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floordiv)
    return jnp.where(b == 0, a / b, floordiv)


@lowering(aten.div.Tensor, aten.div.Scalar)
def div(x, y):
    return _div(x, y)


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(x, y, rounding_mode=None):
    return _div(x, y, rounding_mode)


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(x, y):
    return _div(x, y, "floor")


@lowering(aten.remainder.Tensor, aten.remainder.Scalar)
def remainder(x, y):
    return jnp.remainder(x, y)


@lowering(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(x, y):
    return jnp.fmod(x, y)


# Note [Pow by a scalar]
# Eager's CPU pow by a Python scalar exponent (pow_tensor_scalar_optimized_kernel) computes six
# exponents by their own formulas: 2 as x * x, 3 as x * x * x, 0.5 as sqrt, -0.5 as 1 / sqrt,
# -1 as 1 / x, -2 as 1 / (x * x); any other through std::pow. XLA's pow by a lifted exponent
# (the value is an argument, not a constant XLA could specialise) was up to an ulp off in 1-27 %
# of the elements (x.pow(3), rsqrt's), and pow(-inf, 0.5) gave inf where sqrt gives NaN, -0.0
# ** 0.5 gave 0.0. So a Python exponent (pow.Tensor_Scalar's, lifted) selects the same formulas;
# a tensor exponent, a 0-d CPU one too, takes pow for every value, as eager. In bfloat16 eager
# rounds the square x * x to bfloat16 before it multiplies or divides again; float16 takes
# std::pow for every exponent (pow(-inf, 0.5) is inf there), computed here in float32 and rounded
# once.


def _square(x):
    sq = x * x
    if out_dtype() == jnp.bfloat16 and sq.dtype != jnp.bfloat16:
        sq = sq.astype(jnp.bfloat16).astype(sq.dtype)
    return sq


# Complex exponents take the same formulas; `_true_divide` divides a complex 1 as
# c10::complex does (1 / 0 is inf+nanj). Any other exponent takes std::pow, i.e. for complex
# glibc's cpow, exp(y * log(x)) under C's complex arithmetic: for a zero base that is 0 (with the
# sign C's infinities give its imaginary part) where Re y > 0, inf+nanj where Re y < 0, NaN
# otherwise; XLA's pow gave NaN for 0 ** (1+1j) and 1 for 0 ** 0.
_POW_FORMULAS = (
    (2.0, lambda x: x * x),
    (3.0, lambda x: _square(x) * x),
    (0.5, jnp.sqrt),
    (-0.5, lambda x: _true_divide(1, jnp.sqrt(x))),
    (-1.0, lambda x: _true_divide(1, x)),
    (-2.0, lambda x: _true_divide(1, _square(x))),
)


def _complex_pow(x, y):
    """std::pow of complex operands (see _POW_FORMULAS)."""
    out = jnp.power(x, y)
    yr, yi = jnp.real(y), jnp.imag(y)
    real = jnp.where(yr > 0, 0.0, jnp.where(yr < 0, jnp.inf, jnp.nan)).astype(yr.dtype)
    imag = jnp.where(yr > 0, jnp.where(yi < 0, 0.0, -0.0), jnp.nan).astype(yr.dtype)
    return jnp.where(x == 0, lax.complex(real, imag), out)


@lowering(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(x, y):
    if isinstance(y, (bool, int, float)) and y in (0, 1):
        # eager fills ones, or copies: complex 0 ** 0 is 1, 0j ** 1 is 0j (not std::pow's)
        dt = out_dtype() or jnp.result_type(x)
        return jnp.ones(jnp.shape(x), dt) if y == 0 else jnp.asarray(x).astype(dt)
    if isinstance(y, (int, float)) and y == 2:  # (a static exponent)
        return x * x
    out = _power(x, y)
    x = jnp.asarray(x)
    if (
        jnp.ndim(y) == 0
        and x.dtype == out.dtype
        and jnp.issubdtype(out.dtype, jnp.inexact)
        and out_dtype() != jnp.float16
    ):
        for c, formula in _POW_FORMULAS:
            out = jnp.where(y == c, formula(x), out)
    return out


@lowering(aten.pow.Tensor_Tensor)
def pow_(x, y):
    """A tensor exponent (a 0-d CPU one too): std::pow for every element, as in eager."""
    return _power(x, y)


@lowering(aten.pow.Scalar)
def pow_scalar(x, y):
    return _power(x, y)


def _power(x, y):
    x, y = jnp.asarray(x), jnp.asarray(y)
    out = jnp.result_type(x, y)
    if jnp.issubdtype(out, jnp.complexfloating):
        return _complex_pow(x.astype(out), y.astype(out))
    if jnp.issubdtype(out, jnp.inexact) or y.dtype == jnp.bool_:
        return jnp.power(x, y)
    # Integers: a negative exponent gives 0, except for bases 1 and -1 (eager's integral pow).
    out = _int_power(x, jnp.where(y < 0, 0, y))
    neg = jnp.where(x == 1, 1, jnp.where(x == -1, jnp.where(y % 2 == 0, 1, -1), 0))
    return jnp.where(y < 0, neg.astype(out.dtype), out)


def _int_power(x, y):
    """`x ** y` for integers, y >= 0, wrapping as eager's square-and-multiply does. (jnp.power
    squares only log2(bits) times, so it reads the exponent modulo 64: 2 ** 64 gave 1, eager 0,
    and 3 ** 200 was 3 ** 8.)"""
    bits = jnp.iinfo(y.dtype).bits - (1 if jnp.issubdtype(y.dtype, jnp.signedinteger) else 0)
    dt = jnp.result_type(x, y)
    base, y = jnp.asarray(x, dt), jnp.asarray(y, dt)
    acc = jnp.ones_like(base)
    for _ in range(bits):
        acc = jnp.where((y & 1) != 0, acc * base, acc)
        base = base * base
        y = lax.shift_right_logical(y, jnp.ones_like(y))
    return acc


@lowering(aten.where.self)
def where(cond, x, y):
    return jnp.where(cond, x, y)


# Note [Clamp keeps x at a tie]
# Eager's clamp is `min(max(x, lo), hi)` with the bound first in the vectorized kernel
# (`_mm512_max_ps(lo, x)` returns x when they compare equal) and `std::max(x, lo)` in the scalar
# one, so x is kept when it equals a bound: clamp(-0.0, min=0.0) is -0.0, and 1 / it is -inf.
# XLA's max(-0.0, 0.0) is +0.0, so the bounds are applied with a comparison that keeps x unless it
# is strictly outside; a NaN bound gives NaN, as eager's does.


def _clamp_below(x, lo):
    lo = jnp.asarray(lo).astype(x.dtype)
    out = x < lo
    if jnp.issubdtype(x.dtype, jnp.inexact):
        out = out | jnp.isnan(lo)
    return jnp.where(out, lo, x)


def _clamp_above(x, hi):
    hi = jnp.asarray(hi).astype(x.dtype)
    out = x > hi
    if jnp.issubdtype(x.dtype, jnp.inexact):
        out = out | jnp.isnan(hi)
    return jnp.where(out, hi, x)


@lowering(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, min=None, max=None):
    x = _in_result_dtype(jnp.asarray(x))  # (a baked 0-d unit arrives as a Python number)
    if min is not None:
        x = _clamp_below(x, min)
    if max is not None:
        x = _clamp_above(x, max)
    return x


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x, min):
    return _clamp_below(_in_result_dtype(jnp.asarray(x)), min)


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x, max):
    return _clamp_above(_in_result_dtype(jnp.asarray(x)), max)


def _in_result_dtype(x):
    """`x` in a dtype that holds the result's: an integer `x` clamped to float bounds is clamped
    in the float result dtype, as eager does (Note [Integer inputs, floating results]); a float32
    opmath `x` of a bf16 result stays float32."""
    dt = out_dtype()
    return x if dt is None else x.astype(jnp.promote_types(x.dtype, dt))


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(x, end, weight):
    """Eager's formula (ATen's Lerp.h): from `x` for |weight| < 0.5, from `end` otherwise. The one
    formula x + w * (end - x) rounded differently for w >= 0.5 (lerp(a, b, 0.9), quantile's
    interpolation) and gave inf where eager's gives NaN (lerp(1, inf, 0.5))."""
    small = jnp.abs(weight) < 0.5
    return jnp.where(small, x + weight * (end - x), end - (end - x) * (1 - weight))


@lowering(aten.addcmul.default)
def addcmul(x, t1, t2, value=1):
    return x + value * t1 * t2


@lowering(aten.addcdiv.default)
def addcdiv(x, t1, t2, value=1):
    # (value * t1) / t2, in eager's order (PointwiseOpsKernel.cpp): value * (t1 / t2) rounded
    # differently in 0.2-33 % of the elements (an optimizer's step: p.addcdiv_(m, d, value=-lr)).
    return x + _true_divide(value * t1, t2)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(x.dtype), x)


@lowering(aten.gelu.default)
def gelu(x, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


@lowering(aten.gelu_backward.default)
def gelu_backward(grad, x, approximate="none"):
    _, vjp = jax.vjp(lambda v: jax.nn.gelu(v, approximate=approximate == "tanh"), x)
    return vjp(grad)[0]


@lowering(aten.silu_backward.default)
def silu_backward(grad, x):
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@lowering(aten.sigmoid_backward.default)
def sigmoid_backward(grad, y):
    return grad * y * (1 - y)


@lowering(aten.tanh_backward.default)
def tanh_backward(grad, y):
    return grad * (1 - y * y)


@lowering(aten.threshold_backward.default)
def threshold_backward(grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros_like(grad), grad)


@lowering(aten.threshold.default)
def threshold(x, threshold, value):
    return jnp.where(x <= threshold, jnp.asarray(value).astype(x.dtype), x)


@lowering(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lowering(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad, grad * negative_slope)


@lowering(aten.hardtanh.default)
def hardtanh(x, min_val=-1, max_val=1):
    return _clamp_above(_clamp_below(x, min_val), max_val)  # Note [Clamp keeps x at a tie]


@lowering(aten.hardtanh_backward.default)
def hardtanh_backward(grad, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros_like(grad), grad)


@lowering(aten.elu.default)
def elu(x, alpha=1, scale=1, input_scale=1):
    return jnp.where(x > 0, x * scale, alpha * scale * jnp.expm1(x * input_scale))


@lowering(aten.softplus.default)
def softplus(x, beta=1, threshold=20):
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(bx)) / beta)


# Eager's CPU formulas, so that float32 rounds where eager does: min(max(x + 3, 0), 6) / 6 and
# x * that / 6, each division correctly rounded (Note [Broadcast divisors]).
@lowering(aten.hardsigmoid.default)
def hardsigmoid(x):
    return _true_divide(jnp.clip(x + 3, 0, 6), 6)


@lowering(aten.hardswish.default)
def hardswish(x):
    return _true_divide(x * jnp.clip(x + 3, 0, 6), 6)


def logit_steps(x, eps):
    """(x as computed, a function rounding a step's result as eager's kernel does, the clamp
    bounds). Eager's logit kernels run bf16/fp16 through Vectorized<BFloat16/Half> arithmetic,
    which rounds each operation to the dtype (1 - x, the quotient, the log; eps and 1 - eps too):
    a third of the elements differ from a float32 computation rounded once, and eps = 1e-3 puts
    bf16's upper bound at 1.0, where eager's logit is inf. The rules take their inputs in their
    own dtypes (opmath=False)."""
    if x.dtype in (jnp.bfloat16, jnp.float16):
        dt = x.dtype

        def r(v):
            return v.astype(dt).astype(jnp.float32)

        x = x.astype(jnp.float32)
    else:
        x = float_operand(x)

        def r(v):
            return v

    if eps is None:
        return x, r, None
    lo = r(jnp.asarray(eps, x.dtype))
    return x, r, (lo, r(1 - lo))


@lowering(aten.logit.default, opmath=False)
def logit(x, eps=None):
    x, r, bounds = logit_steps(x, eps)
    if bounds is not None:
        x = jnp.clip(x, *bounds)
    return jnp.log(r(x / r(1 - x)))


# nextafter steps one ulp of its own dtype; nan_to_num's default bounds are its dtype's (Note
# [Opmath]: both keep bf16/fp16).
register(aten.nextafter.default, jnp.nextafter, opmath=False)


@lowering(aten.nan_to_num.default, opmath=False)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


@lowering(aten.elu_backward.default)
def elu_backward(grad, alpha, scale, input_scale, is_result, x):
    if is_result:  # x is elu's output
        neg = grad * input_scale * (x + alpha * scale)
    else:
        neg = grad * input_scale * alpha * scale * jnp.exp(x * input_scale)
    return jnp.where(x > 0, grad * scale, neg)


@lowering(aten.softplus_backward.default)
def softplus_backward(grad, x, beta, threshold):
    bx = x * beta
    return jnp.where(bx > threshold, grad, grad * jax.nn.sigmoid(bx))


# `pow_.Scalar` (Tensor self, Scalar exponent) would be derived from `pow.Scalar` (Scalar self,
# Tensor exponent) by overload name: it gets its own rule.
@lowering(aten.pow_.Scalar)
def pow_inplace_scalar(x, y):
    return pow_tensor_scalar(x, y)


def _bool_pow_meta(op):
    """A bool tensor to a bool power stays bool in eager (result_type(bool_t, True): `b ** True`
    copies, `b ** False` fills ones); the meta kernel, PyTorch's reference, promotes to long."""

    def meta(x, y):
        if x.dtype == torch.bool and type(y) is bool:
            return x if op is aten.pow_.Scalar else torch.empty_like(x)
        return op(x, y)

    META_RULES[op] = meta


_bool_pow_meta(aten.pow.Tensor_Scalar)
_bool_pow_meta(aten.pow_.Scalar)


@lowering(aten.round.decimals)
def round_decimals(x, *, decimals):
    """Eager's nearbyint(x * 10**d) / 10**d (negative d: nearbyint(x / 10**-d) * 10**-d), with a
    division that stays one (jnp.round divides by the constant, which XLA turns into a multiply by
    its rounded reciprocal: a quarter of round(x, decimals=2) was an ulp off)."""
    x = float_operand(x)
    scale = jnp.asarray(10.0 ** abs(decimals), x.dtype)
    if decimals < 0:
        return jnp.round(_true_divide(x, scale)) * scale
    return _true_divide(jnp.round(x * scale), scale)


@lowering(aten.hypot.default)
def hypot(x, y):
    """As eager's (Sleef's 0.5-ulp hypot): float32 correctly rounded, through float64's
    sqrt(x*x + y*y); float64 within an ulp, as sqrt(x*x + y*y) where that neither overflows nor
    underflows (jnp.hypot's x * sqrt(1 + (y/x)**2) was an ulp off in a third of the elements);
    inf where either is infinite, NaN or not (C's hypot)."""
    x, y = jnp.asarray(x), jnp.asarray(y)
    dt = jnp.result_type(x, y)
    if dt == jnp.float32:
        wide = jnp.sqrt(x.astype(jnp.float64) ** 2 + y.astype(jnp.float64) ** 2).astype(dt)
    else:
        x, y = x.astype(dt), y.astype(dt)
        s = x * x + y * y
        safe = jnp.isfinite(s) & (s >= jnp.finfo(dt).tiny)
        wide = jnp.where(safe, jnp.sqrt(jnp.where(safe, s, 1)), jnp.hypot(x, y))
    return jnp.where(jnp.isinf(x) | jnp.isinf(y), jnp.inf, wide).astype(dt)


@lowering(aten.isneginf.default)
def isneginf(x):
    return jnp.isneginf(x)


@lowering(aten.isposinf.default)
def isposinf(x):
    return jnp.isposinf(x)


@lowering(aten.heaviside.default)
def heaviside(x, values):
    x, values = jnp.asarray(x), jnp.asarray(values)  # (a baked unit arrives as a Python bool)
    return jnp.where(x == 0, values.astype(x.dtype), (x > 0).astype(x.dtype))


def _gcd(x, y):
    """Eager's calc_gcd: Euclid's loop with C's truncating remainder, from |x| and |y| as C's abs
    gives them (|INT_MIN| stays INT_MIN). jnp.gcd's loop never ended there: gcd(int8 -128, 5) hung
    the program; this one's |a| falls every step."""
    x, y = jnp.broadcast_arrays(*_pair(x, y))
    a, b = (v if jnp.issubdtype(v.dtype, jnp.unsignedinteger) else lax.abs(v) for v in (x, y))

    def step(s):
        a, b = s
        nz = a != 0
        return jnp.where(nz, lax.rem(b, jnp.where(nz, a, 1)), a), jnp.where(nz, a, b)

    return lax.while_loop(lambda s: jnp.any(s[0] != 0), step, (a, b))[1]


@lowering(aten.gcd.default)
def gcd(x, y):
    return _gcd(x, y)


@lowering(aten.lcm.default)
def lcm(x, y):
    """Eager's calc_lcm: |x / gcd * y| in C's integer arithmetic (int8/int16/uint8 promoted to
    int, then wrapped into the dtype), 0 where gcd is 0."""
    x, y = jnp.broadcast_arrays(*_pair(x, y))
    g = _gcd(x, y)
    nz = g != 0
    wide = jnp.int32 if x.dtype.itemsize < 4 else x.dtype
    q = lax.div(x.astype(wide), jnp.where(nz, g, 1).astype(wide)) * y.astype(wide)
    q = q if jnp.issubdtype(wide, jnp.unsignedinteger) else lax.abs(q)
    return jnp.where(nz, q, 0).astype(x.dtype)


def _shift_dtype(x, y):
    """Both operands in the result's dtype, PyTorch's (a baked `True << t` arrived as a Python
    bool and shifted in bool)."""
    x, y = jnp.asarray(x), jnp.asarray(y)
    dt = out_dtype() or (jnp.result_type(x, y) if x.ndim else x.dtype)
    return x.astype(dt), y.astype(dt)


@lowering(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar)
def bitwise_left_shift(x, y):
    x, y = _shift_dtype(x, y)
    bits = x.dtype.itemsize * 8
    return jnp.where((y >= bits) | (y < 0), jnp.zeros_like(x), jnp.left_shift(x, y))


@lowering(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar)
def bitwise_right_shift(x, y):
    x, y = _shift_dtype(x, y)
    bits = x.dtype.itemsize * 8
    big = (y >= bits) | (y < 0)
    sat = (
        jnp.where(x < 0, -1, 0).astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.signedinteger) else 0
    )
    return jnp.where(big, sat, jnp.right_shift(x, jnp.where(big, 0, y)))


@lowering(aten.frexp.Tensor, opmath=False)  # the mantissa/exponent split of its own dtype
def frexp(x):
    m, e = jnp.frexp(x)
    return m, e.astype(jnp.int32)


@lowering(aten.angle.default)
def angle(x):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.angle(x)
    x = float_operand(x)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0).astype(x.dtype))


@lowering(aten.polar.default)
def polar(r, theta):
    return lax.complex(r * jnp.cos(theta), r * jnp.sin(theta))


@lowering(aten.complex.default)
def complex_(re, im):
    dt = jnp.result_type(re, im)  # (a weakly typed 0-d part takes the other's dtype)
    return lax.complex(*(a.astype(dt) for a in jnp.broadcast_arrays(re, im)))


@lowering(aten._conj_physical.default)  # conj_physical is composite: it calls this for complex x
def conj_physical(x):
    return jnp.conj(x) if jnp.iscomplexobj(x) else x
