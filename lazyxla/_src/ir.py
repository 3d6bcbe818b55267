"""The lazy IR: immutable nodes that record an op, its static arguments and its output specs.

A value is `(node, output_index)`. A node never holds array data except the leaves:
`xla::device_data`
(a `jax.Array` already on the device) and lifted Python scalars, whose values are graph *inputs* and
never
part of the cache key. See Note [Graph hashing] in graph.py.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .config import FLAGS


class TensorSpec(NamedTuple):
    shape: tuple[int, ...]
    dtype: torch.dtype


class Ref(int):
    """Placeholder in a node's argument template: the `k`-th entry of `node.inputs`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Ref({int(self)})"

    def __eq__(self, other: object) -> bool:
        return type(other) is Ref and int.__eq__(self, other)

    def __hash__(self) -> int:
        return int.__hash__(self) ^ 0x5EF


# Leaf kinds.
DEVICE_DATA = "xla::device_data"
SCALAR = "xla::device_data(scalar)"
CONSTANT = "prim::Constant"

# Note [Exact descriptors]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# A node's statics are Python values, and Python's == is not "the same program": -0.0 == 0.0,
# True == 1 == 1.0, and nan != nan (a NaN static would intern a new descriptor, and compile a new
# graph, on every call, never hitting the cache). Equal descriptors share an interned id, hence a
# graph key and an executable, so descriptors are interned under an exact key: a float by its bit
# pattern (sign of zero, NaN payload), a complex by both parts' bits, a bool apart from the ints.
# The raw descriptor is what `_desc_list` keeps.
# Recording must stay cheap, so only the nodes of ops whose schema has a float, Scalar or complex
# argument (`_screened`, decided once per op name; an op that is not an aten op counts as one)
# are screened, at C speed, and only a descriptor holding a float, bool, complex or tuple is
# rebuilt. The statics of the other ops are ints, bools typed by the schema, dtypes and shapes,
# exact already; the only other Python number they can hold is a wrapped-number unit baked into
# a Tensor slot (0, 1, 0.0, 1.0, True, False: the same program in any of its types, since -0.0,
# NaN and every other value are lifted, see `_is_unit` in dispatch.py).
_desc_ids: dict[tuple, int] = {}
_desc_list: list[tuple] = []

# Exact forms are bytes, which no static is: a float's 8 bytes, a complex's 16, a bool's 1.
_F64 = struct.Struct("<d").pack
_C128 = struct.Struct("<dd").pack
_INEXACT = frozenset((float, bool, complex, tuple, list))
_SCREENED: dict[str, bool] = {}


def _exact(v: Any) -> Any:
    """`v` as a key in which equal means identical (Note [Exact descriptors])."""
    t = type(v)
    if t is float:
        return _F64(v)
    if t is tuple or t is list:
        if _INEXACT.isdisjoint(map(type, v)):
            return v
        return tuple([_exact(x) for x in v])
    if t is bool:
        return b"\x01" if v else b"\x00"
    if t is complex:
        return _C128(v.real, v.imag)
    return v


def _exact_items(t: tuple) -> tuple:
    """`_exact` of each item of `t` (no call for the ones that are their own key)."""
    return tuple(
        [_F64(v) if type(v) is float else _exact(v) if type(v) in _INEXACT else v for v in t]
    )


def _screened(op: str) -> bool:
    """Whether the statics of `op` may be floats, bools or complexes (Note [Exact descriptors])."""
    schemas = torch._C._jit_get_schemas_for_operator(op) if op.startswith("aten::") else ()
    # TorchScript's scalar builtins (aten::add.int, aten::sum.float) take no tensor: not ours.
    schemas = [s for s in schemas if any("Tensor" in str(a.type) for a in s.arguments)]
    _SCREENED[op] = screened = not schemas or any(
        k in str(a.type)
        for s in schemas
        for a in s.arguments
        for k in ("float", "number", "complex")
    )
    return screened


def _exact_kwargs(kwargs: tuple) -> bool:
    for _, v in kwargs:
        if type(v) in _INEXACT:
            return False
    return True


def _intern(key: tuple, desc: tuple) -> int:
    i = _desc_ids.get(key)
    if i is None:
        i = _desc_ids[key] = len(_desc_list)
        _desc_list.append(desc)
    return i


def intern_desc(desc: tuple) -> int:
    """A small int per distinct node descriptor: the op, its statics and output specs."""
    return _intern(_exact(desc), desc)


class Node:
    """One recorded op. Immutable after construction; `desc` is its data-free identity."""

    __slots__ = (
        "op",
        "rule",
        "inputs",
        "args",
        "kwargs",
        "specs",
        "desc",
        "data",
        "src",
        "meta",
        "aten",
    )

    def __init__(
        self,
        op: str,
        rule: Any,
        inputs: tuple[tuple[Node, int], ...],
        args: tuple,
        kwargs: tuple,
        specs: tuple[TensorSpec, ...],
        desc_extra: Any = None,
        data: Any = None,
        aten: Any = None,
    ) -> None:
        self.op = op
        self.rule = rule
        self.inputs = inputs
        self.args = args
        self.kwargs = kwargs
        self.specs = specs
        self.data = data
        desc = (op, args, kwargs, specs, desc_extra)
        # Keyed by the rule's code too: two overloads of one op (`pow.Tensor_Scalar` by a Python
        # 0, `pow.Tensor_Tensor` by a baked 0-d tensor 0) can share a name, arguments and specs
        # and still compute different things; they shared an executable. (The code, not the
        # function: a scan's or a manual region's rule is a closure made per call, and what it
        # closes over is in its arguments; a wrapper's, such as Note [Opmath]'s, is the same
        # for every op, so the wrapped function's.)
        r = rule
        while hasattr(r, "__wrapped__"):
            r = r.__wrapped__
        code = getattr(r, "__code__", r)
        key = (op, code, args, kwargs, specs, desc_extra)
        screened = _SCREENED.get(op)
        if screened is None:
            screened = _screened(op)
        if screened:  # Note [Exact descriptors]
            exact_args = _INEXACT.isdisjoint(map(type, args))
            exact_kwargs = not kwargs or _exact_kwargs(kwargs)
            if not (exact_args and exact_kwargs):
                a = args if exact_args else _exact_items(args)
                k = kwargs if exact_kwargs else tuple([(n, _exact(v)) for n, v in kwargs])
                key = (op, code, a, k, specs, desc_extra)
        self.desc = _intern(key, desc)
        self.src = _user_frame() if FLAGS.ir_debug else None
        self.meta: Any = None
        # The aten overload that `args`/`kwargs` call in schema order, when they do (a kernel's
        # own node, not a cast or scatter it emits): Note [Small integer reads on the host].
        self.aten = aten

    def with_inputs(self, inputs: tuple[tuple[Node, int], ...]) -> Node:
        """The same op on other inputs of the same specs (its descriptor does not change)."""
        n = Node.__new__(Node)
        for slot in Node.__slots__:
            setattr(n, slot, getattr(self, slot))
        n.inputs = inputs
        return n

    @property
    def is_leaf(self) -> bool:
        return not self.inputs and self.op in (DEVICE_DATA, SCALAR, CONSTANT)

    def __repr__(self) -> str:
        return f"Node({self.op}, {len(self.inputs)} inputs, {self.specs})"


_new_node = object.__new__


def node_with_desc(
    op: str,
    rule: Any,
    inputs: tuple[tuple[Node, int], ...],
    args: tuple,
    kwargs: tuple,
    specs: tuple[TensorSpec, ...],
    desc: int,
    aten: Any = None,
) -> Node:
    """A node whose descriptor id is already known (a recording plan's, see recording.py): the
    same node `Node(...)` builds, without interning its descriptor again."""
    n = _new_node(Node)
    n.op = op
    n.rule = rule
    n.inputs = inputs
    n.args = args
    n.kwargs = kwargs
    n.specs = specs
    n.desc = desc
    n.data = None
    n.src = None
    n.meta = None
    n.aten = aten
    return n


def _leaf_with_desc(op: str, hit: tuple[int, tuple[TensorSpec, ...]], data: Any) -> Node:
    """A data leaf (`op` DEVICE_DATA or SCALAR) whose descriptor id and specs are known: the node
    `Node(...)` builds, without interning its descriptor again."""
    n = _new_node(Node)
    n.op = op
    n.rule = None
    n.inputs = ()
    n.args = ()
    n.kwargs = ()
    n.specs = hit[1]
    n.desc = hit[0]
    n.data = data
    n.src = None
    n.meta = None
    n.aten = None
    return n


def node_code(target: str, fields: dict[str, str]) -> list[str]:
    """Statements building a node into `target` as `node_with_desc` does, for generated code
    (Note [Generated recording code] in recording.py): each of `Node`'s slots gets its
    expression in `fields`, None if absent. They use the globals in `NODE_CODE_GLOBALS`."""
    return [f"{target} = _new_node(_Node)"] + [
        f"{target}.{slot} = {fields.get(slot, 'None')}" for slot in Node.__slots__
    ]


NODE_CODE_GLOBALS = {"_new_node": _new_node, "_Node": Node}


_DATA_DESCS: dict[TensorSpec, tuple[int, tuple[TensorSpec, ...]]] = {}


def device_data(array: Any, spec: TensorSpec, sharding: Any = None) -> Node:
    """A graph input holding `array`; its descriptor looked up per spec when it has no sharding
    (an executable's outputs and uploads: every sync makes one per output)."""
    hit = _DATA_DESCS.get(spec) if sharding is None and not FLAGS.ir_debug else None
    if hit is None:
        n = Node(DEVICE_DATA, None, (), (), (), (spec,), desc_extra=sharding, data=array)
        if sharding is None:
            _DATA_DESCS[spec] = (n.desc, n.specs)
        return n
    return _leaf_with_desc(DEVICE_DATA, hit, array)


_SCALAR_DESCS: dict[torch.dtype, tuple[int, tuple[TensorSpec, ...]]] = {}


def scalar(value: Any, dtype: torch.dtype) -> Node:
    """A Python scalar lifted to a graph input (its value is not in the key); its descriptor
    looked up per dtype, as `device_data`'s per spec."""
    hit = _SCALAR_DESCS.get(dtype) if not FLAGS.ir_debug else None
    if hit is None:
        n = Node(SCALAR, None, (), (), (), (TensorSpec((), dtype),), data=value)
        _SCALAR_DESCS[dtype] = (n.desc, n.specs)
        return n
    return _leaf_with_desc(SCALAR, hit, value)


def rng_scalar(value: int, role: str, pair: int) -> Node:
    """A random op's seed or offset: a lifted int64 scalar that trace-once replays renew."""
    n = scalar(value, torch.int64)
    n.meta = (role, pair)
    return n


def constant(value: Any, dtype: torch.dtype) -> Node:
    """A Python scalar baked into the graph (0 and 1, and statics that shape the program)."""
    return Node(CONSTANT, None, (), (value,), (), (TensorSpec((), dtype),))


_SKIP_PREFIXES = (
    __file__.rsplit("/", 2)[0],  # lazyxla itself
    torch.__file__.rsplit("/", 1)[0],
)


def user_frame(f: Any) -> Any:
    """The innermost frame from `f` outwards outside lazyxla and torch, or None."""
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_SKIP_PREFIXES) and not fn.startswith("<frozen"):
            return f
        f = f.f_back
    return None


def _user_frame() -> str | None:
    """`file:line (function)` of the innermost frame outside lazyxla and torch."""
    f = user_frame(sys._getframe(2))
    return None if f is None else f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})"


# --- text form, in the layout of torch_xla's _get_xla_tensors_text -------------------------------

_SHORT_DTYPE = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "s64",
    torch.int32: "s32",
    torch.int16: "s16",
    torch.int8: "s8",
    torch.uint8: "u8",
    torch.bool: "pred",
    torch.complex64: "c64",
    torch.complex128: "c128",
}


def shape_str(spec: TensorSpec) -> str:
    dt = _SHORT_DTYPE.get(spec.dtype, str(spec.dtype).replace("torch.", ""))
    dims = ",".join(str(d) for d in spec.shape)
    if not spec.shape:
        return f"{dt}[]"
    layout = ",".join(str(i) for i in reversed(range(len(spec.shape))))
    return f"{dt}[{dims}]{{{layout}}}"


def node_shape_str(node: Node) -> str:
    if len(node.specs) == 1:
        return shape_str(node.specs[0])
    return "(" + ", ".join(shape_str(s) for s in node.specs) + ")"


def _static_str(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_static_str(x) for x in v) + ")"
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    return str(v)


def post_order(
    roots: list[Node], stop: Callable[[Node], bool] | None = None, limit: int | None = None
) -> list[Node] | None:
    """Nodes reachable from `roots`, inputs before users, in torch_xla's visiting order.

    Nodes for which `stop` is true are kept as leaves: their inputs are not visited. With a
    `limit`: None as soon as more than `limit` nodes are reached (a larger graph is not walked).
    """
    # (Nodes hash by identity: a set of nodes, not of their ids, saves an id() call per visit.)
    order: list[Node] = []
    seen: set[Node] = set()
    see = seen.add
    for root in roots:
        if root in seen:
            continue
        stack: list[tuple[Node, bool]] = [(root, False)]
        pop, push = stack.pop, stack.append
        while stack:
            node, expanded = pop()
            if expanded:
                order.append(node)
                continue
            if node in seen:
                continue
            see(node)
            if limit is not None and len(seen) > limit:
                return None
            if stop is not None and stop(node):
                order.append(node)
                continue
            push((node, True))
            for inp, _ in node.inputs:
                if inp not in seen:
                    push((inp, False))
    return order


def structure_key(order: list[Node], leaf_ops: tuple[str, ...]) -> tuple:
    """The data-free structure of a sub-graph in post-order: each node's descriptor and the
    positions of its inputs; leaves of `leaf_ops` count by op and spec only (they are inputs),
    and a node whose inputs lie outside the sub-graph (a `post_order` stop) by its descriptor."""
    pos = {id(n): i for i, n in enumerate(order)}
    parts: list[Any] = []
    for n in order:
        if n.op in leaf_ops:
            parts.append((n.op, n.specs))
        elif n.inputs and all(id(x) in pos for x, _ in n.inputs):
            parts.append((n.desc, tuple((pos[id(x)], k) for x, k in n.inputs)))
        else:
            parts.append(n.desc)
    return tuple(parts)


def _numbered(roots: list[tuple[Node, int]]) -> tuple[list[Node], dict[int, int], dict]:
    """The post-order of `roots`, each node's position, and the root indices of each node."""
    order = post_order([n for n, _ in roots])
    pos = {id(n): i for i, n in enumerate(order)}
    root_of: dict[int, list[int]] = {}
    for r, (n, _) in enumerate(roots):
        root_of.setdefault(id(n), []).append(r)
    return order, pos, root_of


def _statics(n: Node) -> list[str]:
    statics = [_static_str(a) for a in n.args if _shown(a)] if n.op != CONSTANT else []
    statics += [f"{k}={_static_str(v)}" for k, v in n.kwargs if k not in _HIDDEN and _shown(v)]
    return statics


def to_dot(roots: list[tuple[Node, int]]) -> str:
    """The IR of `roots` as a Graphviz digraph, in torch_xla's XLA_SAVE_TENSORS_FMT=dot layout."""
    order, pos, root_of = _numbered(roots)
    lines = ["digraph G {"]
    for i, n in enumerate(order):
        shape = node_shape_str(n)
        label = [DEVICE_DATA if n.op == SCALAR else n.op, shape, *_statics(n)]
        label.append(f"xla_shape={shape}")
        label += [f"ROOT={r}" for r in root_of.get(id(n), ())]
        text = "\\n".join(label).replace('"', '\\"')
        lines.append(f'  node{i} [label="{text}"]')
    for i in range(len(order) - 1, -1, -1):
        ins = order[i].inputs
        for j, (inp, _) in enumerate(ins):
            edge = f"  node{pos[id(inp)]} -> node{i}"
            lines.append(edge + (f' [label="i={j}"]' if len(ins) > 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_text(roots: list[tuple[Node, int]]) -> str:
    """The IR of `roots` as text: `%3 = f32[2,4]{1,0} aten::mm(%1, %2), xla_shape=..., ROOT=0`."""
    order, pos, root_of = _numbered(roots)
    lines = ["IR {"]
    for i, n in enumerate(order):
        shape = node_shape_str(n)
        operands = ", ".join(
            f"%{pos[id(inp)]}" + (f".{k}" if len(inp.specs) > 1 else "") for inp, k in n.inputs
        )
        name = DEVICE_DATA if n.op == SCALAR else n.op
        line = f"  %{i} = {shape} {name}({operands})"
        statics = _statics(n)
        if statics:
            line += ", " + ", ".join(statics)
        line += f", xla_shape={shape}"
        if n.src:
            line += f", location={n.src}"
        for r in root_of.get(id(n), ()):
            line += f", ROOT={r}"
        lines.append(line)
    lines.append("}")
    return "\n".join(lines) + "\n"


_HIDDEN = frozenset({"pin_memory", "layout", "device", "memory_format", "non_blocking", "key"})


def _shown(v: Any) -> bool:
    """Statics worth printing: not inputs, not placement noise."""
    if v is None or isinstance(v, (torch.device, torch.layout, torch.memory_format)):
        return False
    return not _has_ref(v)


def _has_ref(v: Any) -> bool:
    if type(v) is Ref:
        return True
    if isinstance(v, (list, tuple)):
        return any(_has_ref(x) for x in v)
    return False
