"""Functional kernels and their recording plans: the hot path of recording an op.

`functional_kernel` builds the PrivateUse1 kernel of an op with a lowering and no mutated
argument. Its first call of each argument signature takes dispatch.py's slow path (meta
inference, `record`) and keeps a plan; later calls of that signature replay the plan (Note
[Recording plans]).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload

from . import dispatch, metrics
from .config import FLAGS
from .dispatch import (
    STORES_SCALAR,
    _counter_name,
    _dtype_arg,
    _is_unit,
    _op_name,
    _trace,
    _wrap_outputs,
    record,
)
from .ir import SCALAR as _SCALAR_OP
from .ir import Node, TensorSpec, node_with_desc, scalar_fast
from .meta import (
    GENERATOR,
    OPT_TENSOR,
    SCALAR,
    SCALAR_LIST,
    STATIC,
    TENSOR,
    TENSOR_LIST,
    ArgSpec,
    EagerRefused,
    bind,
    infer_layout,
    per_call_check,
    scalar_class,
)
from .ops.registry import Lowering
from .tensor import STATE_FILL_OPS, check_device, new_tensor, read, storage_nbytes
from .writes import _METADATA_INPLACE, foreach_aliases
from .writes import inplace_kernel as _dispatch_inplace_kernel

# Note [Recording plans]
# Recording an op is mostly work that depends only on the call's *signature*: its tensors'
# shapes, dtypes and strides, which Python scalars are units (baked) and which are lifted, the
# dtype each lifted scalar gets, its static arguments. A functional kernel keeps, per signature,
# a plan made from the first call's slow path: the output specs and strides, the node's argument
# template and interned descriptor, where each input comes from and each lifted scalar's dtype.
# A later call with the same signature only reads its tensors' values, lifts its scalars and
# builds the node and the output tensors. The signature holds everything the slow path's choices
# depend on (a 0-d CPU tensor's promotion with the first lazy tensor, because a wrapped Python
# number and a 0-d tensor promote differently; a tensor list's length; a factory's device; the
# default dtype, which types the floating result of integer inputs and a factory's output given
# no dtype), and ops with lists of optional tensors, generator or float static arguments,
# random ops, and XLA_IR_DEBUG (source lines) always take the slow path. Only lifted values are
# read from a later call: a unit (a baked 0 or 1) is in the signature itself.
_FAST_KINDS = frozenset((TENSOR, OPT_TENSOR, SCALAR, STATIC, TENSOR_LIST, SCALAR_LIST))
_LIFTED = object()
_EXACT_STATICS = (torch.dtype, str, torch.memory_format, torch.layout, torch.device)
_default_dtype = torch.get_default_dtype
_now = time.perf_counter_ns
_tracing = dispatch._tracing  # (the timing `_trace` sums, inlined on the replay paths)


def _plan_key(
    kinds: tuple[int, ...], vals: list[Any] | tuple, items: list[Any], states: list[Any]
) -> tuple | None:
    """The recording signature of a call (Note [Recording plans]), or None: no plan for it.
    `items` receives the values the call lifts from its 0-d CPU tensors and scalar lists,
    `states` its lazy tensors' states, in order."""
    key: list[Any] = []
    ref = None
    wrapped = None
    # The kinds are the op's, fixed per position, so a position's key need not repeat its kind:
    # the cheap, common cases (Python numbers, None, bools) are tested first, by type.
    for k, v in zip(kinds, vals):
        t = type(v)
        if t is float or t is int:
            if k == STATIC:
                if t is float:
                    return None  # a float static may shape the program: slow path
                key.append(v)
                continue
            # (v != 0 and v != 1: lifted, NaN too; only 0 and 1 need _is_unit's care)
            if v != 0 and v != 1 or not _is_unit(v):
                # A `Scalar` slot converts the checked way: Note [Checked scalar conversions].
                key.append((t, _LIFTED, scalar_class(v)) if k == SCALAR else (t, _LIFTED))
            else:
                key.append((t, v))
        elif v is None:
            key.append(None)
        elif t is bool:
            key.append((bool, v))
        elif k == STATIC:
            if t in _EXACT_STATICS:  # values equal only when the same program
                key.append(v)
            elif t is list or t is tuple:
                if not all(type(e) is int for e in v):
                    return None
                key.append((t, *v))
            else:
                return None
        elif k == TENSOR_LIST:  # (`cat`'s tensors, a foreach op's lists)
            if t is not list and t is not tuple:
                return None
            key.append(len(v))  # ([a, b], [c]) and ([a], [b, c]) are two signatures
            for e in v:
                s = (
                    getattr(e.untyped_storage(), "_lx", None)
                    if isinstance(e, torch.Tensor)
                    else None
                )
                if s is None:
                    return None  # a CPU tensor or None in the list: slow path
                if ref is None:
                    ref = e
                states.append(s)
                key.append(s.spec if s.base is None else (s.spec, e.stride()))
                if s.stride is not None:
                    key.append(s.stride)
        elif k == SCALAR_LIST:  # (a foreach op's per-tensor scalars: Adam's step sizes)
            if t is not list and t is not tuple:
                return None
            key.append(len(v))
            for e in v:
                te = type(e)
                if te is float or te is int:
                    if e != 0 and e != 1 or not _is_unit(e):
                        items.append(e)
                        key.append((te, _LIFTED))
                    else:
                        key.append((te, e))
                elif te is bool:
                    key.append((bool, e))
                else:
                    return None
        elif k == SCALAR or not isinstance(v, torch.Tensor):
            return None
        else:
            s = getattr(v.untyped_storage(), "_lx", None)
            if s is not None:
                if ref is None and k == TENSOR:
                    ref = v
                states.append(s)
                # A base's layout is its state's (`new_tensor`); a view's is on the tensor.
                key.append(s.spec if s.base is None else (s.spec, v.stride()))
                if s.stride is not None:
                    key.append(s.stride)
            elif v.is_cpu and not v.dim():
                x = v.item()
                if _is_unit(x):  # baked: the key holds it
                    key.append((v.dtype, x))
                else:
                    items.append(x)
                    # (its class: some ops convert it the checked way, Note [Checked scalar
                    # conversions])
                    c = scalar_class(x) if type(x) is int or type(x) is float else None
                    key.append((v.dtype, _LIFTED, c))
                wrapped = [v] if wrapped is None else [*wrapped, v]
            else:
                return None
    if wrapped is not None:
        if ref is None:
            return None
        key.append(tuple([torch.result_type(ref, w) for w in wrapped]))
    # The default dtype types a floating result of integer inputs (`sin(int_tensor)`,
    # `int_tensor * 2.5`) and of a factory given no dtype.
    key.append(_default_dtype())
    return tuple(key)


class _Plan:
    """What a call of one signature records (Note [Recording plans])."""

    __slots__ = (
        "name",
        "rule",
        "sources",
        "unary",
        "args",
        "kwargs",
        "specs",
        "desc",
        "aten",
        "outputs",
    )

    def __init__(
        self,
        node: Node,
        kinds: tuple[int, ...],
        vals: list[Any],
        out_struct: Any,
        strides: Any,
        stores: bool = False,
    ) -> None:
        # Where each input of `node` came from, in order: (None, None) the next lazy tensor
        # (`states`), (None, dtype) the next value lifted from a 0-d CPU tensor or a scalar list
        # (`items`), (position, dtype) the Python number at that position.
        sources: list[tuple[int | None, Any]] = []
        inputs = node.inputs

        def lifted(dtype_from: int | None) -> None:
            j = len(sources)
            if j >= len(inputs) or inputs[j][0].op != _SCALAR_OP:
                raise _NoPlan
            sources.append((dtype_from, inputs[j][0].specs[0].dtype))

        for i, v in enumerate(vals):
            k = kinds[i]
            if k == TENSOR_LIST:
                sources.extend((None, None) for _ in v)
            elif k == SCALAR_LIST:
                for e in v:
                    if _is_lifted(e):
                        lifted(None)
            elif isinstance(v, torch.Tensor) and not v.is_cpu:
                sources.append((None, None))
            elif k != STATIC and (
                _is_lifted(v) or stores and k == SCALAR and type(v) in (bool, int, float)
            ):  # (a fill's Scalar is lifted even when a unit: STORES_SCALAR)
                lifted(None if isinstance(v, torch.Tensor) else i)
        if len(sources) != len(inputs):
            raise _NoPlan
        self.name = node.op
        self.rule = node.rule
        self.sources = tuple(sources)
        self.unary = self.sources == ((None, None),)
        self.args = node.args
        self.kwargs = node.kwargs
        self.specs = node.specs
        self.desc = node.desc
        self.aten = node.aten
        if isinstance(out_struct, TensorSpec):
            st = strides[0] if strides is not None else None
            nbytes = storage_nbytes(out_struct.shape, st, out_struct.dtype.itemsize)
            self.outputs = (out_struct, st, nbytes)
        else:
            self.outputs = (out_struct, strides, None)

    def run(self, vals: list[Any] | tuple, items: list[Any], states: list[Any]) -> Any:
        if self.unary:  # one lazy tensor in, nothing lifted: `node` without its loop
            s = states[0]
            b = s.base
            value = s.value if b is None or s.seen == b.version else read(s)
            node = node_with_desc(
                self.name,
                self.rule,
                (value,),
                self.args,
                self.kwargs,
                self.specs,
                self.desc,
                self.aten,
            )
        else:
            node = self.node(vals, items, states)
        struct, stride, nbytes = self.outputs
        if nbytes is not None:
            return new_tensor((node, 0), struct, stride, nbytes)
        return _wrap_outputs(node, struct, [0], stride)

    def node(self, vals: list[Any] | tuple, items: list[Any], states: list[Any]) -> Node:
        inputs = []
        it = st = 0
        for i, dtype in self.sources:
            if dtype is None:
                s = states[st]
                st += 1
                b = s.base
                inputs.append(s.value if b is None or s.seen == b.version else read(s))
            elif i is None:
                inputs.append((scalar_fast(items[it], dtype), 0))
                it += 1
            else:
                inputs.append((scalar_fast(vals[i], dtype), 0))
        return node_with_desc(
            self.name,
            self.rule,
            tuple(inputs),
            self.args,
            self.kwargs,
            self.specs,
            self.desc,
            self.aten,
        )


class _NoPlan(Exception):
    pass


def _is_lifted(v: Any) -> bool:
    """Whether the slow path lifts `v` (a number or a 0-d CPU tensor) to a graph input."""
    if isinstance(v, torch.Tensor):
        v = v.item()
    return (type(v) is float or type(v) is int) and not _is_unit(v)


def functional_kernel(op: OpOverload, lw: Lowering) -> Callable[..., Any]:
    specs = [ArgSpec(a, lw) for a in op._schema.arguments]
    dtype_arg = _dtype_arg(specs)
    name, counter = _op_name(op), _counter_name(op)
    device_args = [
        i for i, a in enumerate(op._schema.arguments) if str(a.type) == "Optional[Device]"
    ]
    kinds = tuple(s.kind for s in specs)
    planned = not lw.random and _FAST_KINDS.issuperset(kinds)
    # The node's arguments call `op` in schema order unless a generator is left out or a key
    # added (Node.aten).
    aten = None if lw.random or GENERATOR in kinds else op
    stores = name in STORES_SCALAR
    plans: dict[tuple, _Plan | None] = {}
    check = per_call_check(op)

    nargs = len(specs)
    defaults = tuple(s.default for s in specs)
    counters = metrics._counters

    def kernel(*args: Any, **kwargs: Any) -> Any:
        t0 = _now()
        counters[counter] = counters.get(counter, 0) + 1
        if check is not None:  # (var/std: they bind twice)
            check(op, bind(specs, args, kwargs))
        key = None
        vals: Any = None
        if planned and not FLAGS.ir_debug:
            items: list[Any] = []
            states: list[Any] = []
            # See Note [Recording plans]; a call without keyword arguments needs no bind: the
            # dispatcher leaves out only trailing arguments at their defaults
            full = not kwargs
            vals = (
                (args if len(args) == nargs else args + defaults[len(args) :])
                if full
                else bind(specs, args, kwargs)
            )
            key = _plan_key(kinds, vals, items, states)
            if key is not None:
                for i in device_args:
                    check_device(vals[i])
                plan = plans.get(key)
                if plan is not None:
                    out = plan.run(vals, items, states)
                    _tracing[0] += _now() - t0  # `_trace`, inlined
                    _tracing[1] += 1
                    return out
            if full:
                vals = None
        if vals is None:
            vals = bind(specs, args, kwargs)
        for i in device_args:
            check_device(vals[i])
        try:
            out_struct, strides = infer_layout(op, specs, vals, lw)
        except EagerRefused:
            raise
        except NotImplementedError:
            # A data-dependent output shape (x[bool_mask]): nothing static to record; CPU fallback.
            from .fallback import cpu_fallback

            return cpu_fallback(op, *args, **kwargs)
        node, out = record(name, lw, specs, vals, out_struct, strides, dtype_arg, aten)
        if key is not None and key not in plans:
            try:
                plans[key] = _Plan(node, kinds, vals, out_struct, strides, stores)
            except _NoPlan:
                plans[key] = None
        _trace(t0)
        return out

    kernel.__name__ = f"lazyxla_{op._schema.name.split('::')[1]}"
    return kernel


# Note [In-place recording plans]
# An in-place op (`x.add_(y)`, `p.mul_(0.9)`, `g.zero_()`) records its functional twin's node and
# writes it into its target. Its slow path also infers the in-place op's meta, checks the result
# fits the target and that no input overlaps it, and casts the result to the target's dtype. For a
# call whose lazy tensors are all bases (views can overlap; writing through one scatters into its
# base), all of that depends only on the call's signature, so a plan made from the first call's
# node replays it: the node is rebuilt from the call's values and becomes the target's value. Plans
# are only made where the slow path wrote the functional node itself into the target (no cast).
# A foreach op (`_foreach_mul_(exp_avgs, beta)`, `_foreach_addcdiv_(params, m, v, step_sizes)`:
# an optimizer's whole step) writes output i of its node into the i-th tensor of its first list;
# its signature holds each list's length and tensors, and which of a scalar list's values are
# lifted. One that reads a tensor it writes at another index takes the slow path (Note [Foreach
# ops that alias] in writes.py).


def inplace_kernel(op: OpOverload, functional: OpOverload, lw: Lowering) -> Callable[..., Any]:
    """`writes.inplace_kernel`, with a recording plan per call signature in front of it for
    single-target in-place ops (Note [In-place recording plans])."""
    slow = _dispatch_inplace_kernel(op, functional, lw)
    specs = [ArgSpec(a, lw) for a in op._schema.arguments]
    fspecs = [ArgSpec(a, lw) for a in functional._schema.arguments]
    writes = [i for i, s in enumerate(specs) if s.is_write]
    fkinds = tuple(s.kind for s in fspecs)
    name, counter = _op_name(functional), _counter_name(op)
    if (
        lw.random
        or op is functional
        or len(specs) != len(fspecs)
        or len(writes) != 1
        or op._schema.name.split("::", 1)[1] in _METADATA_INPLACE
        or not _FAST_KINDS.issuperset(fkinds)
    ):
        return slow
    w = writes[0]
    many = specs[w].is_list_write  # a foreach op: one output per tensor of its first list
    nargs = len(specs)
    defaults = tuple(s.default for s in specs)
    stores = name in STORES_SCALAR
    returns_self = len(op._schema.returns) > 0
    plans: dict[tuple, _Plan | None] = {}
    counters = metrics._counters

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if FLAGS.ir_debug:
            return slow(*args, **kwargs)
        t0 = _now()
        if kwargs:
            vals = bind(specs, args, kwargs)
        else:  # (the dispatcher leaves out only trailing arguments at their defaults)
            vals = args if len(args) == nargs else args + defaults[len(args) :]
        items: list[Any] = []
        states: list[Any] = []
        key = _plan_key(fkinds, vals, items, states)
        if key is None:
            return slow(*args, **kwargs)
        target = vals[w]
        if many:
            targets = [getattr(t.untyped_storage(), "_lx", None) for t in target]
        else:
            ts = (
                getattr(target.untyped_storage(), "_lx", None)
                if type(target) is torch.Tensor
                else None
            )
            targets = [ts]
        if (
            None in targets
            or any(s.base is not None for s in states)
            or many
            and foreach_aliases(vals, specs, w)
        ):
            return slow(*args, **kwargs)
        plan = plans.get(key, _NO_PLAN_YET)
        if plan is _NO_PLAN_YET:
            out = slow(*args, **kwargs)
            plans[key] = None
            node = targets[0].value[0] if targets else None
            if (
                node is not None
                and node.op == name
                and all(
                    ts.value[0] is node and ts.value[1] == i and node.specs[i] == ts.spec
                    for i, ts in enumerate(targets)
                )
            ):
                with contextlib.suppress(_NoPlan):
                    struct = [ts.spec for ts in targets] if many else targets[0].spec
                    plans[key] = _Plan(node, fkinds, list(vals), struct, None, stores)
            return out
        if plan is None:
            return slow(*args, **kwargs)
        counters[counter] = counters.get(counter, 0) + 1
        node = plan.node(vals, items, states)
        for i, ts in enumerate(targets):  # `write` to a base
            if ts.value[0].op in STATE_FILL_OPS:  # Note [A state's first value is data]
                ts.fill = ts.value[0]
            ts.value = (node, i)
            ts.version += 1
        _tracing[0] += _now() - t0  # `_trace`, inlined
        _tracing[1] += 1
        return target if returns_self else None

    kernel.__name__ = f"lazyxla_{op._schema.name.split('::')[1]}"
    return kernel


_NO_PLAN_YET = object()
