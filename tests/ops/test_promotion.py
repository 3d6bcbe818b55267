"""Type promotion of binary pointwise ops against eager: every op on every pair of operands drawn
from tensors of ten dtypes, 0-d CPU tensors (units too), 0-d device tensors and Python scalars,
both orders. Each call must give eager's dtype and values, or raise eager's exception type where
eager raises. It found `uint8_tensor / -3` dividing by 253 (Note [Integer scalars of floating
results]), `uint8_tensor // torch.tensor(-12, dtype=torch.int8, device=dev)` dividing by -12 where
eager divides by 244 (Note [Zero-dim operands]), `bool * inf`
giving 0 (Note [Booleans times a value]), `bool_tensor / 0.0` giving 0 where eager divides 0 by 0,
a complex division by zero giving NaN + NaNj, and dozens of calls eager refuses that lazyxla
computed (Note [Eager probes of pointwise ops]). The known differences are listed in KNOWN with
their reason; anything else fails. The default run takes every op with a subset of the operands;
the full grid is marked slow (about 1.5 min)."""

from __future__ import annotations

import warnings

import pytest
import torch
from util import DEV

TENSORS = {
    "i64": torch.tensor([-3, 0, 2, 5]),
    "i32": torch.tensor([-3, 0, 2, 5], dtype=torch.int32),
    "u8": torch.tensor([0, 3, 200, 255], dtype=torch.uint8),
    "i8": torch.tensor([-128, -1, 3, 127], dtype=torch.int8),
    "bool": torch.tensor([True, False, True, False]),
    "f32": torch.tensor([-1.5, 0.0, 2.25, 7.0]),
    "f16": torch.tensor([-1.5, 0.0, 2.25, 7.0], dtype=torch.float16),
    "bf16": torch.tensor([-1.5, 0.0, 2.25, 7.0], dtype=torch.bfloat16),
    "f64": torch.tensor([-1.5, 0.0, 2.25, 7.0], dtype=torch.float64),
    "c64": torch.tensor([1 + 1j, -2j, 0.5, 3 - 1j], dtype=torch.complex64),
}
SCALARS = {"2": 2, "-3": -3, "2.5": 2.5, "-0.75": -0.75, "True": True, "300": 300, "1j": 1j}
ZERO_D = {
    "0d_f64": torch.tensor(2.5, dtype=torch.float64),
    "0d_i64": torch.tensor(3),
    "0d_f16": torch.tensor(1.5, dtype=torch.float16),
    "0d_bool": torch.tensor(True),
    # units: baked into the graph as numbers (bool / 0.0 gave 0 for False; complex / 0 NaN)
    "0d_f64_0": torch.tensor(0.0, dtype=torch.float64),
    "0d_i64_1": torch.tensor(1),
    "0d_u8_1": torch.tensor(1, dtype=torch.uint8),
}
# 0-d tensors on the device: eager converts them to the common dtype, in which they count less
# than a dimensioned tensor (Note [Zero-dim operands]): uint8 // int8(-12) divides by 244.
DEVICE_ZERO_D = {
    "dev0d_i8": torch.tensor(-12, dtype=torch.int8),
    "dev0d_i64": torch.tensor(-3),
    "dev0d_f32": torch.tensor(0.3),
    "dev0d_f64": torch.tensor(1.0 / 3.0, dtype=torch.float64),
    "dev0d_bool": torch.tensor(True),
}
# The default run's operands: every dtype category and every kind of operand, fewer of each.
QUICK = {"i64", "u8", "bool", "f32", "bf16", "c64", "-3", "2.5", "300", "0d_f64", "0d_bool"}
QUICK |= {"0d_f64_0", "dev0d_i8", "dev0d_f32"}

_MASK = [True, False, True, True]
OPS = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "true_divide": torch.true_divide,
    "floor_divide": torch.floor_divide,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "pow": torch.pow,
    "float_power": torch.float_power,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "fmax": torch.fmax,
    "fmin": torch.fmin,
    "eq": torch.eq,
    "lt": torch.lt,
    "atan2": torch.atan2,
    "hypot": torch.hypot,
    "copysign": torch.copysign,
    "nextafter": torch.nextafter,
    "xlogy": torch.xlogy,
    "ldexp": torch.ldexp,
    "heaviside": torch.heaviside,
    "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor,
    "bitwise_left_shift": torch.bitwise_left_shift,
    "logical_and": torch.logical_and,
    "rsub": torch.rsub,
    "where": lambda a, b: torch.where(torch.tensor(_MASK, device=_device(a, b)), a, b),
    "clamp_min": lambda a, b: torch.clamp(a, min=b),
    "clamp_max": lambda a, b: torch.clamp(a, max=b),
    "addcmul": lambda a, b: torch.addcmul(a, a, b) if isinstance(b, torch.Tensor) else a,
}


def _device(a, b):
    return next(x.device for x in (a, b) if isinstance(x, torch.Tensor) and x.dim())


# Known differences, each recognised precisely (by eager's or lazyxla's error, or by the operands);
# anything else fails.
def _known(op: str, a: str, b: str, ref_err, got_err, ref, got, x, y) -> str | None:
    if ref_err is not None and got_err is None:
        msg = str(ref_err)
        if msg == "ZeroDivisionError":
            return "integer division by a tensor holding 0 raises only in eager (README)"
        if "negative integer powers" in msg or "without overflow" in msg:
            # the signature's first call raises eager's error; a later call with another value
            # reuses its recording plan (Note [Eager probes of pointwise ops])
            return "value-dependent check of a lifted scalar"
        if op == "ldexp":
            return "ldexp is a composite; eager's kernel refuses a bool exponent"
    if got_err is not None and ref_err is None:
        msg = str(got_err)
        if "complex32" in msg:
            return "float16 and a complex scalar make complex32, which XLA lacks (TypeError)"
        if "Expected a value of type 'Tensor' for argument 'self'" in msg:
            return "a Python scalar as `self` (Scalar_Tensor overloads) raises"
        if op == "ldexp" and "two devices" in msg:
            return "ldexp's composite refuses a CPU 0-d `self` beside a device tensor"
    if op == "ldexp" and got_err is not None and "two devices" in str(got_err):
        return "ldexp's composite refuses a CPU 0-d `self` beside a device tensor"
    if ref_err is not None and got_err is not None:
        if "Expected a value of type 'Tensor' for argument 'self'" in str(got_err):
            return "a Python scalar as `self` raises (another exception type than eager's)"
    if ref is not None and got is not None:
        if (op, a, b) == ("pow", "bool", "True"):
            return "eager's CPU kernel returns bool, its meta kernel int64"
        if op == "ldexp":
            return "eager computes x * 2**e (0 * inf = NaN); XLA flushes 2**-128 (README)"
    return None


def _operands(quick: bool):
    others = {**{"t:" + k: v for k, v in TENSORS.items()}, **SCALARS, **ZERO_D, **DEVICE_ZERO_D}
    for an, a in TENSORS.items():
        if quick and an not in QUICK:
            continue
        for bn, b in others.items():
            if quick and bn.removeprefix("t:") not in QUICK:
                continue
            yield (an, a, bn, b)
            yield (bn, b, an, a)


def _lazy(v):
    on_device = isinstance(v, torch.Tensor) and (v.dim() or _is_device_zero_d(v))
    return v.to(DEV) if on_device else v


def _is_device_zero_d(v: torch.Tensor) -> bool:
    return any(v is t for t in DEVICE_ZERO_D.values())


def _same(r: torch.Tensor, g: torch.Tensor) -> bool:
    if r.dtype != g.dtype or r.shape != g.shape:
        return False
    if r.is_floating_point() or r.is_complex():
        wide = torch.complex128 if r.is_complex() else torch.float64
        # (complex64 pow of a complex scalar: eager goes through exp(y log x), 6e-6 off)
        tol = {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.complex64: 1e-5}.get(r.dtype, 1e-6)
        return torch.allclose(r.to(wide), g.to(wide), rtol=tol, atol=tol, equal_nan=True)
    return torch.equal(r, g)


def _sweep(op_name: str, quick: bool) -> list[str]:
    op = OPS[op_name]
    calls = []
    # Every call is recorded before any is read: the first read runs them all as one graph (a
    # compile per call made this file the suite's slowest); a call whose graph fails still raises
    # at its own read (Note [What a value read syncs]).
    for an, a, bn, b in _operands(quick):
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            continue
        try:
            ref, ref_err = op(a, b), None
        except Exception as e:
            ref, ref_err = None, e
        try:
            got, got_err = op(_lazy(a), _lazy(b)), None
        except Exception as e:
            got, got_err = None, e
        calls.append((an, a, bn, b, ref, ref_err, got, got_err))
    bad = []
    for an, a, bn, b, ref, ref_err, got, got_err in calls:
        try:
            got = got.cpu() if isinstance(got, torch.Tensor) else got
        except Exception as e:
            got, got_err = None, e
        if ref_err is not None or got_err is not None:
            same = ref_err is not None and isinstance(got_err, type(ref_err))
        else:
            same = _same(ref, got)
        names = (op_name, an.removeprefix("t:"), bn.removeprefix("t:"))
        if not same and _known(*names, ref_err, got_err, ref, got, a, b) is None:
            bad.append(f"{op_name}({an}, {bn}): eager {ref_err!r} {ref}, lazyxla {got_err!r} {got}")
    return bad


@pytest.mark.parametrize("quick", [True, pytest.param(False, marks=pytest.mark.slow)])
@pytest.mark.parametrize("op_name", list(OPS))
def test_binary_promotion_like_eager(op_name, quick):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad = _sweep(op_name, quick)
    assert not bad, "\n".join(bad)


U8 = torch.tensor([5, 19, 4, 200, 3], dtype=torch.uint8)
I8 = torch.tensor([1, -2, 3, -4, 5], dtype=torch.int8)
# Powers whose bf16 results lie >= 0.12 ulp from a rounding boundary: eager's (exponent rounded
# to bf16 first) and the float32 exponent's differ by an ulp, any CPU's pow by far less.
BF16 = torch.tensor([4096.0, 65536.0, 2.0**-12, 1e6, 0.001], dtype=torch.bfloat16)
CASES = {
    "floor_divide_ by a 0-d int8": (U8, lambda x, d: x.floor_divide_(torch.tensor(-12, **d))),
    "maximum out= with a 0-d int8": (
        U8,
        lambda x, d: torch.maximum(x, torch.tensor(-12, **d), out=x),
    ),
    "pow_ by a 0-d int64": (U8, lambda x, d: x.pow_(torch.tensor(-3, device=d["device"]))),
    "lt with a 0-d int8": (U8, lambda x, d: x.lt(torch.tensor(-12, **d)).to(torch.uint8)),
    "pow_ of bf16 by a 0-d float32": (
        BF16,
        lambda x, d: x.pow_(torch.tensor(0.3, device=d["device"])),
    ),
    "lerp by a 0-d uint8 weight": (
        torch.tensor([-4.0, 1.0, 2.5]),
        lambda x, d: x.lerp_(x * 2, torch.tensor(200, dtype=torch.uint8, device=d["device"])),
    ),
    "lerp of bf16 by a 0-d float32 weight": (
        BF16,
        lambda x, d: x.lerp_(x * 3, torch.tensor(0.3, device=d["device"])),
    ),
    "_foreach_mul_ of float32 by a 0-d float64": (
        torch.tensor([-46.1174, 26.6224, -30.9197, 25.8316, 7.0]),
        lambda x, d: torch._foreach_mul_([x], torch.tensor(1 / 3, dtype=torch.float64, **_on(d))),
    ),
    "_foreach_mul_ of bf16 by a 0-d float32": (  # (7 * 0.3 and 7 * bf16(0.3) round apart)
        torch.tensor([7.0, -1.5, 2.25, 3.0, 11.0], dtype=torch.bfloat16),
        lambda x, d: torch._foreach_mul_([x], torch.tensor(0.3, **_on(d))),
    ),
    "_foreach_pow of int32 to the 200th": (
        torch.tensor([3, -7, 12, 5, 2], dtype=torch.int32),
        lambda x, d: x.copy_(torch._foreach_pow([x], 200)[0]),
    ),
    "isin of uint8 elements and a 0-d int8": (
        torch.tensor([244, 5, 12, 255], dtype=torch.uint8),
        lambda x, d: torch.isin(x, torch.tensor(-12, **d)),
    ),
    "addcmul_ of int8 tensors into uint8, value 0.5": (
        U8,
        lambda x, d: x.addcmul_(I8.to(d["device"]), I8.to(d["device"]), value=0.5),
    ),
}


def _on(d: dict) -> dict:
    return dict(device=d["device"])


@pytest.mark.parametrize("case", list(CASES))
def test_zero_dim_operands_beyond_the_sweep_like_eager(case):
    """0-d device operands (Note [Zero-dim operands]) of in-place and out= forms, foreach ops,
    lerp's weight and isin; and a float value of an integer op whose operands promote to another
    integer dtype (converted to it as eager's `value.to<scalar_t>()` does, not computed in
    float)."""
    start, op = CASES[case]
    ref = start.clone()
    ref_out = op(ref, dict(dtype=torch.int8, device="cpu"))
    got = start.to(DEV)
    got_out = op(got, dict(dtype=torch.int8, device=DEV))
    for r, g in ((ref, got), (ref_out, got_out)):  # the tensor written, and what the op returns
        if isinstance(r, torch.Tensor):
            assert g.dtype == r.dtype
            torch.testing.assert_close(g.cpu(), r, rtol=0, atol=0, equal_nan=True)
