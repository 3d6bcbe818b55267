"""PrivateUse1 kernels: each aten op on a lazy tensor becomes an IR node, nothing runs.

For every op with a lowering, one kernel is built from the op's schema: it classifies the
arguments once (tensor, tensor list, scalar, static: meta.py), and per call turns tensors into IR
inputs, lifts Python scalars to graph inputs (see Note [Graph hashing]), takes the output specs
from PyTorch's own meta kernels (meta.py's `infer_layout`, cached per argument signature, so a
training step pays for shape inference only once), and returns fresh lazy tensors. In-place and
view variants are derived from the functional rule (see Note [Views and mutation]). Ops with
neither a lowering nor a decomposition go to the CPU fallback in fallback.py. Functional kernels,
and the per-signature recording plans that make their calls cheap, are in recording.py.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload

from . import metrics, runtime
from .config import FLAGS
from .ir import (
    Node,
    Ref,
    TensorSpec,
    _user_frame,
    node_with_desc,
    rng_scalar,
    scalar,
)
from .meta import (
    GENERATOR,
    LIFT,
    OPT_TENSOR,
    OPT_TENSOR_LIST,
    SCALAR,
    SCALAR_LIST,
    TENSOR,
    TENSOR_LIST,
    ArgSpec,
    _dtype_name,
    _flat_specs,
    _meta_call,
    _noncontiguous,
    _sig,
    bind,
    infer,
    out_dtype_probe,
)
from .ops.registry import Lowering
from .tensor import (
    DEVICE_TYPE,
    ViewOp,
    new_tensor,
    new_view,
    overlaps,
    read,
    state,
    storage_nbytes,
    write,
)

aten = torch.ops.aten
_libs: dict[str, torch.library.Library] = {}

# --- recording -----------------------------------------------------------------------------------


def _wrap_outputs(node: Node, struct: Any, counter: list[int], strides: Any = None) -> Any:
    if isinstance(struct, TensorSpec):
        i = counter[0]
        counter[0] += 1
        return new_tensor((node, i), struct, strides[i] if strides is not None else None)
    if isinstance(struct, (list, tuple)):
        return type(struct)(_wrap_outputs(node, s, counter, strides) for s in struct)
    return struct


def _output_indices(struct: Any, counter: list[int]) -> Any:
    """`_wrap_outputs`'s structure with each output's index in place of its tensor."""
    if isinstance(struct, TensorSpec):
        counter[0] += 1
        return counter[0] - 1
    if isinstance(struct, (list, tuple)):
        return type(struct)(_output_indices(s, counter) for s in struct)
    return struct


def _is_unit(v: Any) -> bool:
    """0 and 1 (and bools), baked into the node; other scalars are lifted to graph inputs.

    -0.0 is not a unit: baked, it would share its node's descriptor (and so a compiled graph)
    with 0.0, since -0.0 == 0.0 (`x / -0.0` would give +inf). See Note [Exact descriptors].
    """
    t = type(v)
    if t is float:
        return v == 1.0 or (v == 0.0 and math.copysign(1.0, v) > 0)
    return t is bool or (t is int and (v == 0 or v == 1))


# Note [Scalar precision]
# ~~~~~~~~~~~~~~~~~~~~~~~
# A Python scalar operand of a bf16/fp16 op reaches eager's CPU kernel in one of two precisions.
# TensorIterator's generic binary kernels (add, sub, remainder, fmod, pow, atan2, comparisons) and
# the ufunc-generated ones (add's alpha: `alpha.to<scalar_t>()`) cast it to the tensor's dtype
# first: it is rounded to bf16. The kernels below read it at the op math type instead (float32):
# mul, div and floor_divide take a wrapped-number `other` through
# `iter.original_scalar_value<opmath_t>(2)`; lerp's weight, addcmul/addcdiv's value, addmm's
# alpha and beta and the activations' parameters through `scalar.to<opmath_t>()`; the CPU
# foreach ops loop over those same kernels. Lifting every scalar at the result dtype rounded
# `bf16 * 0.3` by 0.3's bf16 error (half the elements off by an ulp), so the scalars of these ops
# are lifted at float32: their rules compute in float32 (Note [Opmath]) and the interpreter
# rounds the output once, where eager does. Ops that only store a scalar (fill, full,
# masked_fill, where, index_fill, scatter, clamp's bounds) round it once either way, double ->
# float -> bf16 in both (c10's BFloat16 and Half convert from float; `_scalar_vector` in graph.py
# rounds a float16 input that way too), and keep the result dtype.
_OPMATH_SCALARS = frozenset(
    "aten::" + op
    for op in (
        "mul",
        "div",
        "floor_divide",
        "lerp",
        "addcmul",
        "addcdiv",
        "addmm",  # not addmv: its gemv reads alpha and beta as `to<scalar_t>()`
        "addbmm",
        "baddbmm",
        "leaky_relu",
        "leaky_relu_backward",
        "elu",
        "elu_backward",
        "softplus",
        "softplus_backward",
        "softshrink",
        "softshrink_backward",
        "threshold",
        "_foreach_mul",
        "_foreach_div",
        "_foreach_lerp",
        "_foreach_addcmul",
        "_foreach_addcdiv",
    )
)
# Only mul/div read a wrapped number at opmath, and only as `other` (operand 2): a scalar `self`
# (torch.mul(torch.tensor(0.3), x)) is cast to the common dtype.
_OPMATH_OTHER = frozenset(
    "aten::" + op for op in ("mul", "div", "floor_divide", "_foreach_mul", "_foreach_div")
)
_LOW_FLOATS = (torch.bfloat16, torch.float16)
# Fills only store their Scalar: a unit there simplifies nothing, so it is lifted like any other
# value, and `full(n, False)` and `full(n, True)` (transformers' max-length criterion, `False`
# until the last token) are one graph, not two.
STORES_SCALAR = frozenset(("aten::full", "aten::full_like", "aten::fill", "aten::new_full"))
# Ops that store a `Scalar` converted the checked way but are not probed (pointwise ops are):
# Note [Checked scalar conversions] in meta.py.
_CHECKED_SCALARS = STORES_SCALAR | {"aten::scalar_tensor", "aten::index_fill", "aten::scatter"}
# Ops whose 0-d CPU tensor value eager reads with `.item()` and converts the same way
# (`uint8_t.masked_fill(m, torch.tensor(300))` raises; `fill_(torch.tensor(300))` wraps).
_CHECKED_TENSOR_VALUES = frozenset(("aten::masked_fill", "aten::index_fill"))


def _check_fits(v: Any, dtype: torch.dtype) -> None:
    """Raise eager's error if `v` does not convert to the integer `dtype` (`uint8_t.fill_(300)`:
    "value cannot be converted to type uint8_t without overflow"), by converting it as eager
    does."""
    if type(v) is bool or dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return
    try:
        torch.empty((), dtype=dtype).fill_(v)
    except NotImplementedError:  # (a dtype eager's CPU cannot fill: nothing to compare with)
        return
    except RuntimeError as e:
        raise RuntimeError(*e.args) from None


# Note [Integer scalars of floating results]
# A Python int (or 0-d integer tensor) against an integer tensor promotes to the tensor's dtype,
# and is lifted at it: `uint8_tensor + (-1)` wraps -1 to 255, as eager's uint8 add does. But an op
# that computes a floating result from integer operands (`uint8_tensor / -3`, `copysign`,
# `int8_tensor / 300`) converts each operand from its own value to the float result dtype: eager
# divides by -3.0, and the lifted scalar wrapped to 253 divided by 253 instead. So a scalar whose
# promotion is integral is lifted at the node's result dtype when that is floating.


def _is_floating(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


class Recorder:
    """Turns one call's arguments into (inputs, template) for a node."""

    __slots__ = (
        "inputs",
        "ref",
        "opmath",
        "opmath_other",
        "stores",
        "checked",
        "checked_values",
        "floating",
    )

    def __init__(
        self, ref: torch.Tensor | None, op: str = "", result: torch.dtype | None = None
    ) -> None:
        self.inputs: list[tuple[Node, int]] = []
        self.ref = ref  # the tensor whose dtype anchors lifted scalars' dtypes
        # A floating result of integer operands (true division): Note [Integer scalars of
        # floating results].
        self.floating = result if result is not None and _is_floating(result) else None
        # Whether this op reads its bf16/fp16 scalars at float32 (Note [Scalar precision]).
        self.opmath = op in _OPMATH_SCALARS
        self.opmath_other = op in _OPMATH_OTHER
        self.stores = op in STORES_SCALAR
        self.checked = op in _CHECKED_SCALARS
        self.checked_values = op in _CHECKED_TENSOR_VALUES

    def tensor(self, t: Any) -> Any:
        if t is None:
            return None
        if not isinstance(t, torch.Tensor):  # a Python number in a Tensor slot (wrapped number)
            other = self.opmath_other and bool(self.inputs)
            return self._lift(t, torch.get_default_dtype(), other)
        if t.device.type == DEVICE_TYPE:
            self.inputs.append(read(state(t)))
            return Ref(len(self.inputs) - 1)
        if t.dim() == 0:
            dtype = self._promoted(t) if self.ref is not None else t.dtype
            value = t.item()
            if self.checked_values and self.ref is not None:
                _check_fits(value, self.ref.dtype)
            if _is_unit(value):
                return value
            # `other`, not `self`: a tensor was recorded before it (Note [Scalar precision]).
            if dtype in _LOW_FLOATS and self.opmath_other and self.inputs:
                dtype = torch.float32
            self.inputs.append((scalar(value, dtype), 0))
            return Ref(len(self.inputs) - 1)
        # A CPU tensor among device tensors: moved over, counted like any transfer (as indexing
        # with a CPU index does on CUDA). One that needs a gradient is refused as CUDA refuses
        # it: autograd would have to hand a device gradient to a CPU tensor.
        if t.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{DEVICE_TYPE}:0 and cpu! (a CPU tensor of shape {tuple(t.shape)} that requires "
                f"grad, at {_user_frame()}; move it with .to(lazyxla.device()) first)"
            )
        from .transfer import upload_node

        self.inputs.append((upload_node(t), 0))
        return Ref(len(self.inputs) - 1)

    def lift(self, v: Any, dtype: torch.dtype) -> Any:
        """A `Scalar` argument: lifted to a graph input unless a unit (or not a real number)."""
        if self.stores and type(v) in (bool, int, float):
            _check_fits(v, dtype)  # (the result's dtype: it is stored at that)
            if self.ref is not None:
                dtype = torch.result_type(self.ref, v)
            self.inputs.append((scalar(v, dtype), 0))
            return Ref(len(self.inputs) - 1)
        return self._lift(v, dtype, self.opmath, result=dtype)

    def _promoted(self, v: Any, result: torch.dtype | None = None) -> torch.dtype:
        """The dtype `v` (a Python number or 0-d CPU tensor) is lifted at: its promotion with
        the anchoring tensor, or the floating result an integer promotion computes in. `result`:
        for a `Scalar` argument, the node's result dtype: a float Scalar of an op whose result is
        the anchoring tensor's integer dtype (`int_t.addcmul_(a, b, value=2.5)`) is converted to
        it first, as eager's `value.to<scalar_t>()` does (2.5 -> 2; promoted to float, it computed
        int_t + 2.5 * a * b). A comparison (a bool result) computes in the promoted type."""
        if (
            result is not None
            and type(v) is float
            and not _is_floating(result)
            and result != torch.bool
            and self.ref.dtype == result
        ):
            return result
        dtype = torch.result_type(self.ref, v)
        if self.floating is not None and not _is_floating(dtype):
            return self.floating
        return dtype

    def _lift(
        self, v: Any, dtype: torch.dtype, opmath: bool, result: torch.dtype | None = None
    ) -> Any:
        if v is None or isinstance(v, bool) or _is_unit(v) or not isinstance(v, (int, float)):
            return v
        if self.ref is not None:
            dtype = self._promoted(v, result)
        if self.checked:
            _check_fits(v, dtype)
        if opmath and dtype in _LOW_FLOATS:
            dtype = torch.float32  # Note [Scalar precision]
        self.inputs.append((scalar(v, dtype), 0))
        return Ref(len(self.inputs) - 1)


def _first_tensor(vals: list[Any], specs: list[ArgSpec]) -> torch.Tensor | None:
    for s, v in zip(specs, vals):
        # (a Tensor slot may hold a Python number: `aten.sub.Tensor(1, x)`)
        if s.kind == TENSOR and isinstance(v, torch.Tensor) and v.device.type == DEVICE_TYPE:
            return v
        if s.kind in (TENSOR_LIST, OPT_TENSOR_LIST) and v:
            for x in v:
                if x is not None and x.device.type == DEVICE_TYPE:
                    return x
    for s, v in zip(specs, vals):
        if s.kind == TENSOR and isinstance(v, torch.Tensor):
            return v
    return None


def record(
    name: str,
    lw: Lowering,
    specs: list[ArgSpec],
    vals: list[Any],
    out_struct: Any,
    strides: Any = None,
    dtype_arg: int | None = None,
    aten: OpOverload | None = None,
    wrap: bool = True,
) -> tuple[Node, Any]:
    """Build the node for one call; returns it and the output structure of lazy tensors
    (`wrap=False`: of output indices, for a caller that only writes the values elsewhere).
    `aten`: the overload the node's arguments call (see `Node.aten`), if they do."""
    flat: list[TensorSpec] = []
    _flat_specs(out_struct, flat)
    # An explicit `dtype=` sets the result's dtype: scalars are lifted at it (full_like(bf16,
    # v, dtype=float64) keeps v's float64 value), not promoted with the input tensor.
    explicit_dtype = dtype_arg is not None and vals[dtype_arg] is not None
    lift_dtype = flat[0].dtype if flat else torch.float32
    rec = Recorder(None if explicit_dtype else _first_tensor(vals, specs), name, lift_dtype)
    args: list[Any] = []
    kwargs: list[tuple[str, Any]] = []
    for s, v in zip(specs, vals):
        k = s.kind
        if k == TENSOR or k == OPT_TENSOR:
            x = rec.tensor(v)
        elif k == TENSOR_LIST or k == OPT_TENSOR_LIST:
            x = tuple(rec.tensor(t) for t in v)
        elif k == SCALAR:
            x = rec.lift(v, lift_dtype)
        elif k == SCALAR_LIST:
            x = tuple(rec.lift(e, lift_dtype) for e in v)
        elif k == LIFT:
            x = v
            if isinstance(v, float) and not _is_unit(v):
                rec.inputs.append((scalar(v, torch.float64), 0))
                x = Ref(len(rec.inputs) - 1)
        elif k == GENERATOR:
            continue
        else:
            x = tuple(v) if isinstance(v, list) else v
        if s.kwarg_only:
            kwargs.append((s.name, x))
        else:
            args.append(x)
    if lw.random:
        from . import random_state

        seed, offset = random_state.next_offset()
        rec.inputs.append((rng_scalar(seed, "rng_seed", offset), 0))
        rec.inputs.append((rng_scalar(offset, "rng_offset", offset), 0))
        kwargs.append(("key", (Ref(len(rec.inputs) - 2), Ref(len(rec.inputs) - 1))))
    node = Node(
        name, lw.rule, tuple(rec.inputs), tuple(args), tuple(kwargs), tuple(flat), aten=aten
    )
    if not wrap:
        return node, _output_indices(out_struct, [0])
    return node, _wrap_outputs(node, out_struct, [0], strides)


def emit(
    name: str,
    rule: Callable[..., Any],
    inputs: tuple[tuple[Node, int], ...],
    args: tuple,
    spec: TensorSpec,
    aten: OpOverload | None = None,
) -> tuple[Node, int]:
    """A single-output node from already-recorded values (view replay, scatter, casts)."""
    return (Node(name, rule, inputs, args, (), (spec,), aten=aten), 0)


# --- kernels -------------------------------------------------------------------------------------

_lazy_tracing = "LazyTracing"


# Tracing time is summed per kernel call and flushed as LazyTracing when metrics are read: a
# sample per op (a lock, a timestamp, a deque entry) cost ~1 µs of a ~6 µs recording.
_tracing = [0, 0]  # nanoseconds, calls


def _trace(t0: int) -> None:
    _tracing[0] += time.perf_counter_ns() - t0
    _tracing[1] += 1


def _flush_tracing() -> None:
    ns, n = _tracing
    if n:
        _tracing[0] = _tracing[1] = 0
        metrics.metric_add_many(_lazy_tracing, ns, n)


metrics.flush_hooks.append(_flush_tracing)


def traced(counter: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A hand-written kernel counted as `counter` and timed as LazyTracing, as derived ones are
    (torch_xla times every kernel it runs, transfers included)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def kernel(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            metrics.counter_inc(counter)
            try:
                return fn(*args, **kwargs)
            finally:
                _trace(t0)

        return kernel

    return wrap


def _op_name(op: OpOverload) -> str:
    return op._schema.name


def _counter_name(op: OpOverload) -> str:
    return "xla::" + op._schema.name.split("::", 1)[1]


def _dtype_arg(specs: list[ArgSpec]) -> int | None:
    """The position of an op's `dtype=` argument (see `record`), decided once per op."""
    return next((i for i, s in enumerate(specs) if s.name == "dtype"), None)


def cast_value(v: tuple[Node, int], spec: TensorSpec) -> tuple[Node, int]:
    """`v` converted to `spec` (dtype cast, then broadcast), as a write into `spec` needs."""
    from .ops.creation import convert_rule, expand_rule

    src = v[0].specs[v[1]]
    if src.dtype != spec.dtype:
        v = emit(
            "aten::_to_copy",
            convert_rule,
            (v,),
            (Ref(0), spec.dtype),
            TensorSpec(src.shape, spec.dtype),
        )
    if src.shape != spec.shape:
        v = emit("aten::expand", expand_rule, (v,), (Ref(0), spec.shape), spec)
    return v


def _write_value(target: torch.Tensor, value: tuple[Node, int]) -> None:
    ts = state(target)
    write(ts, cast_value(value, ts.spec))


def _targets(out_struct: Any, vals: list[Any], specs: list[ArgSpec], writes: list[int]) -> Any:
    """(argument index, target tensor, result spec) for each tensor an in-place op writes."""
    results = out_struct if len(writes) > 1 else (out_struct,)
    for i, res in zip(writes, results):
        targets = vals[i] if specs[i].is_list_write else (vals[i],)
        res = res if specs[i].is_list_write else (res,)
        if isinstance(res, TensorSpec):
            res = (res,)
        for t, r in zip(targets, res):
            if t is not None and r is not None:
                yield i, t, r


def _fits(out_struct: Any, vals: list[Any], specs: list[ArgSpec], writes: list[int]) -> bool:
    """Whether each functional result can be written into its target as PyTorch allows."""
    return all(
        tuple(t.shape) == r.shape and torch.can_cast(r.dtype, t.dtype)
        for _, t, r in _targets(out_struct, vals, specs, writes)
    )


def _check_casts(out_struct: Any, vals: list[Any], specs: list[ArgSpec], writes: list[int]):
    for _, t, r in _targets(out_struct, vals, specs, writes):
        if not torch.can_cast(r.dtype, t.dtype):
            raise RuntimeError(
                f"result type {_dtype_name(r.dtype)} can't be cast to the desired output "
                f"type {_dtype_name(t.dtype)}"
            )


# Note [Overlapping writes]
# Eager refuses an in-place op whose target has elements sharing one memory location (an
# expanded or overlapping-window view) unless the op only stores values (fill_, zero_,
# masked_fill_, index_put_: TensorIterator's check_mem_overlap is off for them), and refuses one
# whose input partially overlaps its target (`x.add_(x.t())`). lazyxla's layouts and data pointers
# are eager's, so it applies the same checks (at::assert_no_internal_overlap /
# assert_no_partial_overlap). Only views can overlap anything, so a base target costs one test.
# Eager sees internal overlap only through a zero stride (at::has_internal_overlap answers "too
# hard" for overlapping windows: unfold, as_strided), and then runs the op in its loop order,
# each alias of a location overwriting the last. lazyxla refuses those in-place ops, with one
# exception that keeps eager's result: a `copy_` whose source holds a single value (a fill, a
# tensor of zeros, one element broadcast), which gives every alias the same value whatever the
# order. That is the copy autograd makes (CopySlices) in the backward of a fill of such a view:
# `t.unfold(0, 4, 2).zero_(); t.sum().backward()` copies zeros_like(grad) into the same windows
# of the gradient. A copy whose aliases could get different values (a masked fill's gradient)
# raises, naming the loop order, instead of picking one.
_OVERLAP_OK = frozenset({"fill_", "zero_", "masked_fill_", "index_put_", "_index_put_impl_"})
# Nodes whose output holds one value in every element.
_ONE_VALUE_OPS = frozenset(
    f"aten::{name}"
    for name in (
        "zeros_like",
        "ones_like",
        "full_like",
        "zeros",
        "ones",
        "full",
        "new_zeros",
        "new_ones",
        "new_full",
        "fill",
        "scalar_tensor",
    )
)


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    expected = 1
    for n, st in sorted(zip(t.shape, t.stride()), key=lambda p: p[1]):
        if n == 1:
            continue
        if st != expected:
            return False
        expected *= n
    return True


def _partial_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """at::get_overlap_status(a, b) == PARTIAL for two lazy tensors of one storage."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if not (_non_overlapping_and_dense(a) and _non_overlapping_and_dense(b)):
        return False  # TOO_HARD: eager does not check either
    a0, b0 = a.data_ptr(), b.data_ptr()
    a1, b1 = a0 + a.numel() * a.element_size(), b0 + b.numel() * b.element_size()
    if a0 == b0 and a1 == b1:
        return a.stride() != b.stride() or a.shape != b.shape
    return a0 < b1 and b0 < a1


def _one_value(t: torch.Tensor) -> bool:
    """Whether every element of lazy tensor `t` is known, at record time, to hold one value."""
    if all(n == 1 or st == 0 for n, st in zip(t.shape, t.stride())):
        return True  # one element, broadcast
    s = state(t)
    return s.base is None and read(s)[0].op in _ONE_VALUE_OPS


def check_write_overlap(target: torch.Tensor, source: torch.Tensor) -> None:
    """`copy_`'s checks (Note [Overlapping writes])."""
    ts, ss = state(target), state(source)
    if ts.base is None and ss.base is None:
        return
    if ts.base is not None and overlaps(tuple(target.shape), target.stride()):
        if any(st == 0 and n > 1 for n, st in zip(target.shape, target.stride())):
            raise RuntimeError(_INTERNAL_OVERLAP)  # eager's check sees a zero stride
        if not _one_value(source):
            raise RuntimeError(_LOOP_ORDER)
    if (ts.base or ts) is (ss.base or ss) and _partial_overlap(target, source):
        raise RuntimeError(_PARTIAL_OVERLAP)


_INTERNAL_OVERLAP = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)
_LOOP_ORDER = (
    "copy_ into a view whose elements share memory locations (overlapping windows: unfold, "
    "as_strided): eager writes each location once per alias, in its loop order, so the result "
    "depends on that order unless the source holds one value; lazyxla only takes such a source "
    "(a fill, zeros). clone() the view first, or write the base tensor."
)
_PARTIAL_OVERLAP = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer "
    "to a single memory location. Please clone() the tensor before performing the operation."
)


def _check_overlap(vals: list[Any], specs: list[ArgSpec], writes: list[int], ok: bool) -> None:
    for i in writes:
        t = vals[i]
        if not isinstance(t, torch.Tensor) or t.device.type != DEVICE_TYPE:
            continue
        ts = state(t)
        root = ts.base or ts
        if ts.base is not None and not ok and overlaps(tuple(t.shape), t.stride()):
            raise RuntimeError(_INTERNAL_OVERLAP)
        for j, s in enumerate(specs):
            if j in writes or s.kind not in (TENSOR, OPT_TENSOR):
                continue
            x = vals[j]
            if not isinstance(x, torch.Tensor) or x.device.type != DEVICE_TYPE or x is t:
                continue
            xs = state(x)
            if (xs.base or xs) is root and _partial_overlap(t, x):
                raise RuntimeError(_PARTIAL_OVERLAP)


_METADATA_INPLACE = frozenset(
    {"squeeze_", "unsqueeze_", "t_", "transpose_", "swapdims_", "swapaxes_", "as_strided_"}
)


def inplace_kernel(op: OpOverload, functional: OpOverload, lw: Lowering) -> Callable[..., Any]:
    """`add_` from `add`: compute functionally, then write each mutated argument."""
    specs = [ArgSpec(a, lw) for a in op._schema.arguments]
    fspecs = [ArgSpec(a, lw) for a in functional._schema.arguments]
    dtype_arg = _dtype_arg(fspecs)
    writes = [i for i, s in enumerate(specs) if s.is_write]
    name, counter = _op_name(functional), _counter_name(op)
    n_returns = len(op._schema.returns)
    # In-place ops that change a tensor's shape, not its values: derived from their functional
    # (view) twin, their result replaces the tensor instead of being written into it.
    reshapes = op._schema.name.split("::", 1)[1] in _METADATA_INPLACE
    overlap_ok = op._schema.name.split("::", 1)[1] in _OVERLAP_OK
    check_overlap = not reshapes
    foreach = len(writes) == 1 and specs[writes[0]].is_list_write
    # `out=` arguments (not `self` of an in-place op) take the result's shape, as eager's
    # resize_output gives them
    resized = frozenset(
        i for i in writes if op._schema.arguments[i].is_out and not specs[i].is_list_write
    )
    # a `dtype` argument an out= tensor's dtype fills (Note [Out= tensors of another dtype])
    dtype_slot = next(
        (i for i, s in enumerate(specs) if s.name == "dtype" and not s.is_write), None
    )
    if len(resized) != 1 or len(writes) != 1:
        dtype_slot = None

    def kernel(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        metrics.counter_inc(counter)
        vals = bind(specs, args, kwargs)
        if foreach and foreach_aliases(vals, specs, writes[0]):
            for one in _per_index(vals, specs):  # Note [Foreach ops that alias]
                run(one)
        else:
            run(vals)
        _trace(t0)
        if not n_returns:
            return None
        # (`max.dim_max(..., *, max, max_values)` returns both of its out= tensors)
        return vals[writes[0]] if n_returns == 1 else tuple(vals[i] for i in writes)

    def run(vals: list[Any]) -> None:
        out_struct = infer(functional, fspecs, vals, lw)
        if resized and any(
            t.dtype != r.dtype for _, t, r in _targets(out_struct, vals, specs, writes)
        ):
            out_dtype_probe(op, functional, specs, vals)  # Note [Out= tensors of another dtype]
            if dtype_slot is not None and vals[dtype_slot] is None:
                vals[dtype_slot] = vals[writes[0]].dtype
                out_struct = infer(functional, fspecs, vals, lw)
        if resized:
            _resize_outputs(out_struct, vals, specs, writes, resized)
        if not _fits(out_struct, vals, specs, writes):
            # PyTorch's own error for a broadcast into self (the in-place meta kernel's), then
            # eager's for a float result into an int tensor (the meta kernels word it otherwise).
            if not all(
                tuple(t.shape) == r.shape for _, t, r in _targets(out_struct, vals, specs, writes)
            ):
                infer(op, specs, vals)
            _check_casts(out_struct, vals, specs, writes)
            infer(op, specs, vals)
        if check_overlap:
            _check_overlap(vals, specs, writes, overlap_ok)
        if reshapes:  # squeeze_, unsqueeze_, t_, ...: the tensor takes the new shape
            _, out = record(name, lw, fspecs, vals, out_struct, dtype_arg=dtype_arg)
            vals[writes[0]].data = out
            return
        # The results are written straight from the node's outputs: no lazy tensor is made for
        # a value only written into another (Adam's foreach ops: 1/4 of their recording time).
        node, out = record(name, lw, fspecs, vals, out_struct, dtype_arg=dtype_arg, wrap=False)
        if len(writes) == 1 and not specs[writes[0]].is_list_write:
            _write_value(vals[writes[0]], (node, out if isinstance(out, int) else out[0]))
        else:
            results = out if len(writes) > 1 else (out,)
            for i, res in zip(writes, results):
                targets = vals[i] if specs[i].is_list_write else (vals[i],)
                res = res if specs[i].is_list_write else (res,)
                for t, r in zip(targets, res):
                    _write_value(t, (node, r))

    return kernel


def _resize_outputs(
    out_struct: Any, vals: list[Any], specs: list[ArgSpec], writes: list[int], resized: frozenset
) -> None:
    """Eager's resize_output for each `out=` tensor whose shape is not the result's: an empty
    one silently, another with eager's deprecation warning (an `out=torch.empty(0)` kept its
    shape and read back empty)."""
    for i, t, r in _targets(out_struct, vals, specs, writes):
        if i in resized and tuple(t.shape) != r.shape:
            if t.numel():
                warnings.warn(
                    f"An output with one or more elements was resized since it had shape "
                    f"{list(t.shape)}, which does not match the required output shape "
                    f"{list(r.shape)}. This behavior is deprecated, and in a future PyTorch "
                    f"release outputs will not be resized unless they have zero elements. You "
                    f"can explicitly reuse an out tensor t by resizing it, inplace, to zero "
                    f"elements with t.resize_(0).",
                    stacklevel=4,
                )
            t.resize_(r.shape)


# Note [Foreach ops that alias]
# Eager's foreach ops on the CPU run tensor by tensor: `_foreach_add_([a, b], [b, a])` adds the
# new `a` into `b`, and `_foreach_add_([a, a], 1)` adds twice. One node computing every output
# from the old values would not. So a foreach op one of whose written tensors is also read at
# another index (or written twice) is recorded one index at a time, as eager computes it; the
# common case (an optimizer's step: disjoint lists) stays one node.
_LISTS = (TENSOR_LIST, OPT_TENSOR_LIST)


def foreach_aliases(vals: list[Any], specs: list[ArgSpec], w: int) -> bool:
    """Whether a foreach op writing the tensors `vals[w]` reads one of them at another index."""
    where: dict[int, int] = {}
    for i, t in enumerate(vals[w]):
        s = state(t)
        if where.setdefault(id(s.base or s), i) != i:
            return True  # written twice
    for j, sp in enumerate(specs):
        v = vals[j]
        if j == w or v is None:
            continue
        if sp.kind in _LISTS:
            for i, t in enumerate(v):
                if isinstance(t, torch.Tensor) and t.device.type == DEVICE_TYPE:
                    s = state(t)
                    if where.get(id(s.base or s), i) != i:
                        return True
        elif sp.kind in (TENSOR, OPT_TENSOR) and isinstance(v, torch.Tensor):
            if v.device.type == DEVICE_TYPE and len(where) > 1:
                s = state(v)
                if id(s.base or s) in where:
                    return True
    return False


def _per_index(vals: list[Any], specs: list[ArgSpec]) -> list[list[Any]]:
    """A foreach call's arguments split into one call per index (lists of one element)."""
    n = len(next(v for sp, v in zip(specs, vals) if sp.is_list_write))
    return [
        [
            v[i : i + 1]
            if sp.kind in (*_LISTS, SCALAR_LIST) and isinstance(v, (list, tuple))
            else v
            for sp, v in zip(specs, vals)
        ]
        for i in range(n)
    ]


_VIEW_LAYOUTS: dict[tuple, tuple[TensorSpec, tuple[int, ...] | None, int]] = {}


def view_layout(
    op: OpOverload, specs: list[ArgSpec], vals: list[Any]
) -> tuple[TensorSpec, tuple[int, ...] | None, int]:
    """(spec, eager's strides or None when contiguous, storage offset from the parent's) of a
    view op's output, by its meta kernel on the parent's layout."""
    x = vals[0]
    key = (op, x.shape, x.dtype, x.stride(), *map(_sig, vals[1:]))
    hit = _VIEW_LAYOUTS.get(key)
    if hit is None:
        out = _meta_call(op, specs, vals)
        shape, stride = tuple(out.shape), tuple(out.stride())
        spec = TensorSpec(shape, out.dtype)
        hit = (spec, _noncontiguous(stride, shape), out.storage_offset())
        _VIEW_LAYOUTS[key] = hit
    return hit


# Note [Reading the tail of a cat]
# A sequence grown by `cat` each iteration (transformers' generated `input_ids`) is read back by
# its last element or slice (`input_ids[:, -1:]` as the next model input, `input_ids[:, -1]` for
# the end-of-sequence check). Recorded literally, that read depends on the whole sequence, whose
# length changes every iteration, so the graph that reads it would be new every iteration. A
# `slice`/`select` of a pending `cat` that falls inside one of its pieces is recorded on that
# piece instead (the same values), so it depends on the new token only. Together with Note [What
# a value read syncs] (graph.py), which leaves such pure data movement pending, a static-cache
# decode loop runs one graph per token whatever the sequence length.
_CAT, _SLICE, _SELECT = "aten::cat", "aten::slice", "aten::select"


def _narrow_cat(
    name: str, v: tuple[Node, int], statics: tuple, out_spec: TensorSpec
) -> tuple[tuple[Node, int], tuple]:
    """(value, statics) of a slice/select of the cat `v`, on the one piece it falls in if any."""
    while v[0].op == _CAT:
        node = v[0]
        full = node.specs[v[1]].shape
        refs = node.args[0]
        dim = statics[0] + len(full) if statics[0] < 0 else statics[0]
        cat_dim = node.args[1] if len(node.args) > 1 else 0
        cat_dim = cat_dim + len(full) if cat_dim < 0 else cat_dim
        if dim != cat_dim or not all(type(r) is Ref for r in refs):
            break
        size = full[dim]
        if name == _SELECT:
            start = statics[1] + size if statics[1] < 0 else statics[1]
            length = 1
        else:
            step = statics[3]
            if step != 1:
                break
            start = statics[1] if statics[1] is not None else 0
            start = min(max(start + size if start < 0 else start, 0), size)
            length = out_spec.shape[dim]
        off, piece = 0, None
        for r in refs:
            pv = node.inputs[r]
            pshape = pv[0].specs[pv[1]].shape
            if len(pshape) != len(full):
                piece = None  # a legacy empty (0,) piece: leave the cat alone
                break
            n = pshape[dim]
            if off <= start and start + length <= off + n and n > 0:
                piece = (pv, off)
            off += n
        if piece is None:
            break
        v, off = piece
        if name == _SELECT:
            statics = (statics[0], start - off)
        else:
            statics = (statics[0], start - off, start - off + length, 1)
    return v, statics


def _view_key(x: torch.Tensor, statics: tuple) -> tuple | None:
    """A view call's signature (Note [Recording plans]): its input's layout and its statics,
    exactly; None when a static is not an int, a list of ints, a bool, None or a dtype."""
    key: list[Any] = [x.shape, x.dtype, x.stride()]
    for v in statics:
        t = type(v)
        if t is int or v is None or t is torch.dtype:
            key.append(v)
        elif t is bool:
            key.append((bool, v))
        elif t is list or t is tuple:
            if not all(type(e) is int for e in v):
                return None
            key.append((t, *v))
        else:
            return None
    return tuple(key)


def view_kernel(
    op: OpOverload, lw: Lowering, scatter: Callable[..., Any] | None
) -> Callable[..., Any]:
    """A view op: the output aliases its input (see Note [Views and mutation]), with eager's
    strides and storage offset. What a call records depends only on its signature, so the view
    step (`ViewOp`) and layout are kept per signature, as a functional kernel keeps its plans
    (Note [Recording plans])."""
    specs = [ArgSpec(a, lw) for a in op._schema.arguments]
    name, counter = _op_name(op), _counter_name(op)
    scatter_name = name + "_scatter"
    narrows = name in (_SLICE, _SELECT)
    nargs = len(specs)
    counters = metrics._counters
    plans: dict[tuple, tuple] = {}

    def make(
        x: torch.Tensor, vals: list[Any] | tuple
    ) -> tuple[ViewOp, TensorSpec, tuple[int, ...] | None, int, bool]:
        out_spec, stride, delta = view_layout(op, specs, vals)
        runtime.check_dtype(out_spec.dtype, f"aten::{name.split('::')[-1]}")  # complex32 views
        statics = tuple(tuple(v) if isinstance(v, list) else v for v in vals[1:])
        in_spec = state(x).spec
        args = (Ref(0), *statics)
        out_specs = (out_spec,)
        desc: list[int] = []  # the node's interned descriptor, once known

        def apply(v: tuple[Node, int]) -> tuple[Node, int]:
            if narrows and v[0].op == _CAT:  # See Note [Reading the tail of a cat]
                v, st = _narrow_cat(name, v, statics, out_spec)
                return emit(name, lw.rule, (v,), (Ref(0), *st), out_spec, op)
            if desc and not FLAGS.ir_debug:
                node = node_with_desc(name, lw.rule, (v,), args, (), out_specs, desc[0], op)
                return (node, 0)
            out = emit(name, lw.rule, (v,), args, out_spec, op)
            desc.append(out[0].desc)
            return out

        do_scatter = None
        if scatter is not None:  # Note [Overlapping writes]: the writing op checks overlap

            def do_scatter(parent: tuple[Node, int], new: tuple[Node, int]) -> tuple[Node, int]:
                return emit(
                    scatter_name, scatter, (parent, new), (Ref(0), Ref(1), *statics), in_spec
                )

        overlap = stride is not None and overlaps(out_spec.shape, stride)
        return ViewOp(name, apply, do_scatter), out_spec, stride, delta, overlap

    def kernel(*args: Any, **kwargs: Any) -> Any:
        counters[counter] = counters.get(counter, 0) + 1
        vals = args if not kwargs and len(args) == nargs else bind(specs, args, kwargs)
        x = vals[0]
        key = _view_key(x, vals[1:])
        plan = plans.get(key) if key is not None else None
        if plan is None:
            plan = make(x, vals)
            if key is not None:
                plans[key] = plan
        view_op, out_spec, stride, delta, overlap = plan
        offset = x.storage_offset()
        if out_spec.dtype.itemsize != x.dtype.itemsize:  # view(dtype), view_as_real/complex
            offset = offset * x.dtype.itemsize // out_spec.dtype.itemsize
        return new_view(x, view_op, out_spec, stride, offset + delta, overlap=overlap)

    return kernel


def as_strided_kernel(rule: Callable[..., Any], scatter: Callable[..., Any]) -> Callable[..., Any]:
    """`as_strided` reads the storage, not the logical tensor: its view is taken from the root
    base's value laid out in the root's storage order (see Note [Views and mutation])."""
    name = "aten::as_strided"

    def kernel(
        x: torch.Tensor, size: Any, stride: Any, storage_offset: int | None = None
    ) -> torch.Tensor:
        metrics.counter_inc("xla::as_strided")
        s = state(x)
        root = s.base or s
        size, stride = tuple(size), tuple(stride)
        offset = x.storage_offset() if storage_offset is None else storage_offset
        need = storage_nbytes(size, stride, x.dtype.itemsize) + offset * x.dtype.itemsize
        if 0 not in size and need > x.untyped_storage().nbytes():
            raise RuntimeError(
                f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset "
                f"{offset}, and itemsize {x.dtype.itemsize} requiring a storage size of {need} "
                f"are out of bounds for storage of size {x.untyped_storage().nbytes()}"
            )
        spec = TensorSpec(size, x.dtype)
        statics = (size, stride, offset, root.stride, x.dtype)

        def apply(v: tuple[Node, int]) -> tuple[Node, int]:
            return emit(name, rule, (v,), (Ref(0), *statics), spec)

        def do_scatter(parent: tuple[Node, int], new: tuple[Node, int]) -> tuple[Node, int]:
            return emit(
                name + "_scatter", scatter, (parent, new), (Ref(0), Ref(1), *statics), root.spec
            )

        view = ViewOp(name, apply, do_scatter)
        return new_view(x, view, spec, _noncontiguous(stride, size), offset, root=root)

    return kernel


def register_kernel(op: OpOverload, kernel: Callable[..., Any]) -> None:
    ns = op.namespace
    lib = _libs.get(ns)
    if lib is None:
        lib = _libs[ns] = torch.library.Library(ns, "IMPL")
    lib.impl(op, kernel, "PrivateUse1")
