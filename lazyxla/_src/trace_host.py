"""The host part of a trace-once graph: which of an FX graph's values live on the CPU, which of
those change from call to call, and the Python a replay runs for them (dynamo.py's `Trace`).

# Note [Host values in a trace]
A graph may take CPU tensors: a 0-dim one meets device tensors as a number would, and optimizers
keep their step counts on the CPU (AdamW's bias corrections read them). Their values change from
call to call, so they cannot be constants of the trace. They were: every later AdamW step ran as
step 1, `f(x, torch.tensor(3.))` returned the result for the first call's value, and a Python float
argument (dynamo passes one as a 0-d CPU tensor once its value changes) kept its second value for
every later call. The tracer
runs each node whose inputs are all host values on the CPU, as eager does; its value is *dynamic*
when it derives from a CPU tensor argument (or is random). Where a device op reads a dynamic host
value, it reads a placeholder instead, a graph input fed on every replay (a 0-dim value as a
lifted scalar, a larger one as an upload), taken at the point of the host program where the op
read it. The host nodes a replay needs (dynamic ones, what they read, host outputs) run first, as
Python code FX generates, on the caller's tensors: their in-place writes (AdamW's `step += 1`)
land as in eager. A device value written into a CPU argument is copied back after the run (it
waits for the device, as eager's copy does). Dynamic host nodes that only feed device ops are
traced onto the device instead (`_device_plan`): their arithmetic fuses into the graph. A number
read from a dynamic host value (`.item()`) that a device op uses is refused: it would be baked.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from . import fallback
from .ir import Node, TensorSpec, scalar
from .tensor import DEVICE_TYPE, new_tensor, read, state

GRAPH_INPUT = "xla::graph_input"  # a traced graph's input: an argument, or a host value


def input_rule(*_: Any) -> Any:
    raise RuntimeError("internal: a graph_input placeholder reached a lowering")


def tensors_in(v: Any) -> Iterator[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from tensors_in(x)


def _on_device(v: Any) -> bool:
    return any(t.device.type == DEVICE_TYPE for t in tensors_in(v))


_VALUE_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)


def _seeded(n: torch.fx.Node) -> bool:
    return isinstance(n.target, torch._ops.OpOverload) and (
        torch.Tag.nondeterministic_seeded in n.target.tags
    )


def _is_dynamic(n: torch.fx.Node, value: Any, dynamic: set[torch.fx.Node]) -> bool:
    """Can host node `n`'s value change from call to call? A CPU tensor argument's can, a random
    op's, and what computes from such values; a number computed from them is a size (static),
    unless it reads their values."""
    holds_tensor = any(True for _ in tensors_in(value))
    if n.op == "placeholder":
        return holds_tensor
    if _seeded(n):
        return True
    reads = holds_tensor or n.target in _VALUE_READS
    return reads and any(m in dynamic for m in n.all_input_nodes)


def _device_plan(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """Host nodes to trace onto the device instead: those whose values change from call to call
    and reach only device ops. An AdamW step's bias corrections from its CPU step counts are ~10
    foreach ops over every parameter's count: on the host they would run on every call, in the
    graph they are a few fused scalar ops. Only the counts' update stays on the host (it is
    written back). Decided from the graph's fake values (`meta["val"]`); without them, none."""
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    if not all("val" in n.meta for n in nodes if n.op in ("placeholder", "call_function")):
        return set()
    host: set[torch.fx.Node] = set()
    dynamic: set[torch.fx.Node] = set()
    keep: list[torch.fx.Node] = []  # host nodes the host part needs
    for n in nodes:
        if n.op == "get_attr":
            host.add(n)
            continue
        v = n.meta.get("val")
        if _on_device(v) or not all(m in host for m in n.all_input_nodes):
            continue
        host.add(n)
        if _is_dynamic(n, v, dynamic):
            dynamic.add(n)
        if n.op == "placeholder":
            continue
        if _seeded(n) or _mutates(n) or n.target in _VALUE_READS or n.op != "call_function":
            keep.append(n)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    keep += [m for m in out.all_input_nodes if m in host]
    kept = _with_host_inputs(keep, host)
    return {n for n in dynamic if n not in kept and n.op == "call_function"}


def _with_host_inputs(nodes: list[torch.fx.Node], host: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """`nodes` and every host node they read, directly or not."""
    found: set[torch.fx.Node] = set()
    todo = list(nodes)
    while todo:
        n = todo.pop()
        if n not in found:
            found.add(n)
            todo.extend(m for m in n.all_input_nodes if m in host)
    return found


class _HostInput:
    """A host value a device op reads, fed on replay: element `index` of FX node `node`'s value
    (all of it if None), taken after the first `after` host steps ran."""

    __slots__ = ("node", "index", "after")

    def __init__(self, node: torch.fx.Node, index: int | None, after: int) -> None:
        self.node, self.index, self.after = node, index, after


class Tracer(torch.fx.Interpreter):
    """Runs an FX graph as calling it would, naming the node it is at (`fallback.tracing_target`):
    the op a value read inside the trace is about (FallbackWhileTracing). It also sorts the
    graph's host values out (Note [Host values in a trace])."""

    def __init__(self, gm: torch.fx.GraphModule, first_input: int) -> None:
        super().__init__(gm)
        self.host: set[torch.fx.Node] = set()  # nodes whose value is on the CPU (or no tensor)
        self.dynamic: set[torch.fx.Node] = set()  # ... that can change from call to call
        self.steps: list[torch.fx.Node] = []  # the host nodes to run on replay, in order
        self.inputs: list[_HostInput] = []
        self.input_nodes: dict[int, int] = {}  # id(graph_input Node) -> its index in `inputs`
        self._placeholders: dict[tuple, torch.Tensor] = {}
        self._next = first_input
        self.arg_of: dict[torch.fx.Node, int] = {}  # placeholder -> its argument's position
        self.output_args: list[Any] = []
        self.to_device = _device_plan(gm)

    def run_node(self, n: torch.fx.Node) -> Any:
        fallback.tracing_target = n.target
        if n.op == "output":
            out = n.args[0]
            self.output_args = list(out) if isinstance(out, (list, tuple)) else [out]
            return super().run_node(n)
        if n.op == "placeholder":
            self.arg_of[n] = len(self.arg_of)
        ins = n.all_input_nodes
        host_ins = [m for m in ins if m in self.host]
        if len(host_ins) == len(ins) and n not in self.to_device:
            out = super().run_node(n)
            if not _on_device(out):
                self.host.add(n)
                if _is_dynamic(n, out, self.dynamic):
                    self.dynamic.add(n)
                if n.op not in ("placeholder", "get_attr"):
                    self.steps.append(n)
                return out
            # A device value from host values only (a copy to the device): run again below
            # when some of them can change.
            if not any(m in self.dynamic for m in host_ins):
                return out
        # A device op reading host values: those that can change are graph inputs fed per call.
        swap = [m for m in host_ins if m in self.dynamic]
        if not swap:
            return super().run_node(n)
        saved = {m: self.env[m] for m in swap}
        try:
            for m in swap:
                self.env[m] = self._device_view(m, self.env[m])
            return super().run_node(n)
        finally:
            self.env.update(saved)

    def _device_view(self, m: torch.fx.Node, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return self._placeholder(m, None, v)
        if isinstance(v, (list, tuple)):
            return type(v)(self._device_view_of(m, i, x) for i, x in enumerate(v))
        return self._device_view_of(m, None, v)

    def _device_view_of(self, m: torch.fx.Node, index: int | None, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return self._placeholder(m, index, v)
        if isinstance(v, (bool, int, float, complex)):
            # A number read from a CPU tensor argument (`.item()` in the graph): the trace would
            # bake this call's value into every later call.
            raise NotImplementedError(
                f"torch.compile(backend='lazyxla'): {m.format_node()} reads a number from a CPU "
                "tensor argument, and a device op uses it; lazyxla cannot replay that. Pass the "
                "tensor on the lazyxla device, or read the number outside the compiled function"
            )
        return v

    def _placeholder(self, m: torch.fx.Node, index: int | None, t: torch.Tensor) -> torch.Tensor:
        key = (m, index, len(self.steps))
        ph = self._placeholders.get(key)
        if ph is None:
            spec = TensorSpec(tuple(t.shape), t.dtype)
            node = Node(GRAPH_INPUT, input_rule, (), (self._next,), (), (spec,))
            self._next += 1
            self.input_nodes[id(node)] = len(self.inputs)
            self.inputs.append(_HostInput(m, index, len(self.steps)))
            ph = self._placeholders[key] = new_tensor((node, 0), spec)
        return ph

    def written_args(self) -> list[tuple[int, torch.Tensor]]:
        """CPU arguments a device op wrote (through their placeholders), with the value written."""
        out = []
        for (m, index, _), ph in self._placeholders.items():
            if m.op == "placeholder" and index is None:
                v = read(state(ph))
                if v[0].op != GRAPH_INPUT:
                    out.append((self.arg_of[m], ph))
        return out


class HostProgram:
    """A trace's host steps, run on every replay: the ones whose values can change from call to
    call, those a host output needs, and what they read (Note [Host values in a trace]). They run
    as Python code FX generates once, not through an interpreter: an AdamW step's host part is
    ~300 nodes (its steps' foreach updates and the `getitem`s of their results)."""

    def __init__(self, gm: torch.fx.GraphModule, tracer: Tracer, outputs: list[Any]) -> None:
        wanted = [n for n in tracer.steps if n in tracer.dynamic]
        wanted += [i.node for i in tracer.inputs] + outputs
        needed = _with_host_inputs(wanted, tracer.host)
        g = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        self.arg_positions = []
        for n, i in tracer.arg_of.items():
            if n in needed:
                env[n] = g.placeholder(n.name)
                self.arg_positions.append(i)
        for n in needed:
            if n.op == "get_attr":
                env[n] = g.node_copy(n, env.__getitem__)
        reads_after: dict[int, list[int]] = {}
        for k, inp in enumerate(tracer.inputs):
            reads_after.setdefault(inp.after, []).append(k)
        steps = [n if n in needed else None for n in tracer.steps]
        last_write = max(
            (p for p, n in enumerate(steps) if n is not None and _mutates(n)), default=-1
        )
        reads: list[Any] = [None] * len(tracer.inputs)
        for p, n in enumerate([*steps, None]):
            writes_later = p <= last_write
            for k in reads_after.get(p, ()):
                inp = tracer.inputs[k]
                v = env[inp.node]
                if inp.index is not None:
                    v = g.call_function(operator.getitem, (v, inp.index))
                if writes_later and _may_change(inp.node, inp.index):
                    v = g.call_function(torch.ops.aten.clone.default, (v,))
                reads[k] = v
            if n is not None:
                env[n] = g.node_copy(n, env.__getitem__)
        g.output((tuple(reads), tuple(env[o] for o in outputs)))
        self.fn = torch.fx.GraphModule(gm, g)
        self.outputs = outputs

    def run(self, args: Sequence[Any]) -> tuple[list[tuple[Node, int]], dict]:
        """The host inputs' values as graph leaves, and the host outputs by FX node."""
        with torch.no_grad():
            reads, outs = self.fn(*[args[i] for i in self.arg_positions])
        return [_as_leaf(v) for v in reads], dict(zip(self.outputs, outs))


# Note [Host reads taken before a write]
# A replay takes each host value a device op reads after the whole host program ran, so a value
# that a later host step writes is cloned where the op read it. An optimizer step's host part
# reads each parameter's new step count (`_foreach_add` of the counts, functionalized) and then
# copies the counts back into the optimizer's tensors: the writes go to the optimizer's tensors,
# not to the fresh results read, so those need no copy (an AdamW step of a 28-parameter GPT-2:
# 28 clones, ~125 us a replay). A read value is left uncloned only when it is the fresh result of
# an op that neither writes nor aliases (or an element of one's list result) and nothing uses it
# where an op's schema says it may write or alias it; anything else is cloned as before.


def _may_change(node: torch.fx.Node, index: int | None) -> bool:
    """Can a host step write the value of `node` (its element `index`), or make a view of it?"""
    src = node
    if index is None and _is_getitem(node):
        src, index = node.args[0], node.args[1]
    if not _allocates(src):
        return True
    if index is None:
        return any(_may_write_or_alias(u, {src}) for u in src.users)
    # the value is `src[index]`: each such getitem is the value itself; the list may be passed whole
    items = [u for u in src.users if _is_getitem(u) and u.args[1] == index]
    uses = [u for u in src.users if not _is_getitem(u)] + [w for u in items for w in u.users]
    return any(_may_write_or_alias(u, {src, *items}) for u in uses)


def _is_getitem(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and n.target is operator.getitem


def _allocates(n: torch.fx.Node) -> bool:
    """An op whose results are new tensors: it writes none of its inputs, aliases none."""
    if not isinstance(n, torch.fx.Node) or n.op != "call_function":
        return False
    if not isinstance(n.target, torch._ops.OpOverload):
        return False
    schema = n.target._schema
    return not schema.is_mutable and all(r.alias_info is None for r in schema.returns)


def _may_write_or_alias(user: torch.fx.Node, values: set[torch.fx.Node]) -> bool:
    """Does `user` take one of `values` where its schema may write it or return a view of it?"""
    if user.op != "call_function" or not isinstance(user.target, torch._ops.OpOverload):
        return True  # (unknown: assume so)
    schema = user.target._schema
    given = dict(zip((a.name for a in schema.arguments), user.args))
    given.update(user.kwargs)
    for a in schema.arguments:
        if a.alias_info is None:
            continue
        v = given.get(a.name)
        if isinstance(v, torch.fx.Node):
            if v in values:
                return True
        elif isinstance(v, (list, tuple)) and any(
            isinstance(x, torch.fx.Node) and x in values for x in v
        ):
            return True
    return False


def _mutates(n: torch.fx.Node) -> bool:
    """Can FX node `n` write to one of its inputs? (Unknown Python callables: by their name.)"""
    if n.op == "call_function":
        if isinstance(n.target, torch._ops.OpOverload):
            return n.target._schema.is_mutable
        return n.target is not operator.getitem and getattr(n.target, "__name__", "").endswith("_")
    return n.op == "call_module" or (n.op == "call_method" and n.target.endswith("_"))


def _as_leaf(v: torch.Tensor) -> tuple[Node, int]:
    """A host tensor's value as a graph leaf: a lifted scalar, or a copy on the device."""
    if v.dim() == 0:
        return scalar(v.item(), v.dtype), 0
    from .transfer import upload_node

    return upload_node(v), 0
