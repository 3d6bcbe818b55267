"""Functional kernels and their recording plans: the hot path of recording an op.

`functional_kernel` builds the PrivateUse1 kernel of an op with a lowering and no mutated
argument. Its first call of each argument signature takes dispatch.py's slow path (meta
inference, `record`) and keeps a plan; later calls of that signature replay the plan (Note
[Recording plans]).
"""

from __future__ import annotations

import builtins
import contextlib
import linecache
import os
import time
from collections.abc import Callable
from types import CodeType, FunctionType
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
    node_aten,
    record,
)
from .ir import NODE_CODE_GLOBALS, Node, TensorSpec, node_code
from .ir import SCALAR as _SCALAR_OP
from .meta import (
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
from .tensor import (
    NEW_TENSOR_CODE_GLOBALS,
    STATE_FILL_OPS,
    check_device,
    new_tensor_code,
    new_tensor_globals,
    read,
    state,
    storage_nbytes,
)
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
# no dtype), and ops with lists of optional tensors or generator arguments, random ops, and
# XLA_IR_DEBUG (source lines) always take the slow path, as does a call with a float static of
# 0 or NaN (statics are keyed by ==, exact for other floats). Only lifted values are
# read from a later call: a unit (a baked 0 or 1) is in the signature itself.
_FAST_KINDS = frozenset((TENSOR, OPT_TENSOR, SCALAR, STATIC, TENSOR_LIST, SCALAR_LIST))
_LIFTED = object()
_MISS = object()  # a guarded plan's answer to a call of another signature (Note [Guarded plans])
_EXACT_STATICS = (torch.dtype, str, torch.memory_format, torch.layout, torch.device)
_default_dtype = torch.get_default_dtype
_now = time.perf_counter_ns
_tracing = dispatch._tracing  # (the timing `_trace` sums, inlined on the replay paths)


# Note [Generated recording code]
# A plan hit is the hot path of lazy recording: every op of a model's step takes it. Written as
# loops over the op's argument kinds and over the plan's node inputs, a third of its cost was
# interpretation: type tests whose outcome the position's kind decides, a key list grown one
# element at a time, a loop over inputs that is the same on every call. So both per-call halves
# are generated once as straight-line Python, the generic logic partially evaluated:
# - `_key_function(kinds)` computes a call's signature (Note [Recording plans]); there is one
#   function per distinct tuple of argument kinds, made of one block per position, its kind's
#   template in `_KEY_BLOCKS`. A block sets its position's key component `c<i>` or returns None:
#   no plan, the slow path, which is always correct, so a block refuses anything unusual for its
#   kind. Components of one position are equal only when the slow path records the same thing:
#   a lazy tensor's spec (with its layout when it is a view or not contiguous), a number's class
#   and value when baked (0 and 1) or its class alone when lifted.
# - `_Plan.run` and `_Plan.node` build a plan's node (one line per node input: a lazy tensor's
#   current value, or a lifted scalar's leaf) and its output tensors. The plan's constants are
#   the function's globals, so the code depends only on the plan's input structure: it is
#   compiled once per structure and bound once per plan. The nodes and a single output tensor
#   are built inline: the statements come from `ir.node_code` and `tensor.new_tensor_code`,
#   beside the functions whose work they repeat (`node_with_desc`, `new_tensor`); a test checks
#   a planned output against `new_tensor`'s, field by field.
# Each generated function's source is in linecache under its `<lazyxla ...>` file name, so
# tracebacks, pdb and profilers show it.

_KEY_BLOCKS = {
    TENSOR: """\
    v = vals[{i}]
    if isinstance(v, _Tensor):
        s = getattr(v.untyped_storage(), "_lx", None)
        if s is not None:{ref}
            states.append(s)
            c{i} = s.spec if s.base is None and s.stride is None else _layout_key(s, v)
        elif v.is_cpu and not v.dim():  # a wrapped number or 0-d CPU tensor: its value is read
            c{i} = _wrapped_key(v, items)
            wrapped = [v] if wrapped is None else [*wrapped, v]
        else:
            return None
    else:
        t = type(v)
        if t is float or t is int:  # baked when a unit, else lifted (NaN too)
            if v != 0 and v != 1 or not _is_unit(v):
                c{i} = (t, _LIFTED)
            else:
                c{i} = (t, v)
        elif v is None:
            c{i} = None
        elif t is bool:
            c{i} = (bool, v)
        else:
            return None
""",
    # (a `Scalar` slot converts the checked way, Note [Checked scalar conversions]: its class)
    SCALAR: """\
    v = vals[{i}]
    t = type(v)
    if t is float or t is int:
        if v != 0 and v != 1 or not _is_unit(v):
            c{i} = (t, _LIFTED, scalar_class(v))
        else:
            c{i} = (t, v)
    elif t is bool:
        c{i} = (bool, v)
    elif v is None:
        c{i} = None
    else:
        return None
""",
    STATIC: """\
    v = vals[{i}]
    t = type(v)
    if t is int or t in _EXACT_STATICS:  # (values equal only when the same program)
        c{i} = v
    elif v is None:
        c{i} = None
    elif t is bool:
        c{i} = (bool, v)
    elif t is float:  # baked: keyed exactly (0.0 == -0.0, and NaN is unequal to itself)
        if v != 0 and v == v:
            c{i} = (float, v)
        else:
            return None
    elif t is list or t is tuple:  # (`int[]` sizes and dims, a `bool[]` output mask)
        if all([type(e) is int for e in v]):
            c{i} = (t, *v)
        elif all([type(e) is bool for e in v]):
            c{i} = (t, bool, *v)
        else:
            return None
    else:
        return None
""",
    TENSOR_LIST: """\
    v = vals[{i}]
    t = type(v)
    if t is list or t is tuple:  # (`cat`'s tensors, a foreach op's lists)
        c{i} = _tensor_list_key(v, states)
        if c{i} is None:
            return None
        if ref is None and v:
            ref = v[0]
    elif v is None:
        c{i} = None
    else:
        return None
""",
    SCALAR_LIST: """\
    v = vals[{i}]
    t = type(v)
    if t is list or t is tuple:  # (a foreach op's per-tensor scalars: Adam's step sizes)
        c{i} = _scalar_list_key(v, items)
        if c{i} is None:
            return None
    elif v is None:
        c{i} = None
    else:
        return None
""",
}
_KEY_BLOCKS[OPT_TENSOR] = _KEY_BLOCKS[TENSOR]


def _key_function(kinds: tuple[int, ...]) -> Callable[[Any, list, list], tuple | None]:
    """The recording signature of a call with these argument kinds, or None: no plan for it
    (Note [Generated recording code]). `key(vals, items, states)`: `items` receives the values
    the call lifts from its 0-d CPU tensors and scalar lists, `states` its lazy tensors' states,
    in order."""
    fn = _KEY_FUNCTIONS.get(kinds)
    if fn is not None:
        return fn
    lines = ["def key(vals, items, states):"]
    if {TENSOR, OPT_TENSOR, TENSOR_LIST}.intersection(kinds):
        lines.append("    ref = wrapped = None")
    for i, k in enumerate(kinds):
        ref = "\n            if ref is None:\n                ref = v" if k == TENSOR else ""
        lines.append(_KEY_BLOCKS[k].format(i=i, ref=ref).rstrip())
    comps = "".join(f"c{i}, " for i in range(len(kinds)))
    # A 0-d CPU tensor promotes with the first lazy tensor unlike a Python number: the result
    # dtypes are in the key. The default dtype types a floating result of integer inputs
    # (`sin(int_tensor)`, `int_tensor * 2.5`) and a factory's given no dtype.
    if TENSOR in kinds or OPT_TENSOR in kinds:
        lines += [
            "    if wrapped is not None:",
            "        if ref is None:",
            "            return None",
            f"        return ({comps}_promoted(ref, wrapped), _default_dtype())",
        ]
    lines.append(f"    return ({comps}_default_dtype())")
    fn = _KEY_FUNCTIONS[kinds] = _generate(
        "\n".join(lines), "key", f"plan key {len(_KEY_FUNCTIONS)}", _KEY_GLOBALS
    )
    return fn


_KEY_FUNCTIONS: dict[tuple[int, ...], Callable[[Any, list, list], tuple | None]] = {}


def _generate(source: str, name: str, title: str, namespace: dict[str, Any]) -> Any:
    """The function `name` that `source` defines, with `namespace` as its globals and its
    source in linecache under a file name made from `title`. (The name is in this package's
    directory: torch.compile's dynamo runs, never traces, lazyxla's kernels, `dynamo.py`.)"""
    filename = os.path.join(os.path.dirname(__file__), f"<lazyxla {title}>")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return namespace.pop(name)


def _wrapped_key(v: torch.Tensor, items: list[Any]) -> tuple:
    """A 0-d CPU tensor's key component: its dtype, and its value when a unit (baked)."""
    x = v.item()
    if _is_unit(x):
        return (v.dtype, x)
    items.append(x)
    # (its class: some ops convert it the checked way, Note [Checked scalar conversions])
    return (v.dtype, _LIFTED, scalar_class(x) if type(x) is int or type(x) is float else None)


def _promoted(ref: torch.Tensor, wrapped: list[torch.Tensor]) -> tuple:
    return tuple([torch.result_type(ref, w) for w in wrapped])


def _tensor_list_key(v: list | tuple, states: list[Any]) -> tuple | None:
    """A tensor list's key component, None unless each entry is a lazy tensor; its length is
    the tuple's: ([a, b], [c]) and ([a], [b, c]) are two signatures."""
    comps = []
    for e in v:
        s = getattr(e.untyped_storage(), "_lx", None) if isinstance(e, torch.Tensor) else None
        if s is None:
            return None  # a CPU tensor or None in the list: slow path
        states.append(s)
        comps.append(s.spec if s.base is None and s.stride is None else _layout_key(s, e))
    return tuple(comps)


def _layout_key(s: Any, t: torch.Tensor) -> tuple:
    """The key component of a lazy tensor that is a view or not contiguous: its spec and layout
    (a view's is on the tensor, a base's on its state: `new_tensor`). A contiguous base's is its
    spec alone, tested inline by the callers (the common case)."""
    return (s.spec, None if s.base is None else t.stride(), s.stride)


def _scalar_list_key(v: list | tuple, items: list[Any]) -> tuple | None:
    """A scalar list's key component; its lifted entries go to `items`."""
    comps = []
    for e in v:
        t = type(e)
        if t is float or t is int:
            if e != 0 and e != 1 or not _is_unit(e):
                items.append(e)
                comps.append((t, _LIFTED))
            else:
                comps.append((t, e))
        elif t is bool:
            comps.append((bool, e))
        else:
            return None
    return tuple(comps)


_KEY_GLOBALS = {
    "__builtins__": builtins,
    "_Tensor": torch.Tensor,
    "_LIFTED": _LIFTED,
    "_EXACT_STATICS": _EXACT_STATICS,
    "_is_unit": _is_unit,
    "scalar_class": scalar_class,
    "_wrapped_key": _wrapped_key,
    "_promoted": _promoted,
    "_tensor_list_key": _tensor_list_key,
    "_layout_key": _layout_key,
    "_scalar_list_key": _scalar_list_key,
    "_default_dtype": _default_dtype,
}


class _Plan:
    """What a call of one signature records (Note [Recording plans]): `run(vals, items,
    states)` records it and returns its outputs, `node(...)` only builds its node (Note
    [Generated recording code])."""

    __slots__ = ("run", "node", "fast")

    def __init__(
        self,
        node: Node,
        kinds: tuple[int, ...],
        vals: list[Any],
        out_struct: Any,
        strides: Any,
        stores: bool = False,
        given: int | None = None,
    ) -> None:
        # Where each input of `node` comes from, in order: an expression of the generated code
        # (with statements before it), and the lifted scalars' leaf specs and descriptors
        # (`SCALAR<j>_SPECS`, `SCALAR<j>_DESC`, bound as globals).
        inputs = node.inputs
        lines: list[str] = []
        loads: list[str] = []  # each lazy tensor's state, from the key's `states`
        prelude: list[str] = []
        namespace: dict[str, Any] = {}
        n_states = n_items = 0

        def lifted(source: str) -> None:
            j = len(lines)
            if j >= len(inputs) or inputs[j][0].op != _SCALAR_OP:
                raise _NoPlan
            leaf = inputs[j][0]
            namespace[f"SCALAR{j}_SPECS"] = leaf.specs
            namespace[f"SCALAR{j}_DESC"] = leaf.desc
            prelude.extend(
                node_code(
                    f"n{j}",
                    {
                        "op": "_SCALAR",
                        "inputs": "()",
                        "args": "()",
                        "kwargs": "()",
                        "specs": f"SCALAR{j}_SPECS",
                        "desc": f"SCALAR{j}_DESC",
                        "data": source,
                    },
                )
            )
            lines.append(f"(n{j}, 0)")

        def tensor() -> None:  # a lazy tensor's current value (`read`, its common case inline)
            nonlocal n_states
            n = n_states
            n_states += 1
            loads.append(f"s{n} = states[{n}]")
            prelude.append(f"b{n} = s{n}.base")
            lines.append(f"s{n}.value if b{n} is None or s{n}.seen == b{n}.version else read(s{n})")

        for i, v in enumerate(vals):
            k = kinds[i]
            if k == TENSOR_LIST:
                for _ in v:
                    tensor()
            elif k == SCALAR_LIST:
                for e in v:
                    if _is_lifted(e):
                        lifted(f"items[{n_items}]")
                        n_items += 1
            elif isinstance(v, torch.Tensor) and not v.is_cpu:
                tensor()
            elif k != STATIC and (
                _is_lifted(v) or stores and k == SCALAR and type(v) in (bool, int, float)
            ):  # (a fill's Scalar is lifted even when a unit: STORES_SCALAR)
                if isinstance(v, torch.Tensor):
                    lifted(f"items[{n_items}]")
                    n_items += 1
                else:
                    lifted(f"vals[{i}]")
        if len(lines) != len(inputs):
            raise _NoPlan
        namespace.update(
            _PLAN_GLOBALS,
            NAME=node.op,
            RULE=node.rule,
            ARGS=node.args,
            KWARGS=node.kwargs,
            SPECS=node.specs,
            DESC=node.desc,
            ATEN=node.aten,
        )
        if isinstance(out_struct, TensorSpec):  # one output: `new_tensor`, inline
            st = strides[0] if strides is not None else None
            nbytes = storage_nbytes(out_struct.shape, st, out_struct.dtype.itemsize)
            namespace.update(new_tensor_globals(out_struct, st, nbytes))
            wrap = (*new_tensor_code("(node, 0)", st, out_struct), "return t")
        else:
            namespace.update(STRUCT=out_struct, STRIDE=strides)
            wrap = ("return _wrap_outputs(node, STRUCT, [0], STRIDE)",)
        guard = _guard(kinds, vals, given, n_states) if given is not None else None
        if guard is not None:
            namespace.update(guard[1])
        code = _plan_code(tuple(loads), tuple(prelude), tuple(lines), wrap, guard and guard[0])
        self.run = FunctionType(code[0], namespace)
        self.node = FunctionType(code[1], namespace)
        self.fast = FunctionType(code[2], namespace) if code[2] is not None else None


def _plan_code(
    loads: tuple[str, ...],
    prelude: tuple[str, ...],
    inputs: tuple[str, ...],
    wrap: tuple[str, ...],
    guard: tuple[str, ...] | None,
) -> tuple[CodeType, CodeType, CodeType | None]:
    """The code of a plan's `run`, `node` and, given its checks, `fast`: the statements reading
    its lazy tensors' states, the statements before its node, its node inputs' expressions and
    the statements wrapping its outputs (Notes [Generated recording code], [Guarded plans])."""
    code = _PLAN_CODE.get((loads, prelude, inputs, wrap, guard))
    if code is None:
        build = node_code(
            "node",
            {
                "op": "NAME",
                "rule": "RULE",
                "inputs": "(" + "".join(f"{e}, " for e in inputs) + ")",
                "args": "ARGS",
                "kwargs": "KWARGS",
                "specs": "SPECS",
                "desc": "DESC",
                "aten": "ATEN",
            },
        )

        def block(lines: Any) -> str:
            return "".join(f"    {line}\n" for line in lines)

        body = block((*prelude, *build))
        source = (
            f"def run(vals, items, states):\n{block(loads)}{body}{block(wrap)}"
            f"\n\ndef node(vals, items, states):\n{block(loads)}{body}    return node\n"
        )
        if guard is not None:  # (the checks bind the states and `vals`)
            source += f"\n\ndef fast(args, s0):\n{block(guard)}{body}{block(wrap)}"
        namespace = dict(_PLAN_GLOBALS)
        run = _generate(source, "run", f"recording plan {len(_PLAN_CODE)}", namespace)
        fast = namespace.pop("fast", None)
        code = (run.__code__, namespace.pop("node").__code__, fast and fast.__code__)
        _PLAN_CODE[(loads, prelude, inputs, wrap, guard)] = code
    return code


_PLAN_CODE: dict[tuple, tuple[CodeType, CodeType, CodeType | None]] = {}


_PLAN_GLOBALS = {
    "__builtins__": builtins,
    "read": read,
    "_SCALAR": _SCALAR_OP,
    "_wrap_outputs": _wrap_outputs,
    "_MISS": _MISS,
    "_Tensor": torch.Tensor,
    "_is_unit": _is_unit,
    "scalar_class": scalar_class,
    "_default_dtype": _default_dtype,
    "_layout_key": _layout_key,
    **NODE_CODE_GLOBALS,
    **NEW_TENSOR_CODE_GLOBALS,
}


# Note [Guarded plans]
# A plan hit computes the call's whole signature (a tuple of one component per argument), hashes
# it and looks it up: about a third of a cheap op's recording. Most calls repeat a signature the
# op saw before, so a plan also gets a guarded function, `fast(args, s0)`: the checks that the
# call's signature equals the plan's, position by position, spelled out against the plan's
# values (a lazy tensor's spec, and its layout when it is a view or not contiguous; a number's
# class and whether it is lifted; a static's class and value; the default dtype), followed by
# the plan's recording; it returns `_MISS` when a check fails. A kernel keeps these functions by
# the spec of its first argument's state, tries those of the call's spec in order (at most
# `_GUARDED_PER_SPEC`), and takes the keyed path on a miss. Each check is the key block's test
# for that position (`_KEY_BLOCKS`) specialized to one outcome, so a call passes exactly when its
# key equals the plan's. Plans whose call held a 0-d CPU tensor or a list of tensors or scalars
# get no guarded function, nor do calls with keyword arguments or a number as first argument.
_GUARDED_PER_SPEC = 8  # guarded plans kept per first-argument spec (a cheap miss each)


def _guard(
    kinds: tuple[int, ...], vals: Any, given: int, n_states: int
) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """The checks of `fast` (Note [Guarded plans]) for calls like `vals`, whose first `given`
    arguments were passed, and the constants they read; None if some argument is not covered."""
    if not given or kinds[0] not in (TENSOR, OPT_TENSOR) or not isinstance(vals[0], torch.Tensor):
        return None  # (the kernel finds the guarded plans by the first argument's state's spec)
    lines = [f"if len(args) != {given}:", "    return _MISS"]
    consts: dict[str, Any] = {"G_DEFAULT": _default_dtype()}
    n_state = 0
    for i, (k, v) in enumerate(zip(kinds, vals)):
        t = type(v)
        if isinstance(v, torch.Tensor):
            s = getattr(v.untyped_storage(), "_lx", None)
            if k not in (TENSOR, OPT_TENSOR) or s is None:
                return None
            st = f"s{n_state}"
            if i:  # (the kernel found the first argument's state)
                lines += [
                    f"v = args[{i}]",
                    "if not isinstance(v, _Tensor):",
                    "    return _MISS",
                    f"{st} = getattr(v.untyped_storage(), '_lx', None)",
                    f"if {st} is None:",
                    "    return _MISS",
                ]
            consts[f"G{i}"] = s.spec
            if s.base is None and s.stride is None:  # a contiguous base: its spec (the common case)
                test = f"{st}.base is not None or {st}.stride is not None or {st}.spec != G{i}"
            else:  # `_layout_key`: a view's strides, a base's storage order
                consts[f"L{i}"] = _layout_key(s, v)
                test = f"_layout_key({st}, {'args[0]' if i == 0 else 'v'}) != L{i}"
            lines += [f"if {test}:", "    return _MISS"]
            n_state += 1
            continue
        if i >= given:  # a default: the signature's component is the plan's
            continue
        if k not in (TENSOR, OPT_TENSOR, SCALAR, STATIC):
            return None
        consts[f"G{i}"] = v
        consts[f"T{i}"] = t
        if v is None or t is bool:
            lines += [f"if args[{i}] is not G{i}:", "    return _MISS"]
        elif k != STATIC and (t is float or t is int):
            if v != 0 and v != 1 or not _is_unit(v):  # lifted: the class (and Scalar's kind)
                test = f"type(v) is not T{i} or not (v != 0 and v != 1 or not _is_unit(v))"
                if k == SCALAR:
                    consts[f"C{i}"] = scalar_class(v)
                    test += f" or scalar_class(v) != C{i}"
            else:  # baked
                test = f"type(v) is not T{i} or v != G{i} or not _is_unit(v)"
            lines += [f"v = args[{i}]", f"if {test}:", "    return _MISS"]
        elif k == STATIC and (t is int or t in _EXACT_STATICS or t is float and v != 0 and v == v):
            lines += [f"v = args[{i}]", f"if type(v) is not T{i} or v != G{i}:", "    return _MISS"]
        elif k == STATIC and (t is list or t is tuple) and v:
            e = type(v[0])
            if e not in (int, bool) or not all([type(x) is e for x in v]):
                return None
            consts[f"E{i}"] = e
            lines += [
                f"v = args[{i}]",
                f"if type(v) is not T{i} or v != G{i} or not all([type(x) is E{i} for x in v]):",
                "    return _MISS",
            ]
        else:
            return None
    if n_state != n_states:
        return None
    lines += ["if _default_dtype() is not G_DEFAULT:", "    return _MISS"]
    if given < len(kinds):  # the plan's code reads `vals`: the arguments with their defaults
        consts["G_TAIL"] = tuple(vals[given:])
        lines.append("vals = args + G_TAIL")
    else:
        lines.append("vals = args")
    return tuple(lines), consts


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
    aten = node_aten(op, lw, kinds)
    stores = name in STORES_SCALAR
    plans: dict[tuple, _Plan | None] = {}
    check = per_call_check(op)
    plan_key = None  # generated at the first call needing it (~100 kinds: 0.2 s of the import)

    nargs = len(specs)
    defaults = tuple(s.default for s in specs)
    counters = metrics._counters
    guarded: dict[TensorSpec, list[Callable[..., Any]]] = {}  # Note [Guarded plans]

    def guard(plan: _Plan, s0: Any) -> None:
        """Keep `plan`'s guarded function under its first argument's spec."""
        fns = guarded.setdefault(s0.spec, [])
        if plan.fast not in fns and len(fns) < _GUARDED_PER_SPEC:
            fns.append(plan.fast)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        nonlocal plan_key
        t0 = _now()
        counters[counter] = counters.get(counter, 0) + 1
        if check is not None:  # (var/std: they bind twice)
            check(op, bind(specs, args, kwargs))
        if guarded and not kwargs and not FLAGS.ir_debug:  # Note [Guarded plans]
            a = args[0]
            if isinstance(a, torch.Tensor):
                s0 = getattr(a.untyped_storage(), "_lx", None)
                if s0 is not None:
                    for fast in guarded.get(s0.spec, ()):
                        out = fast(args, s0)
                        if out is not _MISS:
                            _tracing[0] += _now() - t0  # `_trace`, inlined
                            _tracing[1] += 1
                            return out
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
            if plan_key is None:
                plan_key = _key_function(kinds)
            key = plan_key(vals, items, states)
            if key is not None:
                for i in device_args:
                    check_device(vals[i])
                plan = plans.get(key)
                if plan is not None:
                    if plan.fast is not None and full:
                        guard(plan, states[0])
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
                given = None if kwargs else len(args)
                plan = plans[key] = _Plan(node, kinds, vals, out_struct, strides, stores, given)
                if plan.fast is not None:
                    guard(plan, state(vals[0]))
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
    plan_key = None  # (generated at the first call, as a functional kernel's)
    counters = metrics._counters

    def kernel(*args: Any, **kwargs: Any) -> Any:
        nonlocal plan_key
        if FLAGS.ir_debug:
            return slow(*args, **kwargs)
        t0 = _now()
        if kwargs:
            vals = bind(specs, args, kwargs)
        else:  # (the dispatcher leaves out only trailing arguments at their defaults)
            vals = args if len(args) == nargs else args + defaults[len(args) :]
        items: list[Any] = []
        states: list[Any] = []
        if plan_key is None:
            plan_key = _key_function(fkinds)
        key = plan_key(vals, items, states)
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
