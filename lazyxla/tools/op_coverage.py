"""Op coverage against PyTorch's OpInfo database (`op_db`), and its report.

Every `op_db` entry (an op and its variant) runs its sample inputs on eager CPU and on lazyxla; the
values are compared (and float32 gradients, where the entry supports autograd; bf16/fp16 values
without a tolerance, see Note [Reduced-precision oracle]). Each entry ends in one status:

- ``lowered``: ran natively (no CPU fallback counter moved) and matched;
- ``fallback``: matched, but some aten op ran through the CPU fallback (the ``aten::<op>`` counters
  in ``lazyxla.debug.metrics``), named in the reason;
- ``skipped``: listed in `SKIPS` with a written reason;
- ``fails``: a mismatch, or lazyxla raised where eager CPU did not. A mismatch is never a fallback.

The default sweep is the CI one: the first `DEFAULT_SAMPLES` samples of each entry in its primary
dtype (float32 where supported) and the first `EXTRA_DTYPE_SAMPLES` in each other swept dtype it
supports (bfloat16, float16, int64, bool, float64, complex64, uint8). ``full=True``
(``make test-ops-full``) runs every sample of each.

    python -m lazyxla.tools.op_coverage            # table + totals, writes docs/op_coverage.md
    python -m lazyxla.tools.op_coverage --full     # every sample and dtype (no file written)
    python -m lazyxla.tools.op_coverage -k linalg  # a subset, no file written

The tables of entries not run or run with an allowance (`SKIPS`, `TOLERANCES`, ...) are in
op_coverage_tables.py; the totals and the markdown report in op_coverage_report.py.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Iterable
from typing import Any

import torch

import lazyxla
from lazyxla._src import metrics
from lazyxla._src.writes import non_overlapping_and_dense

from .op_coverage_tables import (  # the entries not run, or run with an allowance
    GRAD_SKIPS,
    KEEP_CPU_ARGS,
    LAYOUT_DIFFERS,
    SIGN_FREE,
    SKIPS,
    TOLERANCES,
    UINT8_TOLERANCES,
    UNDEFINED_VALUES,
)

DEFAULT_SAMPLES = 2
DOC_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "op_coverage.md")
DEV = lazyxla.device()

LOWERED, FALLBACK, SKIPPED, FAILS, NA = "lowered", "fallback", "skipped", "fails", "n/a"


def _dim_arg(pos: int, default: int = -1) -> Any:
    return lambda s: s.args[pos] if len(s.args) > pos else s.kwargs.get("dim", default)


# (values, indices) ops whose index at tied values is unspecified (eager's CPU kernels pick by
# their partial sort): where the indices differ, each of lazyxla's must select eager's value
# along this dim. Ties are common in bf16 and int64.
TIE_FREE_INDICES: dict[str, Any] = {
    "topk": _dim_arg(1),
    "sort": _dim_arg(0),
    "kthvalue": _dim_arg(1),
    "mode": _dim_arg(0),
    "median": _dim_arg(0),
    "nanmedian": _dim_arg(0),
    "max.reduction_with_dim": _dim_arg(0),
    "min.reduction_with_dim": _dim_arg(0),
    "argsort": _dim_arg(0),  # indices only: they must select what eager's select
}


def _indices_select_values(key: str, sample: Any, actual: Any, expected: Any) -> None:
    """Tie-tolerant check of a (values, indices) result (see TIE_FREE_INDICES): the values are
    elements of the input, so they must be exact in any dtype."""
    a, e = _tensors(_to_cpu(actual)), _tensors(expected)
    x = sample.input
    if x.dim() == 0:
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True)
        return
    dim = TIE_FREE_INDICES[key](sample) % x.dim()

    def pick(idx: torch.Tensor) -> torch.Tensor:
        return torch.gather(x, dim, idx if idx.dim() == x.dim() else idx.unsqueeze(dim))

    if len(a) == 1:  # indices only
        assert a[0].shape == e[0].shape, f"shape {a[0].shape}, expected {e[0].shape}"
        torch.testing.assert_close(pick(a[0]), pick(e[0]), rtol=0, atol=0, equal_nan=True)
        return
    assert len(a) == len(e) == 2, "expected (values, indices)"
    torch.testing.assert_close(a[0], e[0], rtol=0, atol=0, equal_nan=True, check_device=False)
    assert a[1].shape == e[1].shape, f"indices shape {a[1].shape}, expected {e[1].shape}"
    picked = pick(a[1]).reshape(e[0].shape)
    torch.testing.assert_close(
        picked, e[0], rtol=0, atol=0, equal_nan=True, msg="indices select other values"
    )


# Note [Reduced-precision oracle]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# bf16/fp16 results get no tolerance: each element must be bit-equal to eager's (NaN equal to
# NaN), or no farther from the float64 result (the op rerun on the same inputs in float64) than
# eager's element is. A flat tolerance (2e-2 for bf16) hid real bugs: a Python scalar rounded to
# bf16 before the op changed ~47% of a product's elements by an ulp. A lowering that rounds where
# eager does not fails; one that keeps more precision than eager (eager rounds a bf16 `addbmm` per
# batch) passes. Integer and bool outputs are exact. The distance of a value x to the float64
# result r (_distance) is |x - r|, with: 0 where x is the correctly rounded r (an overflow to
# +-inf of an |r| at or beyond the dtype's max + half an ulp, or r itself +-inf); infinite where
# one of x, r is NaN and the other is not (NaN agreement: a NaN where eager and float64 have
# numbers fails; a number where eager has NaN and float64 a number passes, eager lost it). An
# element infinitely far from r never passes unless it is eager's. Distances within _TIE * |r| of
# each other are equal: far below an ulp of bf16/fp16, this only resolves a result exactly halfway
# between two neighbours (a linear interpolation's 1/2 weights), which float64's own rounding of
# the rerun would otherwise decide for one of them. There is no tolerance to loosen: where eager
# CPU's own result is no oracle for the device, EAGER_ORACLE changes the sample eager runs, saying
# why.
_REDUCED = (torch.bfloat16, torch.float16)
_TIE = 2.0**-40  # relative: ~2^13 float64 ulps, 2^-32 of a bf16 ulp
# The dtype a sample is rerun in to judge a mismatch with eager (see _no_worse_than_eager).
_WIDER = {
    torch.bfloat16: torch.float64,
    torch.float16: torch.float64,
    torch.float32: torch.float64,
    torch.complex64: torch.complex128,
}


def _lce_device_options(sample: Any) -> Any:
    """The sample with its LinearCrossEntropyOptions resolved as PyTorch resolves them for the
    lazy device (F.linear_cross_entropy's `options._adjust(..., device=input.device)`)."""
    x, args, kwargs = sample
    o = kwargs.get("options")
    if o is None:
        return sample
    w = args[0]
    o = o._adjust(
        num_batches=x.shape[0] if x.dim() == 2 else 1,
        in_features=w.shape[-1],
        num_classes=w.shape[0],
        dtype=x.dtype,
        device=DEV,
    )
    return x, args, {**kwargs, "options": o}


# Entries whose eager CPU result is no oracle for the lazy device as the sample stands: the sample
# eager runs is changed by the function, for the reason given. lazyxla must still be bit-equal to
# that run or no farther from the float64 result (Note [Reduced-precision oracle]).
_LCE_ORACLE = (
    _lce_device_options,
    "PyTorch picks the algorithm by device type: on cpu bf16/fp16 accumulate in float32 "
    "('accurate'), on devices it does not list (jax, as torch_xla's xla) in the input dtype "
    "('compact'); eager runs the options the jax device resolves",
)
EAGER_ORACLE: dict[str, tuple[Any, str]] = {
    "nn.functional.linear_cross_entropy.chunked": _LCE_ORACLE,
    "nn.functional.linear_cross_entropy.chunked_none": _LCE_ORACLE,
}


def _widen(v: Any, dtype: torch.dtype) -> Any:
    """The sample with its `dtype` tensors (and `dtype=` arguments) in the wider dtype; leaves
    that require grad stay leaves that require grad."""
    wide = _WIDER[dtype]
    if isinstance(v, torch.Tensor) and v.dtype == dtype:
        return v.detach().to(wide).requires_grad_(v.requires_grad)
    if isinstance(v, torch.dtype) and v == dtype:
        return wide
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        return type(v)(_widen(x, dtype) for x in v)
    if isinstance(v, dict):
        return {k: _widen(x, dtype) for k, x in v.items()}
    return v


def _distance(x: torch.Tensor, r: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per element, how far `x` (a `dtype` result, as float64) is from the float64 result `r`
    (Note [Reduced-precision oracle])."""
    fi = torch.finfo(dtype)
    overflow = fi.max + math.ldexp(fi.eps, math.frexp(fi.max)[1] - 2)  # max + half an ulp
    rounds_to_inf = x.isinf() & (r.abs() >= overflow) & (x.sign() == r.sign())
    d = (x - r).abs()
    d = torch.where(x.isnan() != r.isnan(), math.inf, d)
    return torch.where((x == r) | rounds_to_inf | (x.isnan() & r.isnan()), 0.0, d)


def _reduced_bad(a: torch.Tensor, e: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, str]:
    """Elements of the bf16/fp16 result `a` that fail Note [Reduced-precision oracle] against
    eager's `e` and the float64 `r`, and a description of the first."""
    dtype = a.dtype
    a, e, r = a.double(), e.double(), r.detach().double()
    same = (a == e) | (a.isnan() & e.isnan())
    da, de = _distance(a, r, dtype), _distance(e, r, dtype)
    bad = ~(same | ((da <= de + _TIE * r.abs()) & da.isfinite()))
    if not bad.any():
        return bad, ""
    i = int(bad.flatten().nonzero()[0])
    pos = [int(j) for j in torch.unravel_index(torch.tensor(i), bad.shape)]
    a, e, r = (t.flatten()[i].item() for t in (a, e, r))
    return bad, f"first at {pos}: {a:.8g}, eager {e:.8g}, float64 {r:.8g}"


def _no_worse_than_eager(
    actual: Any,
    expected: Any,
    reference: Any,
    tol: dict[str, float],
    key: str = "",
) -> None:
    """Eager is not exact either: it rounds where its kernels do (bf16 intermediates, a sum's
    order), which is not where XLA does. Where lazyxla and eager differ, lazyxla passes if each of
    its values is as close to the result in a wider dtype (the op rerun on the same inputs in
    float64) as eager's: a lowering that loses precision eager keeps fails, one that keeps more
    passes. bf16/fp16 outputs without a tolerance (Note [Reduced-precision oracle]), others within
    `tol` (assert_close's default for their dtype if empty) of that bound. Outputs defined up to a
    sign are normalized first, as _compare does."""
    fa, fe, fr = (_normalize(_to_cpu(v), key) for v in (actual, expected, reference))
    fa, fe, fr = _tensors(fa), _tensors(fe), _tensors(fr)
    assert len(fa) == len(fe) == len(fr), "output structure differs"
    for a, e, r in zip(fa, fe, fr):
        assert a.shape == e.shape and a.dtype == e.dtype, (
            f"{a.shape}/{a.dtype}, expected {e.shape}/{e.dtype}"
        )
        assert r.shape == e.shape, f"float64 rerun has shape {r.shape}, eager {e.shape}"
        if not (a.dtype.is_floating_point or a.dtype.is_complex):
            torch.testing.assert_close(a, e, rtol=0, atol=0)
            continue
        if a.dtype in _REDUCED:
            bad, first = _reduced_bad(a, e, r)
            n = int(bad.sum().item())
            assert n == 0, (
                f"{n} / {a.numel()} values not bit-equal to eager's and farther from the "
                f"float64 result ({first})"
            )
            continue
        rtol, atol = _tol_of(a.dtype, tol)
        dtype_max = None if a.dtype.is_complex else torch.finfo(a.dtype).max
        wide = torch.complex128 if a.dtype.is_complex else torch.float64
        a, e, r = a.to(wide), e.to(wide), r.detach().to(wide)
        eager_err = torch.where(e.isnan() & ~r.isnan(), 0.0, (e - r).abs())  # eager lost it
        bound = eager_err + atol + rtol * r.abs()
        ok = ((a - r).abs() <= bound) | (a == e) | (a.isnan() & e.isnan())
        if dtype_max is not None:  # the correctly rounded overflow of a value beyond the range
            ok |= a.isinf() & (r.abs() > dtype_max) & (a.sign() == r.sign())
        bad = (~ok).sum().item()
        assert bad == 0, (
            f"{bad} / {a.numel()} values farther from the {_WIDER.get(fe[0].dtype, 'wider')} "
            f"result than eager's (greatest excess {((a - r).abs() - bound).max().item():.3g})"
        )


def _tol_of(dtype: torch.dtype, tol: dict[str, float]) -> tuple[float, float]:
    if "rtol" in tol:
        return tol["rtol"], tol["atol"]
    from torch.testing._comparison import default_tolerances

    return default_tolerances(dtype)


@dataclasses.dataclass
class Result:
    key: str
    status: str
    reason: str = ""
    grad: str = NA
    grad_reason: str = ""
    seconds: float = 0.0


def key_of(op: Any) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


@functools.cache
def op_db() -> dict[str, Any]:
    """`op_db` by entry key (the first entry wins on a duplicate key)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db as db
    out: dict[str, Any] = {}
    for op in db:
        out.setdefault(key_of(op), op)
    return out


# --- moving samples and comparing results --------------------------------------------------------


def _to_lazy(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        with torch.no_grad():
            out = v.detach().clone().to(DEV)
        return out.requires_grad_(v.requires_grad)
    if isinstance(v, list):
        return [_to_lazy(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_to_lazy(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_lazy(x) for k, x in v.items()}
    if isinstance(v, torch.device) or (isinstance(v, str) and v == "cpu"):
        return DEV
    return v


def _to_cpu(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.detach().cpu() if v.device.type != "cpu" else v.detach()
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        return [_to_cpu(x) for x in v]
    if isinstance(v, dict):
        return {k: _to_cpu(x) for k, x in v.items()}
    return v


def _flat(v: Any) -> list[Any]:
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        return [y for x in v for y in _flat(x)]
    if isinstance(v, dict):
        return [y for x in v.values() for y in _flat(x)]
    return [v]


def _tensors(v: Any) -> list[torch.Tensor]:
    return [t for t in _flat(v) if isinstance(t, torch.Tensor)]


def _clone_cpu(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        out = v.detach().clone()
        return out.requires_grad_(v.requires_grad)
    if isinstance(v, list):
        return [_clone_cpu(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_clone_cpu(x) for x in v)
    if isinstance(v, dict):
        return {k: _clone_cpu(x) for k, x in v.items()}
    return v


# SVD: singular vectors are defined up to a sign per singular value, flipped jointly in U and V.
# Normalized on both sides (U's largest-magnitude entry per column positive) before comparing;
# the value says whether the third output is V (torch.svd) or V^H (linalg.svd).
SVD_SIGN_FREE = {"svd": "V", "linalg.svd": "Vh"}


def _fix_svd_signs(v: Any, kind: str | None) -> Any:
    """(U, S, V or Vh) with the sign of each singular pair fixed; the columns beyond the k
    singular values (full_matrices: any orthonormal basis of a null space) as the projector onto
    the space they span, which is unique."""
    if kind is None or not isinstance(v, (list, tuple)) or len(v) != 3 or v[0].numel() == 0:
        return v
    u, s, w = v
    if u.is_complex():
        return v  # a phase per pair, not a sign: compared as is
    if kind == "Vh":
        w = w.transpose(-1, -2)
    k = s.shape[-1]
    idx = u[..., :k].abs().argmax(dim=-2, keepdim=True)
    sign = torch.sign(torch.gather(u[..., :k], -2, idx))
    sign = torch.where(sign == 0, 1, sign)
    out = [u[..., :k] * sign, s, w[..., :k] * sign]
    for m in (u, w):
        if m.shape[-1] > k:
            extra = m[..., k:]
            out.append(extra @ extra.transpose(-1, -2))
    return out


def _fix_signs(v: Any, which: int | None) -> Any:
    if which is None or not isinstance(v, (list, tuple)) or len(v) <= which:
        return v
    if v[which].numel() == 0:
        return v
    m = v[which]
    idx = m.abs().argmax(dim=-2, keepdim=True)
    sign = torch.sgn(torch.gather(m, -2, idx))
    v = list(v)
    v[which] = m * torch.where(sign == 0, 1, sign).conj()
    return v


def _normalize(v: Any, key: str) -> Any:
    """A result with the choices its entry leaves free (signs of eigen/singular vectors) fixed."""
    return _fix_svd_signs(_fix_signs(v, SIGN_FREE.get(key)), SVD_SIGN_FREE.get(key))


def _compare(
    actual: Any, expected: Any, tol: dict[str, float], values: bool = True, key: str = ""
) -> None:
    actual, expected = _normalize(_to_cpu(actual), key), _normalize(_to_cpu(expected), key)
    if not values:
        fa, fe = _tensors(actual), _tensors(expected)
        assert len(fa) == len(fe), f"{len(fa)} tensors, expected {len(fe)}"
        for a, e in zip(fa, fe):
            assert a.shape == e.shape and a.dtype == e.dtype, (
                f"{a.shape}/{a.dtype}, expected {e.shape}/{e.dtype}"
            )
        return
    torch.testing.assert_close(actual, expected, equal_nan=True, check_device=False, **tol)
    for a, e in zip(_tensors(actual), _tensors(expected)):
        if a.dtype in _REDUCED:  # no tolerance: Note [Reduced-precision oracle]
            torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True, check_device=False)


def compare_layouts(actual: Any, expected: Any) -> None:
    """A dense output keeps eager's strides (a transposed result, channels_last); strides of
    size-1 dimensions are free, and a strided slice may come back dense."""
    for a, e in zip(_tensors(actual), _tensors(expected)):
        if e.numel() <= 1 or not non_overlapping_and_dense(e):
            continue
        sa = [st for n, st in zip(a.shape, a.stride()) if n > 1]
        se = [st for n, st in zip(e.shape, e.stride()) if n > 1]
        if sa != se:
            raise AssertionError(f"strides {tuple(a.stride())}, eager's {tuple(e.stride())}")


def _fallbacks() -> dict[str, int]:
    return {
        n: metrics.counter_value(n) or 0
        for n in metrics.counter_names()
        if n[:6] == "aten::" and n not in metrics.READS_NOT_FALLBACKS  # `.item()` is a read
    }


def _moved(before: dict[str, int]) -> list[str]:
    return sorted(n[6:] for n, v in _fallbacks().items() if v != before.get(n, 0))


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else ""
    for line in msg:  # assert_close puts the useful line second
        if "Mismatched elements" in line or "Greatest" in line:
            first = f"{first} {line.strip()}"
            break
    return f"{type(e).__name__}: {first}"[:200]


# Swept dtypes: the first is the entry's primary one (float32 where supported), the others run
# too where the entry supports them. The default sweep runs DEFAULT_SAMPLES samples of the primary
# dtype and EXTRA_DTYPE_SAMPLES of each other; the full sweep every sample of each.
_PRIMARY = (torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.complex64)
_SWEPT = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.bool,
    torch.float64,
    torch.complex64,
    torch.uint8,
)
EXTRA_DTYPE_SAMPLES = 1


def _plan(op: Any, full: bool) -> list[tuple[torch.dtype, int | None]]:
    """(dtype, number of samples or None for all) to run for an entry."""
    supported = op.supported_dtypes("cpu")
    primary = next((d for d in _PRIMARY if d in supported), None)
    if primary is None:
        return []
    plan = [(primary, None if full else DEFAULT_SAMPLES)]
    for d in _SWEPT:
        if d in supported and d != primary:
            plan.append((d, None if full else EXTRA_DTYPE_SAMPLES))
    return plan


@contextlib.contextmanager
def _no_test_fn_lookup() -> Any:
    """OpInfo's sample iterators look for the running unittest method with `inspect.stack()`,
    and the list of frames they keep is a reference cycle through every caller's frame: this
    tool's frames, with their lazy tensors, stayed alive (still pending) until the cyclic
    collector ran, and a later sync of the same process ran them as part of its graph (an extra
    compile, in whichever test came next). Outside unittest the lookup finds nothing anyway."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    saved = common_utils.extract_test_fn, core.extract_test_fn
    common_utils.extract_test_fn = core.extract_test_fn = lambda: None
    try:
        yield
    finally:
        common_utils.extract_test_fn, core.extract_test_fn = saved


def _samples(op: Any, dtype: torch.dtype, requires_grad: bool, n: int | None) -> list[Any]:
    torch.manual_seed(0)
    out = []
    with warnings.catch_warnings(), _no_test_fn_lookup():
        warnings.simplefilter("ignore")
        for i, s in enumerate(op.sample_inputs("cpu", dtype, requires_grad=requires_grad)):
            if n is not None and i >= n:
                break
            out.append(s)
    return out


def _call(op: Any, s: Any) -> Any:
    return op(s.input, *s.args, **s.kwargs)


def _rerun_wide(op: Any, s: Any, dtype: torch.dtype) -> tuple[Any, Any]:
    """The pristine sample `s` in the wider dtype (_WIDER) after the op ran on it, and the op's
    result: the reference of _no_worse_than_eager."""
    wide_s = _widen((s.input, s.args, s.kwargs), dtype)
    return wide_s, op(wide_s[0], *wide_s[1], **wide_s[2])


# Note [One graph per entry]
# Compiling dominates the sweep (~55 ms of XLA per graph against a few ms of recording), so an
# entry records every sample first and reads the results afterwards: the first read runs all of
# them as one graph (Note [What a value read syncs]), where a sync per sample compiled one graph
# each. The replays (Note [Recording plans]) are recorded once those values are read, so they form
# a second graph of the same program on fresh copies of the inputs: a compile cache hit when each
# replay recorded what its first call did, and then bit-equal by construction. (In one graph with
# the first calls they would not be: XLA may vectorize two copies of an op differently, and
# polygamma's two results then differ in the last bit.) The check is the same as one sample at a
# time: each sample's values, layouts and inputs are compared on their own and in order, and the
# first failure is the one reported. A sample whose graph fails to compile or run does not hide
# the others' values: the read marks only the failing tensors failed, so the error surfaces at
# that sample's read, with its name.


@dataclasses.dataclass
class _Case:
    """One forward sample of an entry (Note [One graph per entry])."""

    where: str
    dtype: torch.dtype
    sample: Any
    cpu_s: Any
    lazy_s: Any
    expected: Any
    tol: dict[str, float]
    actual: Any = None
    actual_cpu: Any = None
    inputs_cpu: Any = None
    again: Any = None  # the replayed call's result, or None
    error: str | None = None


def _record_forward(
    op: Any, key: str, full: bool, dtypes: Iterable[torch.dtype] | None
) -> list[_Case]:
    """Every sample's eager result and lazy recording, nothing read back."""
    cases = []
    for dtype, n in _plan(op, full):
        if dtypes is not None and dtype not in dtypes:
            continue
        # float32's tolerances; bf16/fp16 outputs get none (Note [Reduced-precision oracle])
        tol = {} if dtype in _REDUCED else dict(TOLERANCES.get(key, ({}, ""))[0])
        if dtype == torch.uint8 and key in UINT8_TOLERANCES:
            tol = {"rtol": 0, "atol": UINT8_TOLERANCES[key][0]}
        for i, s in enumerate(_samples(op, dtype, False, n)):
            cpu_s = _clone_cpu((s.input, s.args, s.kwargs))
            if key in EAGER_ORACLE:
                cpu_s = EAGER_ORACLE[key][0](cpu_s)
            if key in KEEP_CPU_ARGS:
                lazy_s = (_to_lazy(s.input), _clone_cpu(s.args), _clone_cpu(s.kwargs))
            else:
                lazy_s = _to_lazy((s.input, s.args, s.kwargs))
            try:
                expected = op(cpu_s[0], *cpu_s[1], **cpu_s[2])
            except Exception:
                continue  # eager rejects the sample (an error-input case): nothing to compare
            if any(t.dtype == torch.complex32 for t in _tensors(expected)):
                continue  # complex32 (an fp16 pair) has no XLA dtype: cannot live on the device
            c = _Case(f"{dtype} sample {i}", dtype, s, cpu_s, lazy_s, expected, tol)
            cases.append(c)
            try:
                c.actual = op(lazy_s[0], *lazy_s[1], **lazy_s[2])
            except Exception as e:
                c.error = f"{c.where}: {_short(e)}"
    return cases


def _read_and_replay(op: Any, key: str, cases: list[_Case]) -> None:
    """Each case's values read back, then its call replayed on fresh device copies (Note
    [Recording plans]: the same call again replays the plan the first call made, which must
    record what the slow path did)."""
    for c in cases:
        if c.error is None:
            try:
                c.actual_cpu = _to_cpu(c.actual)
                c.inputs_cpu = _to_cpu(c.lazy_s)
            except Exception as e:
                c.error = f"{c.where}: {_short(e)}"
    if key in KEEP_CPU_ARGS or key in UNDEFINED_VALUES or key in TIE_FREE_INDICES:
        return
    for c in cases:
        if c.error is None:
            s = c.sample
            replay = _to_lazy(_clone_cpu((s.input, s.args, s.kwargs)))
            try:
                c.again = op(replay[0], *replay[1], **replay[2])
            except Exception as e:
                c.error = f"{c.where}, recorded again: {_short(e)}"


def _check_forward(
    op: Any, key: str, full: bool, dtypes: Iterable[torch.dtype] | None = None
) -> tuple[str, str, set[str]]:
    """(status, reason, fallback ops) of the forward values."""
    values = key not in UNDEFINED_VALUES
    before = _fallbacks()
    cases = _record_forward(op, key, full, dtypes)
    _read_and_replay(op, key, cases)
    fell = set(_moved(before))
    for c in cases:  # in order: the first failure is the one reported
        if c.error is not None:
            return FAILS, c.error, fell
        where, tol, s, dtype = c.where, c.tol, c.sample, c.dtype
        actual_cpu, inputs_cpu, expected, cpu_s = c.actual_cpu, c.inputs_cpu, c.expected, c.cpu_s
        if c.again is not None:
            try:
                _compare(_to_cpu(c.again), actual_cpu, {"rtol": 0, "atol": 0}, values, key)
            except Exception as e:
                return FAILS, f"{where}, recorded again: {_short(e)}", fell
        wide = None  # (the sample in the wider dtype after the call, the result)
        try:
            try:
                _compare(actual_cpu, expected, tol, values, key)
            except AssertionError:
                if key in TIE_FREE_INDICES:
                    _indices_select_values(key, s, actual_cpu, expected)
                    continue
                if dtype not in _WIDER or not values:
                    raise
                wide = _rerun_wide(op, s, dtype)
                _no_worse_than_eager(actual_cpu, expected, wide[1], tol, key)
        except Exception as e:
            return FAILS, f"{where}: {_short(e)}", fell
        if key not in LAYOUT_DIFFERS:
            try:
                compare_layouts(actual_cpu, expected)
            except AssertionError as e:
                return FAILS, f"{where}: {_short(e)}", fell
        try:  # in-place ops: the mutated inputs must match too
            try:
                _compare(_tensors(inputs_cpu), _tensors(cpu_s), tol, values)
            except AssertionError:
                if dtype not in _WIDER or not values:
                    raise
                wide = wide or _rerun_wide(op, s, dtype)
                _no_worse_than_eager(_tensors(inputs_cpu), _tensors(cpu_s), _tensors(wide[0]), tol)
        except Exception as e:
            return FAILS, f"{where} (inputs after the call): {_short(e)}", fell
    if not cases:
        return SKIPPED, "no sample runs on eager CPU", fell
    if fell:
        return FALLBACK, "CPU fallback: " + ", ".join(sorted(fell)), fell
    return LOWERED, "", fell


def eager_grads(op: Any, s: Any, cpu_s: Any, seed: int) -> tuple[list, list, tuple] | None:
    """Eager's float32 gradients of grad sample `s` (run on its copy `cpu_s`): the differentiable
    outputs, the random cotangents (seeded by `seed`) and the gradients of the inputs that require
    grad; None where eager rejects the sample or there is nothing to differentiate."""
    wrt = [t for t in _tensors(cpu_s) if t.requires_grad]
    try:
        out = s.output_process_fn_grad(op(cpu_s[0], *cpu_s[1], **cpu_s[2]))
        outs = [o for o in _tensors(out) if o.requires_grad]
        if not wrt or not outs:
            return None
        g = torch.Generator().manual_seed(seed)
        cot = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
        return outs, cot, torch.autograd.grad(outs, wrt, cot, allow_unused=True)
    except Exception:
        return None


def compare_grads(
    op: Any, s: Any, actual: list, expected: tuple, cot: list, tol: dict[str, float]
) -> None:
    """lazyxla's gradients against eager's, as values are compared: within `tol`, or else no
    farther from the float64 gradients than eager's (_no_worse_than_eager). Raises
    AssertionError."""
    pairs = [_zeros_for_none(a, e) for a, e in zip(actual, expected)]
    pairs = [(a, e) for a, e in pairs if e is not None]
    try:
        for a, e in pairs:
            _compare(a, e, tol)
    except AssertionError:
        wide_s = _widen((s.input, s.args, s.kwargs), torch.float32)
        out_w = s.output_process_fn_grad(op(wide_s[0], *wide_s[1], **wide_s[2]))
        outs_w = [o for o in _tensors(out_w) if o.requires_grad]
        wrt_w = [t for t in _tensors(wide_s) if t.requires_grad]
        grads_w = torch.autograd.grad(
            outs_w, wrt_w, [c.to(o.dtype) for c, o in zip(cot, outs_w)], allow_unused=True
        )
        pairs_w = [_zeros_for_none(w, e) for w, e in zip(grads_w, expected)]
        _no_worse_than_eager(
            [a for a, _ in pairs],
            [e for _, e in pairs],
            [w for w, e in pairs_w if e is not None],
            tol,
        )


def _check_grad(op: Any, key: str, full: bool) -> tuple[str, str]:
    if not op.supports_autograd or torch.float32 not in op.supported_backward_dtypes("cpu"):
        return NA, ""
    if key in GRAD_SKIPS:
        return SKIPPED, GRAD_SKIPS[key]
    if key in UNDEFINED_VALUES:
        return NA, ""
    n = None if full else DEFAULT_SAMPLES
    tol = dict(TOLERANCES.get(key, ({}, ""))[0])
    fell: set[str] = set()
    # Phase 1 records every sample's backward, phase 2 reads them back (Note [One graph per entry]).
    cases: list[tuple[str, Any, Any, tuple, list]] = []
    for i, s in enumerate(_samples(op, torch.float32, True, n)):
        where = f"grad sample {i}"
        cpu_s = _clone_cpu((s.input, s.args, s.kwargs))
        if key in KEEP_CPU_ARGS:
            lazy_s = (_to_lazy(cpu_s[0]), _clone_cpu(cpu_s[1]), _clone_cpu(cpu_s[2]))
        else:
            lazy_s = _to_lazy(cpu_s)
        eager = eager_grads(op, s, cpu_s, i)
        if eager is None:
            continue
        outs_c, cot, grads_c = eager
        wrt_l = [t for t in _tensors(lazy_s) if t.requires_grad]
        before = _fallbacks()
        try:
            out_l = s.output_process_fn_grad(op(lazy_s[0], *lazy_s[1], **lazy_s[2]))
            outs_l = [o for o in _tensors(out_l) if o.requires_grad]
            if len(outs_l) != len(outs_c):
                return (
                    FAILS,
                    f"{where}: {len(outs_l)} differentiable outputs, eager has {len(outs_c)}",
                )
            grads_l = torch.autograd.grad(
                outs_l, wrt_l, [c.to(DEV) for c in cot], allow_unused=True
            )
        except Exception as e:
            return FAILS, f"{where}: {_short(e)}"
        fell.update(_moved(before))
        cases.append((where, s, grads_l, grads_c, cot))
    for where, s, grads_l, grads_c, cot in cases:
        try:
            grads_cpu = [None if x is None else x.cpu() for x in grads_l]
            compare_grads(op, s, grads_cpu, grads_c, cot, tol)
        except Exception as e:
            return FAILS, f"{where}: {_short(e)}"
    if not cases:
        return NA, ""
    if fell:
        return FALLBACK, "CPU fallback: " + ", ".join(sorted(fell))
    return LOWERED, ""


def _zeros_for_none(a: Any, b: Any) -> tuple[Any, Any]:
    """An unused input's gradient (None) as zeros, when the other side has one."""
    if a is None and b is not None:
        a = torch.zeros_like(b)
    if b is None and a is not None:
        b = torch.zeros_like(a)
    return a, b


def run_entry(
    key: str,
    full: bool = False,
    grad: bool = True,
    dtypes: Iterable[torch.dtype] | None = None,
) -> Result:
    """Classify one `op_db` entry (see the module docstring)."""
    if key in SKIPS:
        return Result(key, SKIPPED, SKIPS[key])
    op = op_db()[key]
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        status, reason, _ = _check_forward(op, key, full, dtypes)
        grad = grad and (dtypes is None or torch.float32 in dtypes)
        g, g_reason = NA, ""
        if grad and status in (LOWERED, FALLBACK):
            g, g_reason = _check_grad(op, key, full)
    return Result(key, status, reason, g, g_reason, time.perf_counter() - t0)


def sweep(
    keys: Iterable[str] | None = None,
    full: bool = False,
    progress: bool = False,
    log: str | None = None,
    dtypes: Iterable[torch.dtype] | None = None,
) -> list[Result]:
    """Run the entries. With ``log``, each result is appended to that JSON-lines file as soon as
    it is known and entries already in it are not rerun: a long sweep that dies (out of memory, a
    crash in XLA) resumes where it stopped."""
    keys = list(op_db()) if keys is None else list(keys)
    done = read_log(log) if log else {}
    results = []
    for i, k in enumerate(keys):
        if k in done:
            results.append(done[k])
            continue
        if progress:
            print(f"[{i + 1}/{len(keys)}] {k}", file=sys.stderr, flush=True)
        r = run_entry(k, full, dtypes=dtypes)
        results.append(r)
        if log:
            with open(log, "a") as f:
                f.write(json.dumps(dataclasses.asdict(r)) + "\n")
    return results


def read_log(path: str) -> dict[str, Result]:
    """The results a ``sweep(log=path)`` has written (a torn last line is ignored)."""
    out: dict[str, Result] = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            try:
                r = Result(**json.loads(line))
            except (json.JSONDecodeError, TypeError):
                continue
            out[r.key] = r
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lazyxla.tools.op_coverage")
    p.add_argument("--full", action="store_true", help="every sample, every dtype")
    p.add_argument("-k", default=None, help="only entries whose key contains this substring")
    p.add_argument("--no-write", action="store_true", help="do not write docs/op_coverage.md")
    p.add_argument("--progress", action="store_true")
    p.add_argument(
        "--log",
        default=None,
        help="append each result to this JSON-lines file; entries already in it are not rerun",
    )
    p.add_argument(
        "--dtype",
        action="append",
        default=None,
        help="only this dtype (repeatable; e.g. float16); gradients only with float32",
    )
    args = p.parse_args(argv)
    from .op_coverage_report import print_table, render_markdown  # (it imports this module)

    keys = [k for k in op_db() if args.k is None or args.k in k]
    dtypes = None if args.dtype is None else [getattr(torch, d) for d in args.dtype]
    t0 = time.perf_counter()
    results = sweep(keys, full=args.full, progress=args.progress, log=args.log, dtypes=dtypes)
    print_table(results)
    print(f"swept {len(results)} entries in {time.perf_counter() - t0:.0f}s")
    if not (args.full or args.k or args.no_write or args.dtype):
        with open(DOC_PATH, "w") as f:
            f.write(render_markdown(results))
        print(f"wrote {os.path.normpath(DOC_PATH)}")
    return 1 if any(r.status == FAILS or r.grad == FAILS for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
