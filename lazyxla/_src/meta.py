"""Argument kinds and shape inference: what a kernel knows of a call before it records it.

Each op's schema is classified once into argument kinds (`ArgSpec`). Per call, the output specs
and eager's strides come from PyTorch's own meta kernels, cached per argument signature
(`infer_layout`), after the checks eager's CPU kernels make and the meta kernels skip (Note
[Eager probes of pointwise ops]). Split from dispatch.py, which records the calls.
"""

from __future__ import annotations

import bisect
import functools
import math
import sys
import threading
import warnings
from collections.abc import Callable
from types import FunctionType
from typing import Any

import torch
from torch import _meta_registrations
from torch._ops import OpOverload

from . import runtime
from .ir import Ref, TensorSpec, _exact
from .ops.registry import Lowering
from .tensor import DEVICE_TYPE, contiguous_strides

# Argument kinds, decided once per op from its schema.
TENSOR, OPT_TENSOR, TENSOR_LIST, OPT_TENSOR_LIST, SCALAR, SCALAR_LIST, LIFT, STATIC, GENERATOR = (
    range(9)
)


class ArgSpec:
    __slots__ = (
        "name",
        "kind",
        "kwarg_only",
        "default",
        "has_default",
        "is_write",
        "is_list_write",
    )

    def __init__(self, arg: Any, lw: Lowering | None) -> None:
        t = str(arg.type)
        self.name: str = arg.name
        self.kwarg_only: bool = arg.kwarg_only
        self.has_default: bool = arg.has_default_value()
        self.default = arg.default_value if self.has_default else None
        self.is_write = bool(arg.alias_info and arg.alias_info.is_write)
        self.is_list_write = self.is_write and t.startswith("List[")
        static = lw.static if lw else frozenset()
        lift = lw.lift if lw else frozenset()
        if t == "Tensor":
            self.kind = TENSOR
        elif t == "Optional[Tensor]":
            self.kind = OPT_TENSOR
        elif t == "List[Tensor]":
            self.kind = TENSOR_LIST
        elif t == "List[Optional[Tensor]]":
            self.kind = OPT_TENSOR_LIST
        elif t in ("number", "Optional[number]") and arg.name not in static:
            self.kind = SCALAR
        elif t == "List[number]" and arg.name not in static:
            self.kind = SCALAR_LIST
        elif arg.name in lift:
            self.kind = LIFT
        elif t == "Optional[Generator]":
            self.kind = GENERATOR
        else:
            self.kind = STATIC


def bind(specs: list[ArgSpec], args: tuple, kwargs: dict) -> list[Any]:
    """Arguments in schema order, defaults filled in."""
    vals = list(args)
    for s in specs[len(args) :]:
        vals.append(kwargs[s.name] if s.name in kwargs else s.default)
    return vals


# --- shape inference: PyTorch's meta kernels, cached per argument signature -----------------------


def _sig(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return (v.shape, v.dtype, v.is_cpu)  # torch.Size hashes like a tuple
    if isinstance(v, (list, tuple)):
        return tuple(map(_sig, v))
    if isinstance(v, (float, complex)):
        # A scalar's value never changes a shape; its type changes a dtype. (Keyed by value, a
        # NaN would also miss the cache on every call: nan != nan.)
        return (type(v),)
    if isinstance(v, (bool, int)):
        return (type(v), v)  # 4, 4.0 and True == 1 are equal dict keys: keep the type apart
    if isinstance(v, torch.Generator):
        return None
    return v


def _layout_sig(v: Any) -> Any:
    """`_sig` plus each tensor's strides: they decide the strides of the outputs."""
    if isinstance(v, torch.Tensor):
        return (_sig(v), v.stride())
    if isinstance(v, (list, tuple)):
        return tuple(map(_layout_sig, v))
    return _sig(v)


def _to_meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        if v.device.type == "cpu" and v.dim() == 0:
            return v  # keeps the wrapped-number flag, which changes type promotion
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    if isinstance(v, (list, tuple)):
        return type(v)(_to_meta(x) for x in v)
    if isinstance(v, torch.Generator):
        return None
    if isinstance(v, torch.device):
        return torch.device("meta")
    return v


def _meta_specs(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return TensorSpec(tuple(out.shape), out.dtype)
    if isinstance(out, (list, tuple)):
        return type(out)(_meta_specs(o) for o in out)
    return out


def _meta_strides(out: Any, struct: Any) -> tuple[tuple[int, ...] | None, ...] | None:
    """Eager's strides of each output tensor, flat, None where contiguous (or for all: None)."""
    metas: list[Any] = []
    _flat_meta(out, metas)
    flat: list[TensorSpec] = []
    _flat_specs(struct, flat)
    if len(metas) != len(flat):
        return None
    strides = tuple(
        _noncontiguous(m.stride(), sp.shape) if tuple(m.shape) == sp.shape else None
        for m, sp in zip(metas, flat)
    )
    return strides if any(st is not None for st in strides) else None


def _flat_meta(out: Any, acc: list[Any]) -> None:
    if isinstance(out, torch.Tensor):
        acc.append(out)
    elif isinstance(out, (list, tuple)):
        for o in out:
            _flat_meta(o, acc)


def _noncontiguous(stride: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    stride = tuple(stride)
    return None if stride == contiguous_strides(shape) else stride


_META_CACHE: dict[tuple, Any] = {}  # key -> (output spec structure, flat output strides or None)
_MISS = object()

# Ops whose meta kernel and eager CPU kernel disagree on outputs: lazyxla follows eager CPU, its
# oracle. The normalizations return their saved mean/rstd in float32 on meta (CUDA's choice) but
# in the input's bf16/fp16 on CPU; batch norm in eval mode saves no statistics on CPU (shape (0,))
# where meta gives them the channel count.
_aten = torch.ops.aten
_STATS_IN_INPUT_DTYPE = frozenset(
    (
        _aten.native_layer_norm.default,
        _aten.native_batch_norm.default,
        _aten._native_batch_norm_legit.default,
        _aten._native_batch_norm_legit.no_stats,
        _aten._native_batch_norm_legit_no_training.default,
        _aten._native_batch_norm_legit_functional.default,
        _aten._batch_norm_with_update.default,
        _aten._batch_norm_with_update_functional.default,
    )
)


def _eval_mode_bn(op: OpOverload, vals: list[Any]) -> bool:
    """Eager's CPU kernels return empty saved statistics in eval mode (the meta kernels of the
    `_legit` variants say (C,): AOTAutograd records `_native_batch_norm_legit_functional` so)."""
    if op is _aten._native_batch_norm_legit_no_training.default:
        return True
    return op in _TRAINING_ARG_BN and not vals[5]


_TRAINING_ARG_BN = frozenset(
    (
        _aten.native_batch_norm.default,
        _aten._native_batch_norm_legit.default,
        _aten._native_batch_norm_legit_functional.default,
    )
)


def _cpu_specs(op: OpOverload, vals: list[Any], out: Any) -> Any:
    if op not in _STATS_IN_INPUT_DTYPE:
        return out
    x, out = vals[0], list(out)
    if x.dtype in (torch.bfloat16, torch.float16):
        out[1:3] = [TensorSpec(s.shape, x.dtype) for s in out[1:3]]
    if _eval_mode_bn(op, vals):
        out[1:3] = [TensorSpec((0,), s.dtype) for s in out[1:3]]
    return tuple(out)


def _dtype_name(dtype: torch.dtype) -> str:
    """ATen's name of `dtype` in messages ("Byte", "Long", "BFloat16")."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")


def _check_index_count(op: OpOverload, vals: list[Any]) -> None:
    x, indices = vals[0], vals[1]
    if len(indices) > x.dim():
        raise IndexError(f"too many indices for tensor of dimension {x.dim()} (got {len(indices)})")
    _check_index_into_empty(op, vals)


def _check_index_put(op: OpOverload, vals: list[Any]) -> None:
    """`index_put_` does not cast its values (`uint8_t[i] = torch.tensor(300)` raises; the meta
    kernel lets it through, and the value wrapped to 44), except where eager takes it for a
    `masked_fill_`: one mask index on the tensor's device, one value on the CPU, no
    accumulation."""
    _check_index_count(op, vals)
    x, indices, v, accumulate = vals[0], vals[1], vals[2], vals[3]
    given = [i for i in indices if i is not None]
    masked_fill = (
        not accumulate
        and v.numel() == 1
        and v.is_cpu
        and len(given) == 1
        and given[0].dtype in (torch.bool, torch.uint8)
        and given[0].device == x.device
    )
    if v.dtype != x.dtype and not masked_fill:
        raise RuntimeError(
            f"Index put requires the source and destination dtypes match, got "
            f"{_dtype_name(x.dtype)} for the destination and {_dtype_name(v.dtype)} for the source."
        )


def broadcast_shapes(*shapes: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
    """`torch.broadcast_shapes` of concrete shapes, without its symbolic-shape checks (~60 us a
    call, on the hot path of every SDPA and advanced-indexing call); raises RuntimeError on
    shapes that do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for s in shapes:
        offset = ndim - len(s)
        for i, n in enumerate(s):
            o = out[offset + i]
            if o == 1:
                out[offset + i] = n
            elif n != 1 and n != o:
                raise RuntimeError(
                    f"shapes {[tuple(x) for x in shapes]} do not broadcast: size {n} against "
                    f"{o} at dimension {offset + i - ndim}"
                )
    return tuple(out)


def _check_index_into_empty(op: OpOverload, vals: list[Any]) -> None:
    """Any index into a dimension of size 0 is out of bounds: eager raises, and it is known from
    the shapes alone (other out-of-bounds indices need the values, which XLA clamps)."""
    x, indices = vals[0], vals[1]
    if any(i is not None and i.dtype == torch.bool for i in indices):
        return  # a mask spans several dimensions
    given = [i for i in indices if i is not None]
    if not given or math.prod(broadcast_shapes(*(i.shape for i in given))) == 0:
        return  # the indices broadcast to no element: nothing is read or written
    if any(i is not None and size == 0 for size, i in zip(x.shape, indices)):
        raise IndexError("index is out of bounds for dimension with size 0")


# Note [Checked scalar conversions]
# Eager converts a Python number in a `Scalar` slot to the dtype it computes in with a checked
# conversion (c10's `Scalar::to<T>`): `uint8_t.fill_(300)`, `full_like(int8_t, 200)`,
# `torch.where(m, uint8_t, 300)`, `t.index_fill(0, i, -1.0)` into uint8, `int_t.clamp(max=2**40)`
# raise "value cannot be converted to type uint8_t without overflow", and `int_t ** -3`
# "Integers to negative integer powers are not allowed"; a number in a `Tensor` slot (`t + 300`)
# is a wrapped 0-d tensor and wraps. Whether a value passes depends only on its sign, which of
# the integer dtypes' limits it exceeds, and NaN (into a floating dtype nothing is checked:
# `half_t.fill_(1e6)` is inf). That class is in the meta cache's key and in a recording plan's
# key for every `Scalar` slot, so a new class misses both: the probe (below) then runs with the
# value, and ops that store a value without being probed (fills, `index_fill`, `scatter`)
# convert it the checked way on the slow path (`dispatch.Recorder.lift`). Floats in a `Scalar`
# slot were keyed by type alone, and a plan made by `x ** 2` served `x ** -3`.
_INT_LIMITS = (127, 128, 255, 32767, 32768, 65535, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63)
_INT_LIMITS += (2**64 - 1,)


def scalar_class(v: int | float) -> Any:
    """Which of eager's checked conversions to an integer dtype accept `v`, as a key (Note
    [Checked scalar conversions]): NaN, or the sign and how many limits |v| exceeds."""
    if v != v:
        return None
    if v < 0:
        return (True, bisect.bisect_left(_INT_LIMITS, -v))
    return (False, bisect.bisect_left(_INT_LIMITS, v))


# Note [Eager probes of pointwise ops]
# Eager's CPU kernels of pointwise ops and reductions refuse dtypes their meta kernels accept:
# `bool - bool` ("Subtraction, the `-` operator, with two bool tensors is not supported"),
# `clamp`, `maximum`, `lt`, `remainder`, `atan2` of complex tensors, `heaviside` or `lerp` of
# mixed dtypes, `hypot` of integers, `pow(int_tensor, -1)`, `argmax` of bools. Recorded with the
# meta kernel alone, lazyxla computed something for each. So the first call of each signature of
# such an op (the meta cache's miss) also runs the op eagerly on one-element CPU tensors of the
# same dtypes and dimensionality, with the same scalars: where eager raises, the op raises eager's
# error, where it is recorded. (Reductions' static arguments are only dims, keepdim, dtype,
# correction and p: valid on size-1 dimensions exactly when on the real ones.) Ones as values keep
# value-dependent errors out (an integer division by a zero tensor raises in eager only for its
# data); random ops and dtypes eager's CPU kernels lack but XLA has (uint16/32/64, float8) are not
# probed. A value checked on a lifted scalar (`int_tensor ** -3` after `int_tensor ** 2` made a
# recording plan) is probed again when its class changes (Note [Checked scalar conversions]).
# Other ops whose CPU kernels refuse dtypes (softmax, logcumsumexp, median, kthvalue, topk, trace
# of integers or bools) are probed too (`_DTYPE_PROBED`), on zeros of the real shapes, since
# their static arguments (topk's k) need not be valid on one-element tensors; past 4096 elements
# on one-element tensors, for eager's NotImplementedError ("not implemented for 'Int'") alone.
# Matrix products (`_PRODUCTS`) are probed on one-element tensors (1x1 matrices multiply): their
# meta kernels accept operands of two dtypes (`mm(f32, f64)` gave a float32 result), eager's refuse
# them ("expected m1 and m2 to have the same dtype").
_UNPROBED_DTYPES = frozenset(
    (torch.uint16, torch.uint32, torch.uint64, torch.complex32)
    + tuple(getattr(torch, n) for n in dir(torch) if n.startswith("float8_"))
)


# Pointwise ops PyTorch does not tag as such.
_UNTAGGED_POINTWISE = frozenset((_aten.rsub.Tensor, _aten.floor_divide.default))
_DTYPE_PROBED = frozenset(
    (
        _aten._softmax.default,
        _aten._log_softmax.default,
        _aten.logcumsumexp.default,
        _aten._logcumsumexp.default,
        _aten.median.default,
        _aten.median.dim,
        _aten.nanmedian.default,
        _aten.nanmedian.dim,
        _aten.kthvalue.default,
        _aten.topk.default,
        _aten.trace.default,
        _aten.searchsorted.Tensor,
        _aten.searchsorted.Scalar,
        _aten.bucketize.Tensor,
        _aten.bucketize.Scalar,
    )
)


@functools.cache
def _probed(op: OpOverload) -> bool:
    tags = op.tags
    return (
        (torch.Tag.pointwise in tags or torch.Tag.reduction in tags or op in _UNTAGGED_POINTWISE)
        and torch.Tag.nondeterministic_seeded not in tags
        and not any(
            "Device" in str(a.type) or "Generator" in str(a.type) for a in op._schema.arguments
        )
    )


_SHAPED_PROBE_LIMIT = 4096  # elements of a probe on zeros of the real shape


def _probe_value(
    v: Any, shaped: bool = False, limit: int = _SHAPED_PROBE_LIMIT, extent: int = 1
) -> Any:
    """`v` as the probe passes it: a lazy tensor as ones of `extent` elements per dimension, or
    (`shaped`) as zeros of its own shape, of at most `limit` elements."""
    if isinstance(v, torch.Tensor):
        if v.device.type != DEVICE_TYPE:
            return v
        if v.dtype in _UNPROBED_DTYPES or shaped and v.numel() > limit:
            raise _NoProbe
        if shaped:
            return torch.zeros(v.shape, dtype=v.dtype)
        return torch.ones((extent,) * v.dim(), dtype=v.dtype)
    if isinstance(v, (list, tuple)):
        return type(v)(_probe_value(x, shaped, limit, extent) for x in v)
    return v


def _probe_extent(specs: list[ArgSpec], vals: list[Any]) -> int:
    """Elements per dimension of a probe: one, or past a variance's correction. On one element
    `var`/`std` warn that the degrees of freedom are <= 0, and a warning C++ raises inside a
    kernel reaches the user's call, whatever filter the probe sets."""
    args = {s.name: v for s, v in zip(specs, vals)}
    if "correction" not in args and "unbiased" not in args:
        return 1
    return 2 + int(abs(_correction(args)))


def _correction(args: dict[str, Any]) -> float:
    """A variance's correction, from its `correction` or `unbiased` argument (default 1)."""
    correction = args.get("correction")
    if correction is None:
        correction = 0 if args.get("unbiased") is False else 1
    return correction


class _NoProbe(Exception):
    pass


def _eager_probe(
    op: OpOverload,
    specs: list[ArgSpec],
    vals: list[Any],
    shaped: bool = False,
    limit: int = _SHAPED_PROBE_LIMIT,
) -> None:
    """Raise eager's error if eager refuses this call's dtypes (Note [Eager probes of pointwise
    ops]). `shaped` (`_DTYPE_PROBED`): on zeros of the real shapes, every error of eager's; past
    the size limit on one-element tensors, only a refusal of the dtypes."""

    extent = _probe_extent(specs, vals)

    def probe_args(shaped: bool) -> tuple | None:
        try:
            return _split_args(specs, vals, lambda v: _probe_value(v, shaped, limit, extent))
        except _NoProbe:
            return None

    probe = probe_args(True) if shaped else None
    refusal_only = shaped and probe is None
    if probe is None:
        probe = probe_args(False)
    if probe is None:
        return
    args, kwargs = probe
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the op itself warns where eager would
            _callable(op, specs, vals)(*args, **kwargs)
    except NotImplementedError as e:
        raise EagerRefused(*e.args) from None  # (not taken for a data-dependent shape)
    except (RuntimeError, TypeError, ValueError, ZeroDivisionError, IndexError) as e:
        if not refusal_only:
            raise type(e)(*e.args) from None


# Note [Out= tensors of another dtype]
# An `out=` tensor whose dtype is not the result's: eager's kernels decide, overload by overload,
# and the meta kernels disagree with them. `torch.sum(f32, 0, out=int32_t)` computes the sum in
# int32 (the elements are cast first: [1.5, 2.7] sums to 3), as do the other reductions and scans
# with a `dtype` argument (nansum, mean, prod.int_out, cumsum, cumprod): their out dtype is their
# computation dtype, which is what `dtype=` would give. `sum.out` (no dims), `prod.out`, `amax`,
# `norm`s and `mm` refuse the mismatch ("Expected out tensor to have dtype float"), though the
# meta kernels of several accept it; pointwise ops compute in the inputs' dtype and cast. So such a
# call is probed once per signature with the out op itself, eagerly, and raises eager's error; a
# `dtype` argument left None then takes the out tensor's dtype (`out_dtype_probe`'s answer).
# Pointwise ops, reductions and products decide on dtypes alone, so they are probed on
# one-element tensors; other ops on zeros of the real shapes, up to 2**20 elements (once per
# signature; a linear algebra op's error about a zero matrix's values is not taken).
_PRODUCTS = frozenset(
    (
        _aten.mm.default,
        _aten.bmm.default,
        _aten.addmm.default,
        _aten.baddbmm.default,
        _aten.addbmm.default,
        _aten.mv.default,
        _aten.addmv.default,
        _aten.dot.default,
        _aten.vdot.default,
    )
)
_OUT_PROBED: set[tuple] = set()
_OUT_PROBE_LIMIT = 1 << 20  # elements of a shaped out= probe: run once per rare signature


def out_dtype_probe(
    op: OpOverload, functional: OpOverload, specs: list[ArgSpec], vals: list[Any]
) -> None:
    """Raise eager's error if eager refuses this `out=` call's dtypes (Note [Out= tensors of
    another dtype]); once per signature."""
    key = (op, *map(_layout_sig, vals))
    if key in _OUT_PROBED:
        return
    shaped = not (_probed(functional) or functional in _PRODUCTS)
    # out= tensors as empty CPU ones of their dtype: resized silently (a one-element probe's
    # resize warns, and C++ warnings surface at the outermost op, past any filter here)
    probe_vals = [
        torch.empty(0, dtype=v.dtype) if s.is_write and isinstance(v, torch.Tensor) else v
        for s, v in zip(specs, vals)
    ]
    try:
        _eager_probe(op, specs, probe_vals, shaped=shaped, limit=_OUT_PROBE_LIMIT)
    except torch.linalg.LinAlgError:
        pass  # (a zeros probe's value error: not a dtype's)
    _OUT_PROBED.add(key)


class EagerRefused(NotImplementedError):
    """Eager's "not implemented for 'ComplexFloat'": the dtype is refused, the op is not missing
    (a kernel's NotImplementedError from the meta call means a data-dependent output shape)."""


def _warn_degrees_of_freedom(op: OpOverload, vals: list[Any]) -> None:
    """Eager's warning for a variance over no more elements than its correction: its CPU kernel
    warns on every call, the meta kernel never."""
    args = dict(zip((a.name for a in op._schema.arguments), vals))
    x, dim = args.get("self"), args.get("dim")
    if not isinstance(x, torch.Tensor):
        return
    if isinstance(dim, int):
        dim = [dim]
    n = math.prod(x.shape[d] for d in dim) if dim else x.numel()
    if n - _correction(args) <= 0:
        name = op._schema.name.split("::")[-1]
        warnings.warn(
            f"{name}(): degrees of freedom is <= 0. Correction should be strictly less than the "
            "reduction factor (input numel divided by output numel).",
            UserWarning,
            stacklevel=3,  # (this check, the op's kernel, the caller)
        )


def per_call_check(op: OpOverload) -> Callable[[OpOverload, list[Any]], None] | None:
    """A check eager's kernel makes on every call that the meta kernel skips (a warning), if
    `op` has one: its recorded kernel runs it before its recording plan."""
    if op.overloadpacket in (_aten.var, _aten.std, _aten.var_mean, _aten.std_mean):
        return _warn_degrees_of_freedom
    return None


# Checks eager's kernels make that the meta kernels skip, run where the meta call runs.
_EAGER_CHECKS = {
    _aten.index_put.default: _check_index_put,
    _aten._index_put_impl.default: _check_index_put,
    _aten._unsafe_index_put.default: _check_index_count,
    _aten.index.Tensor: _check_index_into_empty,
}


def _all_meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.device.type == "cpu":
        return torch.empty(v.shape, dtype=v.dtype, device="meta")
    if isinstance(v, (list, tuple)):
        return type(v)(_all_meta(x) for x in v)
    return v


def _run_meta(op: OpOverload, args: list[Any], kwargs: dict[str, Any]) -> Any:
    try:
        return op(*args, **kwargs)
    except RuntimeError:
        # A CPU 0-d tensor (kept on the CPU for its wrapped-number type promotion) fails a meta
        # device check that the real device kernel passes (masked_fill's `value`): retry on meta.
        if not any(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in _leaves(args)):
            raise
        return op(*_all_meta(args), **{k: _all_meta(v) for k, v in kwargs.items()})


def _leaves(v: Any) -> list[Any]:
    if isinstance(v, (list, tuple)):
        return [y for x in v for y in _leaves(x)]
    return [v]


def infer(op: OpOverload, specs: list[ArgSpec], vals: list[Any], lw: Lowering | None = None) -> Any:
    """Output spec structure (TensorSpec, or a tuple/list of them) of `op` on `vals`."""
    return infer_layout(op, specs, vals, lw)[0]


# Shape rules of ops whose meta kernel PyTorch lacks or gets wrong (Note [Fused RNN cells]):
# called with the meta arguments in place of the op.
META_RULES: dict[OpOverload, Callable[..., Any]] = {}


def _split_args(
    specs: list[ArgSpec], vals: list[Any], convert: Callable[[Any], Any]
) -> tuple[list[Any], dict[str, Any]]:
    """`vals` (schema order) as converted positional and keyword arguments for a call."""
    args, kwargs = [], {}
    for s, v in zip(specs, vals):
        if s.kwarg_only:
            kwargs[s.name] = convert(v)
        else:
            args.append(convert(v))
    return args, kwargs


# Note [Meta kernels see a CPU]
# Eager CPU is lazyxla's oracle for layouts too, but a few of PyTorch's meta kernels choose their
# output strides by the device they guess a meta tensor stands for (`device_hint`), and a plain
# meta tensor is guessed to be a CUDA one: `_linalg_svd` then made Vh row-major (eager CPU's is
# column-major), `linalg_eig` its vectors, the FFT kernels theirs in cuFFT's order (`rfftn` of a
# (5, 6, 7) tensor: strides (6, 1, 30), eager's (24, 4, 1)), and a pooling kernel dropped
# channels_last. While lazyxla runs a meta kernel, a meta tensor's hint is "cpu"; everyone
# else's calls (FakeTensor, inductor) see PyTorch's own function unchanged. One exception: an
# integer `histc` is an accelerator's op (eager's CPU and MPS kernels refuse it, CUDA's computes
# it), and programs take it on any device that is neither: transformers' mixture-of-experts
# layers count tokens per expert with `histc(ids.int())` there, and failed on lazyxla with the
# CPU's "histogram_cpu not implemented for 'Int'".
_meta_hint = threading.local()
_ACCELERATOR_META = frozenset((torch.ops.aten.histc.default,))
_torch_device_hint = _meta_registrations.device_hint


def _device_hint(tensor: Any) -> str:
    if getattr(_meta_hint, "cpu", False) and getattr(tensor, "device", None) == _META_DEVICE:
        return "cpu"
    return _torch_device_hint(tensor)


_META_DEVICE = torch.device("meta")
_meta_registrations.device_hint = _device_hint


# Note [Meta kernels without dynamo]
# PyTorch's Python references (`torch._refs`), which are the meta kernels of most pointwise ops,
# are wrapped in `torch._disable_dynamo`: so that dynamo never traces into them, the first call of
# each imports `torch._dynamo` (1.7-1.9 s here) and wraps the function in `torch._dynamo.disable`.
# Eager CPU never calls them, so every lazyxla program paid that import at its first op, and an
# inference script started 1.8 s later than on the CPU. A wrapped function looks up its disabled
# twin in its `__dynamo_disable` attribute first: `_until_dynamo` fills it with a twin that calls
# the function as it is while dynamo is not imported (nothing can be tracing then: only dynamo
# installs a frame evaluation hook), and from the first call after dynamo is imported puts
# dynamo's own disabled twin in its place, as PyTorch would have. Only the references are
# covered, the functions lazyxla calls where eager does not; `torch.optim`'s are eager's cost too.
class _UntilDynamo:
    __slots__ = ("fn", "recursive")

    def __init__(self, fn: Callable[..., Any], recursive: bool) -> None:
        self.fn, self.recursive = fn, recursive

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None or not hasattr(dynamo, "disable"):  # (not imported, or mid-import)
            return self.fn(*args, **kwargs)
        disabled = dynamo.disable(self.fn, self.recursive, wrapping=False)
        setattr(self.fn, "__dynamo_disable", disabled)  # (not mangled, as `self.fn.__x` is)
        return disabled(*args, **kwargs)


def _until_dynamo() -> int:
    """Fill the `__dynamo_disable` slot of every `torch._disable_dynamo`-wrapped function of
    PyTorch's references (Note [Meta kernels without dynamo]); returns how many were filled."""
    import torch._refs.fft
    import torch._refs.linalg
    import torch._refs.nn.functional
    import torch._refs.special

    inner = torch._disable_dynamo(lambda: None).__code__  # (the wrapper's code object)
    filled = 0
    seen: set[int] = set()
    mods = (
        torch._refs,
        torch._refs.nn.functional,
        torch._refs.special,
        torch._refs.linalg,
        torch._refs.fft,
    )
    todo = [f for mod in mods for f in vars(mod).values()]
    while todo:  # the functions reachable through `functools.wraps` chains and closures
        f = todo.pop()
        if not isinstance(f, FunctionType) or id(f) in seen:
            continue
        seen.add(id(f))
        cells = dict(zip(f.__code__.co_freevars, f.__closure__ or ()))
        if f.__code__ is inner:
            fn, recursive = cells["fn"].cell_contents, cells["recursive"].cell_contents
            if getattr(fn, "__dynamo_disable", None) is None:
                fn.__dynamo_disable = _UntilDynamo(fn, recursive)
                filled += 1
        todo.append(getattr(f, "__wrapped__", None))
        for c in cells.values():
            try:
                todo.append(c.cell_contents)
            except ValueError:  # (an empty cell)
                pass
    return filled


if "torch._dynamo" not in sys.modules:
    _until_dynamo()


def _meta_call(op: OpOverload, specs: list[ArgSpec], vals: list[Any]) -> Any:
    args, kwargs = _split_args(specs, vals, _to_meta)
    rule = META_RULES.get(op)
    outer = getattr(_meta_hint, "cpu", False)
    _meta_hint.cpu = op not in _ACCELERATOR_META  # Note [Meta kernels see a CPU]
    try:
        return _run_meta(rule or _callable(op, specs, vals), args, kwargs)
    finally:
        _meta_hint.cpu = outer


def _callable(op: OpOverload, specs: list[ArgSpec], vals: list[Any]) -> Any:
    """`op`, or its overload packet when a Tensor argument holds a Python number: a wrapped
    number reaches the kernel as one (`torch.xlogy(t, 2.5)`: xlogy.Scalar_Other calls
    xlogy.Tensor with it), and an overload cannot be called with a number for a Tensor; the
    packet picks the Scalar overload, which wraps it again."""
    for s, v in zip(specs, vals):
        if s.kind == TENSOR and type(v) in (int, float, bool, complex):
            return op.overloadpacket
    return op


def infer_layout(
    op: OpOverload, specs: list[ArgSpec], vals: list[Any], lw: Lowering | None = None
) -> tuple[Any, tuple[tuple[int, ...] | None, ...] | None]:
    """Output specs of `op` on `vals`, and eager's strides of each output (None: contiguous).

    PyTorch's meta kernel decides on inputs with the tensors' own strides (so shapes, dtypes,
    layouts and errors are PyTorch's own); an op without one (a custom op) is shape-checked by
    tracing its lowering with `jax.eval_shape`.
    """
    # A float's value never changes a shape, unless it is a static that shapes the program
    # (arange's end): those stay in the key, and a float in a `Scalar` slot keys its class
    # (Note [Checked scalar conversions]). The default dtype types a result from Python
    # numbers (`int_tensor * 2.5`, `torch.full(size, 1.5)`): it is in the key too.
    key = (
        op,
        torch.get_default_dtype(),
        *[
            (float, _exact(v))
            if a.kind == STATIC and type(v) is float
            else (float, scalar_class(v))
            if a.kind == SCALAR and type(v) is float
            else _layout_sig(v)
            for a, v in zip(specs, vals)
        ],
    )
    hit = _META_CACHE.get(key, _MISS)
    if hit is not _MISS:
        return hit  # its specs may be None: in-place foreach ops return nothing
    check = _EAGER_CHECKS.get(op)
    if check is not None:
        check(op, vals)
    if _probed(op):
        _eager_probe(op, specs, vals)
    elif op in _DTYPE_PROBED:
        _eager_probe(op, specs, vals, shaped=True)
    elif op in _PRODUCTS:  # their meta kernels take operands of two dtypes: eager refuses them
        _eager_probe(op, specs, vals)
    try:
        meta = _meta_call(op, specs, vals)
        out = _cpu_specs(op, vals, _meta_specs(meta))
        strides = _meta_strides(meta, out)
    except NotImplementedError:
        if lw is None:
            raise
        out, strides = _eval_shape(lw, specs, vals), None
    flat: list[TensorSpec] = []
    _flat_specs(out, flat)
    for sp in flat:
        runtime.check_dtype(sp.dtype, f"aten::{op._schema.name.split('::')[-1]}")
    _META_CACHE[key] = hit = (out, strides)
    return hit


def _eval_shape(lw: Lowering, specs: list[ArgSpec], vals: list[Any]) -> Any:
    import jax

    structs: list[Any] = []  # tensor arguments, traced by eval_shape; the rest stay static

    def slot(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            structs.append(jax.ShapeDtypeStruct(tuple(v.shape), runtime.jnp_dtype(v.dtype)))
            return Ref(len(structs) - 1)
        if isinstance(v, (list, tuple)):
            return type(v)(slot(x) for x in v)
        return v

    args = [slot(v) for s, v in zip(specs, vals) if not s.kwarg_only and s.kind != GENERATOR]
    kwargs = {s.name: slot(v) for s, v in zip(specs, vals) if s.kwarg_only and s.kind != GENERATOR}

    def fill(v: Any, arrays: tuple) -> Any:
        if type(v) is Ref:
            return arrays[v]
        if isinstance(v, (list, tuple)):
            return type(v)(fill(x, arrays) for x in v)
        return v

    def run(*arrays: Any) -> Any:
        a = [fill(v, arrays) for v in args]
        kw = {k: fill(v, arrays) for k, v in kwargs.items()}
        if lw.random:
            kw["key"] = (jax.numpy.zeros((), "int64"), jax.numpy.zeros((), "int64"))
        return lw.rule(*a, **kw)

    out = jax.eval_shape(run, *structs)

    def to_spec(o: Any) -> Any:
        if o is None:
            return None
        if isinstance(o, (list, tuple)):
            return type(o)(to_spec(x) for x in o)
        return TensorSpec(tuple(o.shape), runtime.NP_TO_TORCH[o.dtype])

    return to_spec(out)


def _flat_specs(struct: Any, acc: list[TensorSpec]) -> None:
    if isinstance(struct, TensorSpec):
        acc.append(struct)
    elif isinstance(struct, (list, tuple)):
        for s in struct:
            _flat_specs(s, acc)
