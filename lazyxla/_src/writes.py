"""In-place and `out=` kernels, derived from the functional rule: the functional op is recorded and
its results written into the mutated arguments (Note [Views and mutation] in tensor.py), with
eager's checks on what an in-place write may do (Note [Overlapping writes]), `out=` tensors resized
and typed as eager's kernels do (Note [Out= tensors of another dtype] in meta.py), and foreach ops
split where their lists alias (Note [Foreach ops that alias])."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload

from . import metrics
from .dispatch import _counter_name, _dtype_arg, _op_name, _trace, emit, node_aten, record
from .ir import Node, Ref, TensorSpec
from .meta import (
    OPT_TENSOR,
    OPT_TENSOR_LIST,
    SCALAR_LIST,
    TENSOR,
    TENSOR_LIST,
    ArgSpec,
    _dtype_name,
    bind,
    infer,
    out_dtype_probe,
)
from .ops.registry import Lowering
from .tensor import DEVICE_TYPE, overlaps, read, state, write


def cast_value(v: tuple[Node, int], spec: TensorSpec) -> tuple[Node, int]:
    """`v` converted to `spec` (dtype cast, then broadcast), as a write into `spec` needs."""
    src = v[0].specs[v[1]]
    if src.dtype == spec.dtype and src.shape == spec.shape:
        return v  # (the common write: no rule needed, and no import on every call)
    from .ops.creation import convert_rule, expand_rule

    if src.dtype != spec.dtype:
        v = emit(
            "aten::_to_copy",
            convert_rule,
            (v,),
            (Ref(0), spec.dtype),
            TensorSpec(src.shape, spec.dtype),
            aten=_TO_COPY,  # (its dtype is keyword-only: recorded after the positional ones)
        )
    if src.shape != spec.shape:
        v = emit("aten::expand", expand_rule, (v,), (Ref(0), spec.shape), spec, aten=_EXPAND)
    return v


_TO_COPY, _EXPAND = torch.ops.aten._to_copy.default, torch.ops.aten.expand.default


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
# raises, naming the loop order, instead of picking one. A store that writes some elements only
# (masked_fill_, index_put_) is merged back through an expand per element of the expanded tensor:
# each location takes the last alias that changed it. Through a view of a narrower dtype (an int16
# view of an expanded int32 tensor), aliases change different parts of one element, and picking
# one alias's element lost the others' parts (a masked fill wrote garbage, found by the view
# fuzzer); such a write raises instead (_SUB_ELEMENT). A narrower view below the aliasing one
# (an expand of a tensor's imaginary part) merges at its own elements, and is not refused.
_PARTIAL_STORES = frozenset({"masked_fill_", "index_put_", "_index_put_impl_"})
_OVERLAP_OK = _PARTIAL_STORES | {"fill_", "zero_"}
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


def non_overlapping_and_dense(t: torch.Tensor) -> bool:
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
    if not (non_overlapping_and_dense(a) and non_overlapping_and_dense(b)):
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
_SUB_ELEMENT = (
    "a masked_fill_ or index_put_ into a view whose elements share memory locations, through a "
    "view of a narrower dtype than the tensor it views (an int16 view of an expanded int32 "
    "tensor): its aliases would write different parts of one element, which lazyxla does not "
    "merge. clone() the view first, or write the tensor of the expand's dtype."
)
_PARTIAL_OVERLAP = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer "
    "to a single memory location. Please clone() the tensor before performing the operation."
)


_ALIASING_VIEWS = frozenset({"aten::expand", "aten::unfold", "aten::as_strided"})


def _narrower_than_its_aliases(t: torch.Tensor, ts: Any) -> bool:
    """Whether view `t`'s elements are narrower than those of a view in its chain that can make
    aliases (an int16 view of an expanded int32 tensor; not an expand of an int16 view)."""
    size = t.element_size()
    v = ts.base.value
    for op in ts.chain:
        if op.name in _ALIASING_VIEWS and v[0].specs[v[1]].dtype.itemsize > size:
            return True
        v = op.apply(v)
    return False


def _check_overlap(
    vals: list[Any], specs: list[ArgSpec], writes: list[int], ok: bool, partial: bool = False
) -> None:
    for i in writes:
        t = vals[i]
        if not isinstance(t, torch.Tensor) or t.device.type != DEVICE_TYPE:
            continue
        ts = state(t)
        root = ts.base or ts
        if ts.base is not None and overlaps(tuple(t.shape), t.stride()):
            if not ok:
                raise RuntimeError(_INTERNAL_OVERLAP)
            if partial and _narrower_than_its_aliases(t, ts):
                raise RuntimeError(_SUB_ELEMENT)
        for j, s in enumerate(specs):
            if j in writes or s.kind not in (TENSOR, OPT_TENSOR):
                continue
            x = vals[j]
            if not isinstance(x, torch.Tensor) or x.device.type != DEVICE_TYPE or x is t:
                continue
            xs = state(x)
            if (xs.base or xs) is root and _partial_overlap(t, x):
                raise RuntimeError(_PARTIAL_OVERLAP)


_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
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
    short_name = op._schema.name.split("::", 1)[1]
    reshapes = short_name in _METADATA_INPLACE
    overlap_ok = short_name in _OVERLAP_OK
    partial_store = short_name in _PARTIAL_STORES
    foreach = len(writes) == 1 and specs[writes[0]].is_list_write
    # `out=` arguments (not `self` of an in-place op) take the result's shape, as eager's
    # resize_output gives them
    resized = frozenset(
        i for i in writes if op._schema.arguments[i].is_out and not specs[i].is_list_write
    )
    pointwise = torch.Tag.pointwise in functional.tags
    # a `dtype` argument an out= tensor's dtype fills (Note [Out= tensors of another dtype])
    dtype_slot = next(
        (i for i, s in enumerate(specs) if s.name == "dtype" and not s.is_write), None
    )
    if len(resized) != 1 or len(writes) != 1:
        dtype_slot = None
    # The node's arguments call `functional` in schema order, as a functional kernel's do (a
    # foreach node's outputs are lists; a reshaping op records no node)
    aten = None if foreach or reshapes else node_aten(functional, lw, [s.kind for s in fspecs])

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if reshapes and not hasattr(args[0].untyped_storage(), "_lx"):
            # A wrapper tensor's metadata (functionalization's FunctionalTensor replays an
            # in-place view op on it with dispatch off, under torch.compile): no lazy value to
            # change, so only its sizes and strides, by the op's meta kernel.
            return op._handle.redispatch_boxed(_META, *args, **kwargs)
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
        if reshapes:  # squeeze_, unsqueeze_, t_, ...: the tensor takes the new shape
            # as a view of its own storage, with eager's strides and errors (view_kernels.py),
            # so it stays an alias of every other view of that storage
            try:
                vals[writes[0]].data = functional(*vals)
            except RuntimeError as e:  # (t's check, worded for t_ as eager words it)
                if name == "aten::t" and str(e).startswith("t() "):
                    raise RuntimeError("t_() " + str(e)[4:]) from None
                raise
            return
        out_struct = infer(functional, fspecs, vals, lw)
        if resized and any(
            t.dtype != r.dtype for _, t, r in _targets(out_struct, vals, specs, writes)
        ):
            out_dtype_probe(op, functional, specs, vals)  # Note [Out= tensors of another dtype]
            if dtype_slot is not None and vals[dtype_slot] is None:
                vals[dtype_slot] = vals[writes[0]].dtype
                out_struct = infer(functional, fspecs, vals, lw)
        if resized:
            _resize_outputs(out_struct, vals, specs, writes, resized, pointwise)
        if not _fits(out_struct, vals, specs, writes):
            # PyTorch's own error for a broadcast into self (the in-place meta kernel's), then
            # eager's for a float result into an int tensor (the meta kernels word it otherwise).
            if not all(
                tuple(t.shape) == r.shape for _, t, r in _targets(out_struct, vals, specs, writes)
            ):
                infer(op, specs, vals)
            _check_casts(out_struct, vals, specs, writes)
            infer(op, specs, vals)
        _check_overlap(vals, specs, writes, overlap_ok, partial_store)
        # The results are written straight from the node's outputs: no lazy tensor is made for
        # a value only written into another (Adam's foreach ops: 1/4 of their recording time).
        node, out = record(
            name, lw, fspecs, vals, out_struct, dtype_arg=dtype_arg, wrap=False, aten=aten
        )
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
    out_struct: Any,
    vals: list[Any],
    specs: list[ArgSpec],
    writes: list[int],
    resized: frozenset,
    pointwise: bool,
) -> None:
    """Eager's resize_output for each `out=` tensor whose shape is not the result's: an empty
    one silently, another with eager's deprecation warning (an `out=torch.empty(0)` kept its
    shape and read back empty)."""
    for i, t, r in _targets(out_struct, vals, specs, writes):
        if i in resized and tuple(t.shape) != r.shape:
            if pointwise and _reads(t, vals, specs, writes):
                # eager's TensorIterator does not resize an output it also reads
                raise RuntimeError(
                    f"output with shape {list(t.shape)} doesn't match the broadcast shape "
                    f"{list(r.shape)}"
                )
            resize_output(t, r.shape, stacklevel=5)


def _reads(t: torch.Tensor, vals: list[Any], specs: list[ArgSpec], writes: list[int]) -> bool:
    """Whether `t` is also one of the op's inputs (`torch.mul(x, y, out=x)`; `ldexp_` is that
    call; eager's TensorIterator compares the tensors, not their storage): a pointwise op then
    raises eager's broadcast error instead of resizing `t`."""
    return any(
        vals[j] is t
        for j, s in enumerate(specs)
        if j not in writes and s.kind in (TENSOR, OPT_TENSOR)
    )


def resize_output(t: torch.Tensor, shape: tuple[int, ...], stacklevel: int = 3) -> None:
    """Eager's `at::native::resize_output`: `t` takes `shape`, silently when it is empty, with
    eager's deprecation warning otherwise."""
    if tuple(t.shape) == tuple(shape):
        return
    if t.numel():
        warnings.warn(
            f"An output with one or more elements was resized since it had shape "
            f"{list(t.shape)}, which does not match the required output shape "
            f"{list(shape)}. This behavior is deprecated, and in a future PyTorch "
            f"release outputs will not be resized unless they have zero elements. You "
            f"can explicitly reuse an out tensor t by resizing it, inplace, to zero "
            f"elements with t.resize_(0).",
            stacklevel=stacklevel,
        )
    t.resize_(shape)


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
