"""torch_xla's argument checks, with torch_xla's messages.

# Note [torch_xla's error messages]
An op's bad arguments are found by PyTorch's meta kernel when the op is recorded (meta.py's
`infer_layout`), so by default the message is eager PyTorch's. torch_xla checks some ops itself
first and says more (the shapes involved, in XLA's `f32[2,3]` notation, and what would fix it);
its tests compare those messages exactly (test/test_ops_error_message.py). The checks here make
the same decisions and raise the same `RuntimeError`s. They are registered in meta.py's
`_EAGER_CHECKS`, which runs only on a miss of the meta cache: a signature that records once never
pays for them again, and a failing signature never enters the cache. Each check only raises where
the meta kernel would raise too (or where eager would), so no program that runs eagerly fails
here.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._ops import OpOverload

from . import meta
from .ir import _SHORT_DTYPE

aten = torch.ops.aten


def _shape(t: torch.Tensor) -> str:
    """`f32[2,3]`: a tensor's type as torch_xla prints it in messages."""
    dt = _SHORT_DTYPE.get(t.dtype, str(t.dtype).replace("torch.", ""))
    return f"{dt}[{','.join(str(d) for d in t.shape)}]"


def _ordinal(i: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(i, f"{i}th")


def _fail(msg: str) -> None:
    raise RuntimeError(msg)


def _check_add(op: OpOverload, vals: list[Any]) -> None:
    a, b = vals[0], vals[1]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return
    # the aligned trailing dimensions, from the left (the first mismatch torch_xla reports)
    for i in range(min(a.dim(), b.dim()), 0, -1):
        x, y = a.shape[-i], b.shape[-i]
        if x != y and x != 1 and y != 1:
            _fail(
                f"Shapes are not compatible for broadcasting: {_shape(a)} vs. {_shape(b)}. "
                f"Expected dimension {a.dim() - i} of shape {_shape(a)} ({x}) to match dimension "
                f"{b.dim() - i} of shape {_shape(b)} ({y}). Either that or that any of them is "
                "either 1 or unbounded. Try reshaping one of the tensors to match the other."
            )


def _check_cat(op: OpOverload, vals: list[Any]) -> None:
    tensors, dim = vals[0], vals[1]
    tensors = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]
    if not tensors:
        return
    first = tensors[0]
    d = dim + first.dim() if dim < 0 else dim
    for t in tensors[1:]:
        if t.dim() != first.dim():
            continue  # PyTorch's own message (a rank mismatch)
        if any(i != d and x != y for i, (x, y) in enumerate(zip(first.shape, t.shape))):
            _fail(
                f"cat(): cannot concatenate tensors of shape {_shape(t)} with {_shape(first)} at "
                f"dimension {dim}. Expected shapes to be equal (except at dimension {dim}) or that "
                "either of them was a 1D empty tensor of size (0,)."
            )


def _check_div(op: OpOverload, vals: list[Any]) -> None:
    mode = vals[2]
    if mode is not None and mode not in ("trunc", "floor"):
        _fail(
            f"div(): invalid rounding mode `{mode}`. Expected it to be either 'trunc', 'floor', or "
            "be left unspecified."
        )


def _check_flip(op: OpOverload, vals: list[Any]) -> None:
    x, dims = vals[0], list(vals[1])
    n = max(x.dim(), 1)
    wrapped = [d + n if d < 0 else d for d in dims]
    counts = collections.Counter(wrapped)
    dup = sorted(d for d, c in counts.items() if c > 1)
    if dup:
        found = ", ".join(f"{d} ({counts[d]} times)" for d in dup)
        _fail(
            f"flip(): expected each dimension to appear at most once. Found dimensions: {found}. "
            f"Consider changing dims from {dims} to {sorted(counts)}."
        )


def _check_flip_range(op: OpOverload, vals: list[Any]) -> None:
    """torch_xla wraps flip's dims with a RuntimeError where eager raises IndexError."""
    x, dims = vals[0], list(vals[1])
    n = max(x.dim(), 1)
    for d in dims:
        if not -n <= d < n:
            _fail(f"Value out of range (expected to be in range of [{-n}, {n - 1}], but got {d})")
    _check_flip(op, vals)


def _check_min_max_dim(op: OpOverload, vals: list[Any]) -> None:
    """torch_xla raises RuntimeError (eager: IndexError) for a reduction over an empty dim."""
    x, dim = vals[0], vals[1]
    if not isinstance(x, torch.Tensor) or not isinstance(dim, int) or x.dim() == 0:
        return
    if -x.dim() <= dim < x.dim() and x.shape[dim] == 0:
        name = op._schema.name.split("::")[-1]
        _fail(f"{name}(): Expected reduction dim {dim} to have non-zero size.")


def _check_min_max_all(op: OpOverload, vals: list[Any]) -> None:
    """Eager refuses a full min/max of an empty tensor (its meta kernel does not)."""
    x = vals[0]
    if isinstance(x, torch.Tensor) and x.numel() == 0:
        name = op._schema.name.split("::")[-1]
        _fail(
            f"{name}(): Expected reduction dim to be specified for input.numel() == 0. Specify "
            "the reduction dim with the 'dim' argument."
        )


def _check_arange(op: OpOverload, vals: list[Any]) -> None:
    """torch_xla refuses NaN and infinite bounds with its own message."""
    start, end = (0, vals[0]) if op is aten.arange.default else (vals[0], vals[1])
    for v in (start, end):
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            _fail(f"unsupported range: {start} -> {end}")


def _check_full(op: OpOverload, vals: list[Any]) -> None:
    size = list(vals[0])
    if any(isinstance(s, int) and s < 0 for s in size):
        _fail(
            "full(): expected concrete sizes (i.e. non-symbolic) to be positive values. However "
            f"found negative ones: {size}."
        )


def _check_gather(op: OpOverload, vals: list[Any]) -> None:
    x, dim, index = vals[0], vals[1], vals[2]
    if index.numel() == 0:
        return  # eager gathers nothing without checking the shapes
    if index.dim() != x.dim():
        if index.dim() == 0 or x.dim() == 0:
            return
        _fail(
            f"gather(): expected rank of input ({x.dim()}) and index ({index.dim()}) tensors to be "
            "the same."
        )
    d = dim + x.dim() if dim < 0 else dim
    bad = [i for i in range(x.dim()) if i != d and index.shape[i] > x.shape[i]]
    if bad:
        _fail(
            f"gather(): expected sizes of index {list(index.shape)} to be smaller or equal those "
            f"of input {list(x.shape)} on all dimensions, except on dimension {d}. However, "
            f"that's not true on dimensions {bad}."
        )


def _bounds(dtype: torch.dtype) -> tuple[int, int] | None:
    if dtype.is_floating_point:
        # integers a float type holds exactly are what random_ draws from
        info = torch.finfo(dtype)
        return int(-info.max), int(info.max)
    if dtype == torch.bool:
        return 0, 1
    if dtype.is_complex:
        return None
    info = torch.iinfo(dtype)
    return info.min, info.max


def _check_random_from(op: OpOverload, vals: list[Any]) -> None:
    x, lo, hi = vals[0], vals[1], vals[2]
    if hi is None:
        return
    if lo >= hi:
        _fail(f"random_(): expected `from` ({lo}) to be smaller than `to` ({hi}).")
    b = _bounds(x.dtype)
    if b is None:
        return
    for name, v in (("from", lo), ("to", hi - 1)):
        if v < b[0] or v > b[1]:
            side = "greater than the upper" if v > b[1] else "smaller than the lower"
            _fail(
                f"random_(): expected `{name}` to be within the range [{b[0]}, {b[1]}]. However "
                f"got value {v}, which is {side} bound."
            )


def _check_uniform(op: OpOverload, vals: list[Any]) -> None:
    lo, hi = vals[1], vals[2]
    if lo > hi:
        _fail(f"uniform_(): expected `from` ({lo:g}) <= `to` ({hi:g}).")


def _check_mm(op: OpOverload, vals: list[Any]) -> None:
    a, b = vals[0], vals[1]
    for t, which in ((a, "first"), (b, "second")):
        if t.dim() != 2:
            _fail(
                f"mm(): expected the {which} input tensor {_shape(t)} to be a matrix (i.e. a 2D "
                "tensor)."
            )
    if a.shape[1] != b.shape[0]:
        _fail(
            f"mm(): cannot matrix-multiply tensors {_shape(a)} and {_shape(b)}. Expected the size "
            f"of dimension 1 of the first input tensor ({a.shape[1]}) to be equal the size of "
            f"dimension 0 of the second input tensor ({b.shape[0]})."
        )


def _batch_matmul(fn: str, args: Sequence[tuple[str, int, torch.Tensor]]) -> None:
    """torch_xla's checks of bmm's two operands (`args`: name, 1-based position, tensor)."""
    for name, pos, t in args:
        if t.dim() != 3:
            _fail(
                f"{fn}(): expected `{name}` {_shape(t)} (a {t.dim()}D tensor), the {_ordinal(pos)} "
                "input tensor, to be a 3D tensor."
            )
    (n1, p1, a), (n2, p2, b) = args
    if a.shape[0] != b.shape[0]:
        _fail(
            f"{fn}(): expected the size of the batch dimension (i.e. dimension 0) of `{n1}` "
            f"{_shape(a)} (batch dimension size: {a.shape[0]}), the {_ordinal(p1)} input tensor, "
            f"to be the same as the size of the batch dimension of `{n2}` {_shape(b)} (batch "
            f"dimension size: {b.shape[0]}), the {_ordinal(p2)} input tensor."
        )
    if a.shape[2] != b.shape[1]:
        _fail(
            f"{fn}(): cannot apply batch matrix-multiplication to `{n1}` {_shape(a)}, the "
            f"{_ordinal(p1)} input tensor, and to `{n2}` {_shape(b)}, the {_ordinal(p2)} input "
            f"tensor. Expected the size of dimension 2 of `{n1}` ({a.shape[2]}) to be equal the "
            f"size of dimension 1 of `{n2}` ({b.shape[1]})."
        )


def _check_bmm(op: OpOverload, vals: list[Any]) -> None:
    _batch_matmul("bmm", [("input", 1, vals[0]), ("mat2", 2, vals[1])])


def _check_baddbmm(op: OpOverload, vals: list[Any]) -> None:
    _batch_matmul("baddbmm", [("batch1", 2, vals[1]), ("batch2", 3, vals[2])])


def _check_roll(op: OpOverload, vals: list[Any]) -> None:
    shifts, dims = list(vals[1]), list(vals[2])
    if not shifts:
        _fail("roll(): expected `shifts` to have at least 1 element.")
    if not dims and len(shifts) != 1:
        _fail(
            f"roll(): expected `shifts` {shifts} (size={len(shifts)}) to have exactly 1 element "
            "when `dims` is empty."
        )
    if dims and len(dims) != len(shifts):
        _fail(
            f"roll(): expected `dims` {dims} (size={len(dims)}) to match the size of `shifts` "
            f"{shifts} (size={len(shifts)})."
        )


def _check_trace(op: OpOverload, vals: list[Any]) -> None:
    x = vals[0]
    if x.dim() != 2:
        _fail(f"trace(): expected the input tensor {_shape(x)} to be a matrix (i.e. a 2D tensor).")


def _check_clamp(op: OpOverload, vals: list[Any]) -> None:
    if vals[1] is None and vals[2] is None:
        _fail("clamp(): expected at least one of `min` or `max` arguments to be specified.")


def _check_avg_pool3d(op: OpOverload, vals: list[Any]) -> None:
    for name, v, allowed in (
        ("kernel_size", vals[1], (1, 3)),
        ("stride", vals[2], (0, 1, 3)),
        ("padding", vals[3], (1, 3)),
    ):
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        if len(v) not in allowed:
            _fail(f"avg_pool3d(): expected argument {name} {v} (size: {len(v)}) to have size of 3.")


CHECKS: dict[OpOverload, Callable[[OpOverload, list[Any]], None]] = {
    aten.add.Tensor: _check_add,
    aten.cat.default: _check_cat,
    aten.div.Tensor_mode: _check_div,
    aten.div.Scalar_mode: _check_div,
    aten.flip.default: _check_flip_range,
    aten.max.dim: _check_min_max_dim,
    aten.min.dim: _check_min_max_dim,
    aten.max.default: _check_min_max_all,
    aten.min.default: _check_min_max_all,
    aten.arange.default: _check_arange,
    aten.arange.start: _check_arange,
    aten.arange.start_step: _check_arange,
    aten.full.default: _check_full,
    aten.gather.default: _check_gather,
    getattr(aten.random_, "from"): _check_random_from,
    aten.uniform_.default: _check_uniform,
    aten.mm.default: _check_mm,
    aten.bmm.default: _check_bmm,
    aten.baddbmm.default: _check_baddbmm,
    aten.roll.default: _check_roll,
    aten.trace.default: _check_trace,
    aten.clamp.default: _check_clamp,
    aten.avg_pool3d.default: _check_avg_pool3d,
}


def install() -> None:
    """Run torch_xla's checks where the meta kernel runs (Note [torch_xla's error messages])."""
    for op, check in CHECKS.items():
        meta._EAGER_CHECKS.setdefault(op, check)
