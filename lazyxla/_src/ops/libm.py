"""Elementwise functions where XLA's own are not eager's: real forms within a few ulps where
XLA rounds an argument (docs/architecture.md, "Where XLA's own functions are not eager's"), and
complex functions by C99's symmetries and formulas. Each takes real or complex jax arrays; the
lowerings in elementwise.py and special_functions.py call them. `python -m lazyxla.tools.ulp_scan`
measures them against eager."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def log1p(x):
    """XLA's float64 log1p is up to 120 ulps off for x in (-0.5, -0.3) (-0.414: the edge of one
    of its ranges); there 1 + x rounds by at most 2^-54, so log(1 + x) is within two. Elsewhere,
    and in float32 (1.5 ulps), XLA's."""
    if x.dtype != jnp.float64:
        return jnp.log1p(x)
    return jnp.where((x > -0.5) & (x < -0.25), jnp.log(1 + x), jnp.log1p(x))


# (zeta(k) - 1) / k for k = 2..41: the Taylor coefficients of lgamma about 2 (Abramowitz & Stegun
# 6.1.33), (-1)^k alternating; zeta(k) - 1 from mpmath at 40 digits.
_ZETA_MINUS_1 = (
    0.6449340668482264, 0.2020569031595943, 0.08232323371113819,
    0.03692775514336993, 0.01734306198444914, 0.008349277381922827,
    0.00407735619794434, 0.0020083928260822143, 0.0009945751278180853,
    0.0004941886041194645, 0.0002460865533080483, 0.00012271334757848915,
    6.124813505870483e-05, 3.058823630702049e-05, 1.528225940865187e-05,
    7.637197637899763e-06, 3.81729326499984e-06, 1.908212716553939e-06,
    9.539620338727962e-07, 4.769329867878064e-07, 2.38450502727733e-07,
    1.1921992596531106e-07, 5.960818905125948e-08, 2.980350351465228e-08,
    1.4901554828365043e-08, 7.45071178983543e-09, 3.725334024788457e-09,
    1.862659723513049e-09, 9.313274324196682e-10, 4.656629065033784e-10,
    2.3283118336765053e-10, 1.164155017270052e-10, 5.820772087902701e-11,
    2.9103850444971e-11, 1.4551921891041985e-11, 7.275959835057482e-12,
    3.637979547378651e-12, 1.818989650307066e-12, 9.094947840263888e-13,
    4.547473783042154e-13,
)  # fmt: skip
_LGAMMA2 = tuple(z / k for k, z in enumerate(_ZETA_MINUS_1, start=2))
_EULER = 0.5772156649015329


def _lgamma_series(t):
    """lgamma(2 + t) = (1 - γ) t + Σ (-1)^k (ζ(k) - 1) / k t^k (A&S 6.1.33): terms below
    (|t| / 2)^k / k, 40 of them, for |t| <= 1/2 (and 3/4 in float32)."""
    u, poly = -t, jnp.zeros_like(t)
    for c in reversed(_LGAMMA2):
        poly = poly * u + c
    return (1 - _EULER) * t + t * t * poly


def lgamma(x):
    """lgamma below 8 to a few ulps: XLA's Lanczos form has an absolute error of about an ulp of
    1 there, ~1100 ulps of the result at x = 2.01, ~130 at 1.75, 70 at 2.65 in float32 (eager's
    are within one). With S(t) = lgamma(2 + t) (`_lgamma_series`) and t exact in each range:
    x in (0, 1/2): S(x) - log1p(x) - log(x); [1/2, 5/4): S(x - 1) - log1p(x - 1); [5/4, 8):
    S(z - 2) + log(z (z + 1) ... (x - 1)) with z = x - n in [5/4, 9/4). Below 0, eager's
    reflection, log(π / |sin(π x)|) - lgamma(1 - x), with sin(π r) of r = x - round(x) (exact),
    which XLA's reflection rounds (3e-6 relative at -2.5)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return jax.scipy.special.gammaln(x)
    neg = x < 0
    y = jnp.where(neg, 1 - x, x)  # lgamma(x) = log(π / |sin(π x)|) - lgamma(1 - x) below 0
    tiny = (y > 0) & (y < 0.5)
    low = (y >= 0.5) & (y < 1.25)
    mid = (y >= 1.25) & (y < 8)
    n = jnp.where(mid, jnp.floor(y - 1.25), 0.0)
    z = jnp.where(mid, y - n, 2.0)
    t = jnp.where(tiny, y, jnp.where(low, y - 1, z - 2))
    series = _lgamma_series(t)
    prod = jnp.ones_like(z)
    for j in range(6):
        prod = jnp.where(j < n, prod * (z + j), prod)
    safe = jnp.where(tiny, y, 1.0)
    out = jnp.where(
        tiny,
        series - log1p(t) - jnp.log(safe),
        jnp.where(low, series - log1p(t), series + jnp.log(prod)),
    )
    out = jnp.where(tiny | low | mid, out, jax.scipy.special.gammaln(y))
    r = x - jnp.round(x)
    reflected = jnp.log(jnp.pi / jnp.abs(jnp.sin(jnp.pi * r))) - out
    reflected = jnp.where(r == 0, jnp.inf, reflected)  # the poles at 0, -1, -2, ...
    return jnp.where(neg & jnp.isfinite(x), reflected, jnp.where(neg, jnp.inf, out))


def atanh(x):
    """XLA's float64 atanh is (log1p(x) - log1p(-x)) / 2 through its log1p (121 ulps off near
    x = -0.41): the same form through `log1p`."""
    if x.dtype != jnp.float64:
        return jnp.arctanh(x)
    return 0.5 * (log1p(x) - log1p(-x))


def exp2(x):
    """2**x as 2**n * 2**f, n = round(x) and f = x - n exact: XLA's exp(x * ln 2) rounds the
    product, up to ~|x| ulps off (float32 exp2(100.0): 2e-6 relative, 36 ulps)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.exp2(x)
    n = jnp.round(x)
    f = jnp.exp2(x - n)  # |x - n| <= 1/2: within an ulp
    finite = jnp.isfinite(x)
    return jnp.where(finite, jnp.ldexp(f, jnp.where(finite, n, 0).astype(jnp.int32)), jnp.exp2(x))


# Note [Complex functions by symmetry]
# Eager's complex functions are C99's (Annex G, through std::complex and glibc): every one is
# conjugate-symmetric, f(conj z) = conj f(z), and sin, tan, asin, atan and their hyperbolic
# twins are odd, cos and cosh even, exactly, signed zeros included. That is what places the
# branch cuts: sqrt(-0.5 - 0j) is -0.707j, log(-1 - 0j) is -πj, asinh(-0 + 2j) is -1.317+1.571j.
# XLA's complex functions ignore the zero's sign there (+0.707j, +πj, +1.317+1.571j: wrong values,
# not just wrong zeros). The functions below are computed at (|re|, |im|), or (re, |im|), where
# XLA agrees with C99, and the symmetry gives the rest. exp, sin, cos, sinh and cosh, which XLA
# gets wrong in that quadrant too (cos(0 + 2j) is 3.76 - 0j, XLA's + 0j), take C99's formulas in
# real functions instead (`_real_parts`), and atan is -i atanh(iz). Not covered: infinite and NaN
# parts (C99 specifies each case; XLA's are mostly NaN), and eager's own inconsistencies (its
# complex128 acos of a real z has +0j, complex64 -0j; its sgn's zero depends on vectorization).
CONJ, ODD, EVEN = "conj", "odd", "even"


def by_symmetry(fn, symmetry):
    """`fn` for complex inputs by its symmetry (Note [Complex functions by symmetry])."""

    def run(z):
        if not jnp.issubdtype(z.dtype, jnp.complexfloating):
            return fn(z)
        re, im = jnp.real(z), jnp.imag(z)
        neg_re, neg_im = jnp.signbit(re), jnp.signbit(im)
        if symmetry == CONJ:
            w = fn(lax.complex(re, jnp.abs(im)))
            return jnp.where(neg_im, jnp.conj(w), w)
        w = fn(lax.complex(jnp.abs(re), jnp.abs(im)))
        wr, wi = jnp.real(w), jnp.imag(w)
        if symmetry == ODD:  # f(-a + ib) = -conj f(a + ib)
            wr = jnp.where(neg_re, -wr, wr)
            wi = jnp.where(neg_im, -wi, wi)
        else:  # even: f(-a + ib) = f(a - ib) = conj f(a + ib)
            wi = jnp.where(neg_re ^ neg_im, -wi, wi)
        return lax.complex(wr, wi)

    return run


def complex_atanh_nan(atanh):
    """atanh with C99's NaN cases (catanh): XLA's gave a finite ±π/2 imaginary part for a NaN
    input (atanh(0.5 + nan j) was nan + 1.571j). A NaN imaginary part: ±0 + nan j for a real part
    ±0 or ±inf, else NaN; a NaN real part: ±0 ± π/2 j for an infinite imaginary part (the zero
    takes the NaN's sign bit, as eager's), else NaN."""

    def run(z):
        w = atanh(z)
        if not jnp.issubdtype(z.dtype, jnp.complexfloating):
            return w
        a, b = jnp.real(z), jnp.imag(z)
        nan = jnp.full_like(a, jnp.nan)
        zero_re = jnp.copysign(jnp.zeros_like(a), a)
        re = jnp.where(jnp.isnan(b) & ((a == 0) | jnp.isinf(a)), zero_re, nan)
        re = jnp.where(jnp.isnan(a) & jnp.isinf(b), zero_re, re)  # (the NaN's sign, as eager)
        im = jnp.where(jnp.isnan(a) & jnp.isinf(b), jnp.copysign(jnp.pi / 2, b), nan)
        return jnp.where(jnp.isnan(a) | jnp.isnan(b), lax.complex(re, im), w)

    return run


def _real_parts(fn):
    """A complex function from `fn(a, b)` -> (real part, imaginary part) in real functions of
    z = a + ib: C99's formulas, whose products carry the signed zeros eager's results have. The
    result (cexp, csin, ccos, csinh, ccosh below) takes a real input to `real_fn`."""

    def complex_fn(real_fn):
        def run(z):
            if not jnp.issubdtype(z.dtype, jnp.complexfloating):
                return real_fn(z)
            re, im = fn(jnp.real(z), jnp.imag(z))
            return lax.complex(re, im)

        return run

    return complex_fn


def _exp_parts(a, b):
    e = jnp.exp(a)
    # a real z (b == 0, either sign) keeps its imaginary zero: exp(inf + 0j) is inf + 0j
    return jnp.where(b == 0, e, e * jnp.cos(b)), jnp.where(b == 0, b, e * jnp.sin(b))


cexp = _real_parts(_exp_parts)(jnp.exp)


# Note [Hyperbolic functions of large arguments]
# XLA computes cosh(x) as exp(x + log(1/2)) + exp(-x + log(1/2)) (and sinh alike for |x| >= 1):
# the sum x + log(1/2) rounds, so every result past |x| ~ 5 is off by up to ~|x| ulps (cosh(50.0)
# in float32: 1.4e-6 relative, 23 ulps; eager's is within one). Here h = exp(|x| / 2), which is
# exact to half an ulp, and cosh(x) = (h / 2) h + 1 / (2 h h), which has no cancellation and stays
# finite up to cosh's own overflow; sinh takes the difference where |x| >= 1 and XLA's series
# below. Both are within four ulps (float32, measured over [-95, 95]); XLA's were 23 off.


def cosh(x):
    h = jnp.exp(jnp.abs(x) * 0.5)
    return (h * 0.5) * h + (0.5 / h) / h


def sinh(x):
    h = jnp.exp(jnp.abs(x) * 0.5)
    big = jnp.copysign((h * 0.5) * h - (0.5 / h) / h, x)
    return jnp.where(jnp.abs(x) < 1, jnp.sinh(x), big)


def _zmul(x, y):
    """x * y, a zero factor giving a signed zero even by an infinite or NaN one (C99's
    sin(0 + inf j) is 0 + inf j, cos(nan + 0j) nan + 0j; 0 * inf would be NaN)."""
    zero = jnp.copysign(jnp.zeros_like(x), x) * jnp.copysign(jnp.ones_like(y), y)
    return jnp.where((x == 0) | (y == 0), zero, x * y)


csin = _real_parts(lambda a, b: (_zmul(jnp.sin(a), cosh(b)), jnp.cos(a) * sinh(b)))(jnp.sin)
ccos = _real_parts(lambda a, b: (jnp.cos(a) * cosh(b), -_zmul(jnp.sin(a), sinh(b))))(jnp.cos)
csinh = _real_parts(lambda a, b: (sinh(a) * jnp.cos(b), _zmul(jnp.sin(b), cosh(a))))(sinh)
ccosh = _real_parts(lambda a, b: (cosh(a) * jnp.cos(b), _zmul(jnp.sin(b), sinh(a))))(cosh)
