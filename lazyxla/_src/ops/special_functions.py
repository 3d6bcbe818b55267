"""Special functions: the gamma family (polygamma, incomplete gamma, mvlgamma), Bessel functions,
the error-function family, Hurwitz zeta, orthogonal polynomials, and their kin (sinc, logaddexp,
xlog1py, entr), with eager's (Cephes') domains and special cases."""

from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.special as jss
import numpy as np
import torch
from jax import lax

from . import elementwise, igamma_coefficients, libm
from .registry import float_operand, lowering

aten = torch.ops.aten


@lowering(aten.polygamma.default)
def polygamma(n, x):
    x = float_operand(x)
    if n == 0:
        return elementwise.digamma(x)
    # jax's polygamma is for x > 0: shift negative x up with the recurrence
    # psi_n(x) = psi_n(x + k) - (-1)^n n! sum_{j<k} (x + j)^-(n+1).
    k = 16
    neg = x < 0
    xs = jnp.where(neg, x + k, x)
    out = jss.polygamma(n, xs)
    corr = sum(1.0 / (x + j) ** (n + 1) for j in range(k))
    sign = 1.0 if n % 2 else -1.0
    out = jnp.where(neg, out + sign * math.factorial(n) * corr, out)
    return jnp.where(x == 0, sign * jnp.inf, out)  # the pole at 0, signed as eager's


@lowering(aten.logaddexp.default)
def logaddexp(x, y):
    x, y = float_operand(x), float_operand(y)
    if jnp.iscomplexobj(x) or jnp.iscomplexobj(y):
        return _complex_logaddexp(x, y)
    return jnp.logaddexp(x, y)


def _complex_logaddexp(x, y):
    """Eager's complex formula (`_log_add_exp_helper`): ordered by real part, log1p(exp(min -
    max)) + max, with its NaN and infinity cases (jnp's gave NaN for inf + 0j and a finite y)."""
    y_max = jnp.real(y) > jnp.real(x)
    mn, mx = jnp.where(y_max, x, y), jnp.where(y_max, y, x)
    lo, hi = jnp.real(mn), jnp.real(mx)
    general = jnp.log1p(jnp.exp(mn - mx)) + mx
    both_inf = jnp.where(lo < 0, mn, jnp.log(jnp.exp(mn) + jnp.exp(mx)))
    out = jnp.where(~jnp.isfinite(lo) & (lo == hi), both_inf, general)
    nan = jnp.isnan(lo) | jnp.isnan(jnp.imag(mn))
    return jnp.where(nan, jnp.asarray(complex(jnp.nan, jnp.nan), out.dtype), out)


@lowering(aten.logaddexp2.default)
def logaddexp2(x, y):
    return jnp.logaddexp2(float_operand(x), float_operand(y))


@lowering(aten.sinc.default)
def sinc(x):
    return jnp.sinc(float_operand(x))


# Note [Incomplete gamma for large a]
# jax's gammainc/gammaincc sum a series or a continued fraction for every (a, x). Where a is large
# and x near it those converge slowly and lose precision: at a = x = 1e6, float32's igamma was
# 0.5057 (eager 0.50013) and at x = 0.999a 0.097 (eager 0.159); at a = 1e12 it was inf; and in
# float64 at a >= 2**53, where the series' `r + 1 == r`, its loop never ends (the process hangs).
# Eager (Cephes) uses Temme's uniform asymptotic expansion there (DLMF 8.12.3/8.12.4), in two
# regimes: 20 < a < 200 with |x - a| / a < 0.3, and a > 200 with |x - a| / a < 4.5 / sqrt(a). So
# does lazyxla, with eager's coefficients and truncation (igamma_coefficients.py); past a = 1e12
# the expansion also serves |x - a| < a (where eager's series stops at 2000 terms, inexact, and
# jax's would run ~sqrt(a) iterations). Everywhere else jax's functions run, on inputs with those
# elements replaced so no loop of theirs meets them.
def _igamma_asymptotic(a, x, lower):
    """Eager's `_igam_helper_asymptotic_series(a, x, lower)`, elementwise."""
    dt = a.dtype
    eps = 1.11022302462515654042e-16 if dt == jnp.float64 else 5.9604644775390625e-8
    sigma = (x - a) / a
    root = jnp.sqrt(-2 * (jnp.log1p(sigma) - sigma))
    eta = jnp.where(x > a, root, jnp.where(x < a, -root, jnp.zeros_like(root)))
    sgn = -1 if lower else 1
    res = 0.5 * jss.erfc(sgn * eta * jnp.sqrt(a / 2))
    powers = eta[..., None] ** jnp.arange(25, dtype=dt)
    ck = powers @ jnp.asarray(igamma_coefficients.D, dt).T  # C_k(eta), k = 0..24
    terms = ck * (1 / a)[..., None] ** jnp.arange(25, dtype=dt)
    size = jnp.abs(terms)
    # Eager's loop stops before a term larger than the last (the expansion diverges), and after
    # one below eps of the sum so far.
    grows = jnp.concatenate(
        [jnp.zeros_like(size[..., :1], bool), size[..., 1:] > size[..., :-1]], -1
    )
    done = size < eps * jnp.abs(jnp.cumsum(terms, -1))
    done_before = jnp.concatenate([jnp.zeros_like(done[..., :1]), done[..., :-1]], -1)
    keep = (jnp.cumsum(grows, -1) == 0) & (jnp.cumsum(done_before, -1) == 0)
    total = jnp.sum(jnp.where(keep, terms, 0), -1)
    pi = float(np.float32(math.pi))  # eager's `c10::pi<float>`
    return res + sgn * jnp.exp(-0.5 * a * eta * eta) * total / jnp.sqrt(2 * pi * a)


def _incomplete_gamma(a, x, lower):
    a, x = jnp.broadcast_arrays(float_operand(a), float_operand(x))
    off = jnp.abs(x - a) / a
    asymptotic = (
        ((a > 20) & (a < 200) & (off < 0.3))
        | ((a > 200) & (off < 4.5 / jnp.sqrt(a)))
        | ((a > 1e12) & (off < 1))
    )
    one = jnp.ones_like(a)
    a_j, x_j = jnp.where(asymptotic, one, a), jnp.where(asymptotic, one, x)
    series = jss.gammainc(a_j, x_j) if lower else jss.gammaincc(a_j, x_j)
    a_s, x_s = jnp.where(asymptotic, a, 100 * one), jnp.where(asymptotic, x, 100 * one)
    out = jnp.where(asymptotic, _igamma_asymptotic(a_s, x_s, lower), series)
    # eager's boundary cases, checked in its order (the first that holds decides)
    low, high = (0 * one, one) if lower else (one, 0 * one)
    nan = jnp.nan * one
    for case, value in reversed(
        [
            ((x < 0) | (a < 0), nan),
            (a == 0, jnp.where(x > 0, high, nan)),
            (x == 0, low),
            (jnp.isinf(a), jnp.where(jnp.isinf(x), nan, low)),
            (jnp.isinf(x), high),
        ]
    ):
        out = jnp.where(case, value, out)
    return out


@lowering(aten.igamma.default)
def igamma(a, x):
    return _incomplete_gamma(a, x, True)


@lowering(aten.igammac.default)
def igammac(a, x):
    return _incomplete_gamma(a, x, False)


@lowering(aten.special_i0e.default)
def special_i0e(x):
    return jss.i0e(float_operand(x))


def _positive_zero_at_zero(fn, x):
    """`fn(x)`, with +0.0 at x = ±0: eager's Cephes i1 and i1e take |x| and negate only for x < 0,
    so i1(-0.0) is 0.0 (jax's keeps the sign of the odd function)."""
    x = float_operand(x)
    out = fn(x)
    return jnp.where(x == 0, jnp.zeros_like(out), out)


@lowering(aten.special_i1.default)
def special_i1(x):
    return _positive_zero_at_zero(jss.i1, x)


@lowering(aten.special_i1e.default)
def special_i1e(x):
    return _positive_zero_at_zero(jss.i1e, x)


@lowering(aten.special_ndtri.default)
def special_ndtri(x):
    return jss.ndtri(float_operand(x))


@lowering(aten.special_log_ndtr.default)
def special_log_ndtr(x):
    """log Φ(x) by eager's formula (ATen's calc_log_ndtr), t = x / √2: log(erfcx(-t) / 2) - t²
    below -1, log1p(-erfc(t) / 2) above. jax's log(ndtr(x)) rounded Φ(x) near 1 (float32 x = 5:
    -2.98e-7 for -2.87e-7, 4 % off) and its float64 asymptotic series below -20 was 2e-11 off."""
    x = float_operand(x)
    t = x * np.sqrt(0.5).astype(x.dtype)
    low = jnp.where(x < -1, t, -1.0)  # (each branch on arguments it is accurate for)
    below = jnp.log(special_erfcx(-low) / 2) - low * low
    above = libm.log1p(-_erfc(jnp.where(x < -1, 0.0, t)) / 2)
    return jnp.where(x < -1, below, above)


@lowering(aten.erfc.default)
def erfc(x):
    return _erfc(float_operand(x))


@lowering(aten.erfinv.default)
def erfinv(x):
    """XLA's erfinv y, then one Newton step: on erfc(y) = 1 - x (exact for |x| >= 1/2) where
    |x| > 0.9, and in float64 on erf(y) = x below. XLA's was ~100 ulps off near ±1 in float64
    (37 in float32) and 19 in the middle of float64; the step on erf near ±1 would cancel, on the
    tail-accurate erfc it does not. The sign is x's (erfinv(-0.0) is -0.0)."""
    x = float_operand(x)
    y = jss.erfinv(x)
    a, b = jnp.abs(x), jnp.abs(y)
    tail = (a > 0.9) & (a < 1)
    ok = jnp.isfinite(y)
    bt = jnp.where(ok, b, 1.0)
    slope = 2 / np.sqrt(np.pi) * jnp.exp(-bt * bt)
    residual = _erfc(jnp.where(tail, bt, 1.0)) - (1 - a)
    if x.dtype == jnp.float64:  # (XLA's float32 erf is 5 ulps off: a step on it loses)
        residual = jnp.where(tail, residual, a - jss.erf(jnp.where(tail, 0.0, bt)))
        tail = ok
    return jnp.where(tail & ok, jnp.copysign(jnp.abs(bt + residual / slope), x), y)


def _erfc(x):
    """erfc(x) to a few ulps in the tail too: erfcx(x) exp(-x²) with x² split exactly (as in
    `special_erfcx`) from x = 2; XLA's erfc is ~60 ulps off there (float32 erfc(8))."""
    f64 = x.dtype == jnp.float64
    tail = x >= 2.0
    gone = x > (27.5 if f64 else 10.5)  # erfc(x) is below the smallest subnormal: +0
    xt = jnp.where(tail & ~gone, x, 2.0)
    p, e = _exact_square(xt)
    out = jnp.where(tail, special_erfcx(xt) * (jnp.exp(-p) * (1 - e)), jss.erfc(x))
    return jnp.where(gone, 0.0, out)


def _exact_square(x):
    """x² as p + e exactly: p = x * x rounded, e its error, by Veltkamp's split of x into halves
    of the mantissa (2^27 + 1 for float64, 2^12 + 1 for float32)."""
    c = (134217729.0 if x.dtype == jnp.float64 else 4097.0) * x
    hi = c - (c - x)
    lo = x - hi
    p = x * x
    return p, ((hi * hi - p) + 2 * hi * lo) + lo * lo


@lowering(aten.special_erfcx.default)
def special_erfcx(x):
    """exp(x^2) erfc(x) within a few ulps (eager computes it with the Faddeeva package): below a
    threshold as that product, with x^2 split exactly into a sum (Veltkamp) since rounding x^2 to
    p costs exp a relative error of p * eps; above it by Laplace's continued fraction
    erfcx(x) = 1 / (sqrt(pi) (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...))))), evaluated
    backwards from a fixed depth: 20 levels give < 2 ulps from x = 2 in float32 and x = 4 in
    float64 (a truncated asymptotic series was 1.6e-6 off at x = 5.25 in float64)."""
    x = float_operand(x)
    f64 = x.dtype == jnp.float64
    p, e = _exact_square(x)
    e = jnp.where(jnp.isfinite(e), e, 0.0)  # (-inf: exp(p) is inf already)
    big = x >= (4.0 if f64 else 2.0)
    xs = jnp.where(big, 0.0, x)
    ps = jnp.where(big, 0.0, p)
    es = jnp.where(big, 0.0, e)
    small = jnp.exp(ps) * (1 + es) * jss.erfc(xs)
    xb = jnp.where(big, x, 4.0)
    t = xb
    for k in range(20, 0, -1):
        t = xb + (k / 2) / t
    small = jnp.where(x < (-26.7 if f64 else -9.4), jnp.inf, small)  # 2 exp(x²) overflows
    return jnp.where(big, 1 / (np.sqrt(np.pi) * t), small)


@lowering(aten.special_xlog1py.default, opmath=False)  # rounds its log1p (elementwise.xlog)
def special_xlog1py(x, y):
    return elementwise.xlog(x, y, jnp.log1p, _xlog1py)


def _xlog1py(x, y):
    """Eager's order: NaN for a NaN y, 0 where x == 0, else x * log1p(y); float64's log1p is
    `libm.log1p` (XLA's is 120 ulps off near y = -0.41)."""
    x, y = jnp.broadcast_arrays(float_operand(x), float_operand(y))
    if jnp.result_type(x, y) != jnp.float64:
        return jss.xlog1py(x, y)
    out = jnp.where(x == 0, 0.0, x * libm.log1p(y.astype(jnp.float64)))
    return jnp.where(jnp.isnan(y), jnp.nan, out)


@lowering(aten.special_entr.default)
def special_entr(x):
    x = float_operand(x)
    out = jnp.where(x > 0, -x * jnp.log(jnp.where(x > 0, x, 1)), jnp.where(x == 0, 0.0, -jnp.inf))
    return jnp.where(jnp.isnan(x), x, out)  # (NaN is not below 0: eager gives NaN)


@lowering(aten.special_zeta.default)
def special_zeta(x, q):
    """Hurwitz zeta with eager's (Cephes') domain: inf at x == 1 and at nonpositive integer q,
    nan for x < 1 and for a negative non-integer q with a non-integer x."""
    x, q = jnp.broadcast_arrays(float_operand(x), float_operand(q))
    out = jss.zeta(x, q)
    q_pole = (q <= 0) & (q == jnp.floor(q))
    out = jnp.where((q <= 0) & ~q_pole & (x != jnp.floor(x)), jnp.nan, out)
    out = jnp.where(q_pole, jnp.inf, out)
    out = jnp.where(x < 1, jnp.nan, out)
    return jnp.where(x == 1, jnp.inf, out)


@lowering(aten.mvlgamma.default)
def mvlgamma(x, p):
    x = float_operand(x)
    out = p * (p - 1) / 4 * np.log(np.pi)
    for j in range(p):
        out = out + jss.gammaln(x - j / 2)
    return out


def _poly(x, n, p1, step, special=None):
    """p_n(x) by p_{k+1} = step(k, x, p_{k-1}, p_k), p_0 = 1, p_1 = p1(x); n is per element."""
    x = float_operand(x)
    n = jnp.broadcast_to(jnp.asarray(n), jnp.broadcast_shapes(jnp.shape(x), jnp.shape(n)))
    n = jnp.trunc(n).astype(jnp.int64) if jnp.issubdtype(n.dtype, jnp.inexact) else n
    n = n.astype(jnp.int64)
    x = jnp.broadcast_to(x, n.shape)
    q1 = p1(x)
    out = jnp.where(n == 0, jnp.ones_like(x), jnp.where(n == 1, q1, jnp.zeros_like(x)))

    def cond(c):
        return c[0] < jnp.max(n, initial=0)

    def body(c):
        k, p, q, out = c
        r = step(k.astype(x.dtype), x, p, q)
        out = jnp.where(n == k + 1, r, out)
        return k + 1, q, r, out

    _, _, _, out = lax.while_loop(cond, body, (jnp.int64(1), jnp.ones_like(x), q1, out))
    if special is not None:
        out = special(x, n, out)
    return jnp.where(n < 0, jnp.zeros_like(out), out)


def _odd(n):
    return (n % 2) == 1


def _cheb_t(x, n):
    def special(x, n, out):
        nf = n.astype(x.dtype)
        edge = jnp.where((x > 0) | ~_odd(n), 1.0, -1.0).astype(x.dtype)
        trig = jnp.cos(nf * jnp.arccos(x))
        out = jnp.where((n > 6) & (jnp.abs(x) < 1), trig, out)
        return jnp.where(jnp.abs(x) == 1, edge, out)

    return _poly(x, n, lambda x: x, lambda k, x, p, q: (x + x) * q - p, special)


def _cheb_u(x, n):
    def special(x, n, out):
        nf = n.astype(x.dtype)
        edge = jnp.where((x > 0) | ~_odd(n), nf + 1, -(nf + 1))
        a = jnp.arccos(x)
        s = jnp.sin(a)
        trig = jnp.where(
            s != 0,
            jnp.sin((nf + 1) * a) / jnp.where(s != 0, s, 1),
            (nf + 1) * jnp.cos((nf + 1) * a) / x,
        )
        out = jnp.where((n > 8) & (jnp.abs(x) < 1), trig, out)
        return jnp.where(jnp.abs(x) == 1, edge, out)

    return _poly(x, n, lambda x: x + x, lambda k, x, p, q: (x + x) * q - p, special)


def _cheb_v(x, n):
    def special(x, n, out):
        nf = n.astype(x.dtype)
        odd = jnp.where(_odd(n), -(nf + nf + 1), nf + nf + 1)
        edge = jnp.where(x > 0, jnp.ones_like(x), odd)
        a = jnp.arccos(x)
        h = jnp.sin(a / 2)
        trig = jnp.where(h != 1, jnp.cos((nf + 0.5) * a) / jnp.cos(a / 2), odd)
        out = jnp.where((n > 8) & (jnp.abs(x) < 1), trig, out)
        return jnp.where(jnp.abs(x) == 1, edge, out)

    return _poly(x, n, lambda x: x + x - 1, lambda k, x, p, q: (x + x) * q - p, special)


def _cheb_w(x, n):
    def special(x, n, out):
        nf = n.astype(x.dtype)
        edge = jnp.where(x > 0, nf + nf + 1, jnp.where(_odd(n), -1.0, 1.0).astype(x.dtype))
        a = jnp.arccos(x)
        c = jnp.cos(a / 2)
        trig = jnp.where(
            c != 1,
            jnp.sin((nf + 0.5) * a) / jnp.sin(a / 2),
            jnp.where(x > 0, nf + nf + 1, jnp.where(_odd(n), -1.0, 1.0).astype(x.dtype)),
        )
        out = jnp.where((n > 8) & (jnp.abs(x) < 1), trig, out)
        return jnp.where(jnp.abs(x) == 1, edge, out)

    return _poly(x, n, lambda x: x + x + 1, lambda k, x, p, q: (x + x) * q - p, special)


def _hermite_h(x, n):
    return _poly(x, n, lambda x: x + x, lambda k, x, p, q: (x + x) * q - (k + k) * p)


def _hermite_he(x, n):
    return _poly(x, n, lambda x: x, lambda k, x, p, q: x * q - k * p)


def _laguerre(x, n):
    def special(x, n, out):
        return jnp.where((jnp.abs(x) == 0) & (n >= 0), jnp.ones_like(out), out)

    return _poly(
        x, n, lambda x: 1 - x, lambda k, x, p, q: ((k + k + (1 - x)) * q - k * p) / (k + 1), special
    )


def _legendre(x, n):
    def special(x, n, out):
        edge = jnp.where((x > 0) | (n == 0) | ~_odd(n), 1.0, -1.0).astype(x.dtype)
        return jnp.where(jnp.abs(x) == 1, edge, out)

    return _poly(
        x, n, lambda x: x, lambda k, x, p, q: ((k + k + 1) * x * q - k * p) / (k + 1), special
    )


def _shifted(fn):
    return lambda x, n: fn(float_operand(x) + float_operand(x) - 1, n)


for _name, _fn in (
    ("chebyshev_polynomial_t", _cheb_t),
    ("chebyshev_polynomial_u", _cheb_u),
    ("chebyshev_polynomial_v", _cheb_v),
    ("chebyshev_polynomial_w", _cheb_w),
    ("shifted_chebyshev_polynomial_t", _shifted(_cheb_t)),
    ("shifted_chebyshev_polynomial_u", _shifted(_cheb_u)),
    ("shifted_chebyshev_polynomial_v", _shifted(_cheb_v)),
    ("shifted_chebyshev_polynomial_w", _shifted(_cheb_w)),
    ("hermite_polynomial_h", _hermite_h),
    ("hermite_polynomial_he", _hermite_he),
    ("laguerre_polynomial_l", _laguerre),
    ("legendre_polynomial_p", _legendre),
):
    lowering(getattr(aten, "special_" + _name).default)(lambda x, n, _fn=_fn: _fn(x, n))


@lowering(aten.special_modified_bessel_i0.default)
def special_modified_bessel_i0(x):
    return jss.i0(float_operand(x))


@lowering(aten.special_modified_bessel_i1.default)
def special_modified_bessel_i1(x):
    return _positive_zero_at_zero(jss.i1, x)


@lowering(aten.special_spherical_bessel_j0.default)
def spherical_bessel_j0(x):
    x = float_operand(x)
    safe = jnp.where(x == 0, 1.0, x)
    out = jnp.where(x == 0, 1.0, jnp.sin(safe) / safe)
    return jnp.where(jnp.isinf(x), 0.0, out)  # (eager's limit; sin(inf) / inf is NaN)
