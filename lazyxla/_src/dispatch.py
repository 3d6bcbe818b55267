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
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch._ops import OpOverload

from . import metrics
from .ir import (
    Node,
    Ref,
    TensorSpec,
    _user_frame,
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
    _flat_specs,
)
from .ops.registry import Lowering
from .tensor import (
    DEVICE_TYPE,
    new_tensor,
    read,
    state,
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

# Note [Index operands keep their dtype]
# A 0-d CPU tensor is lifted at its promotion with the op's first lazy tensor: an operand of a
# pointwise op computes in the common dtype (Note [Integer scalars of floating results]). An
# index does not promote: `F.embedding(torch.tensor(5), w)`, `w.index_select(0, torch.tensor(5))`,
# `F.nll_loss(logp, torch.tensor(3))` read it as an integer whatever `w`'s dtype. Lifted as float
# (5.0), it failed to lower ("indices must have an integer type"), where eager computes. So an
# argument that holds indices (by its schema name; `target` only in losses whose target is a
# class index) is lifted at its own dtype. (A unit, 0 or 1, is baked either way.)
_INDEX_ARGS = frozenset(
    (
        "index",
        "indices",
        "offsets",
        "offset2bag",
        "repeats",
        "lengths",
        "input_lengths",
        "target_lengths",
        "targets",
        "sorter",
        "tensor_indices_or_sections",
    )
)


def _is_index_arg(op: str, arg: str) -> bool:
    if arg == "target":
        return "nll_loss" in op or op.startswith(("aten::multi_margin", "aten::multilabel_margin"))
    return arg in _INDEX_ARGS


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
        "op",
    )

    def __init__(
        self, ref: torch.Tensor | None, op: str = "", result: torch.dtype | None = None
    ) -> None:
        self.inputs: list[tuple[Node, int]] = []
        self.op = op
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

    def tensor(self, t: Any, arg: str = "") -> Any:
        """`t`'s node input; `arg`: the name of the argument it is (or is in)."""
        if t is None:
            return None
        if not isinstance(t, torch.Tensor):  # a Python number in a Tensor slot (wrapped number)
            other = self.opmath_other and bool(self.inputs)
            return self._lift(t, torch.get_default_dtype(), other)
        if t.device.type == DEVICE_TYPE:
            self.inputs.append(read(state(t)))
            return Ref(len(self.inputs) - 1)
        if t.dim() == 0:
            # (an index keeps its own dtype: Note [Index operands keep their dtype])
            own = self.ref is None or _is_index_arg(self.op, arg)
            dtype = t.dtype if own else self._promoted(t)
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
        integral (`int_t.addcmul_(a, b, value=2.5)`, also with `a` and `b` of another integer
        dtype: `uint8_t.addcmul_(int8_a, int8_b, value=0.5)` computes in int16) is converted to it
        first, as eager's `value.to<scalar_t>()` does (2.5 -> 2; promoted to float, it computed
        int_t + 2.5 * a * b). A comparison (a bool result) computes in the promoted type."""
        if (
            result is not None
            and type(v) is float
            and not _is_floating(result)
            and result != torch.bool
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


def node_aten(op: OpOverload, lw: Lowering, kinds: Iterable[int]) -> OpOverload | None:
    """The overload a node's arguments call in schema order (`Node.aten`): `op`, unless the
    node leaves a generator out or adds a random key."""
    return None if lw.random or GENERATOR in kinds else op


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
            x = rec.tensor(v, s.name)
        elif k == TENSOR_LIST or k == OPT_TENSOR_LIST:
            x = tuple(rec.tensor(t, s.name) for t in v)
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


def register_kernel(op: OpOverload, kernel: Callable[..., Any]) -> None:
    ns = op.namespace
    lib = _libs.get(ns)
    if lib is None:
        lib = _libs[ns] = torch.library.Library(ns, "IMPL")
    lib.impl(op, kernel, "PrivateUse1")
