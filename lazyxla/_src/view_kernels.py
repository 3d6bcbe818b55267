"""View kernels: a view op's output aliases its input with eager's strides and storage offset
(Note [Views and mutation] in tensor.py); what a call records is kept per signature."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload

from . import metrics, runtime
from .config import FLAGS
from .dispatch import _counter_name, _op_name, emit
from .ir import Node, Ref, TensorSpec, node_with_desc
from .meta import ArgSpec, _meta_call, _noncontiguous, _sig, bind
from .ops.registry import Lowering
from .tensor import ViewOp, contiguous_strides, new_view, overlaps, state, storage_nbytes

_VIEW_LAYOUTS: dict[tuple, tuple[TensorSpec, tuple[int, ...] | None, int]] = {}
_GUARDED_PER_SPEC = 8  # guarded view plans kept per input spec (a cheap miss each)


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
    ) -> tuple[ViewOp, TensorSpec, tuple[int, ...] | None, int, bool, tuple[int, ...]]:
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
        layout = stride or contiguous_strides(out_spec.shape)
        return ViewOp(name, apply, do_scatter), out_spec, stride, delta, overlap, layout

    # Note [Guarded plans] in recording.py, for views: by the input's spec, each plan with the
    # input strides and the arguments after it that its call had (a schema types each of them,
    # so == on the same positions is the key's exact comparison).
    guarded: dict[TensorSpec, list[tuple[tuple[int, ...], tuple, tuple]]] = {}

    def kernel(*args: Any, **kwargs: Any) -> Any:
        counters[counter] = counters.get(counter, 0) + 1
        plan = s = None
        if not kwargs:
            x = args[0]
            s = getattr(x.untyped_storage(), "_lx", None)
            if s is not None:
                fns = guarded.get(s.spec)
                if fns:
                    rest, x_stride = args[1:], x.stride()
                    for in_stride, r, p in fns:
                        if r == rest and in_stride == x_stride:
                            plan = p
                            break
        if plan is None:
            vals = args if not kwargs and len(args) == nargs else bind(specs, args, kwargs)
            x = vals[0]
            key = _view_key(x, vals[1:])
            plan = plans.get(key) if key is not None else None
            if plan is None:
                plan = make(x, vals)
                if key is not None:
                    plans[key] = plan
            if key is not None and s is not None:  # (`s`: read above when no kwargs)
                fns = guarded.setdefault(s.spec, [])
                if len(fns) < _GUARDED_PER_SPEC:
                    fns.append((x.stride(), args[1:], plan))
        view_op, out_spec, stride, delta, overlap, layout = plan
        offset = x.storage_offset()
        if out_spec.dtype.itemsize != x.dtype.itemsize:  # view(dtype), view_as_real/complex
            offset = offset * x.dtype.itemsize // out_spec.dtype.itemsize
        return new_view(
            x, view_op, out_spec, stride, offset + delta, overlap=overlap, ps=s, layout=layout
        )

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
