"""Trace once: a `torch.compile` backend that replays the graph it traced, with no Python tracing.

# Note [Trace once]
Dynamo's guards decide when an FX graph is still valid; AOTAutograd splits it into forward and
backward graphs of plain aten ops whose runtime inputs are ordinary lazyxla tensors (see Note [Lazy
tensor identity]: they are real PrivateUse1 tensors, so FakeTensor and AOTAutograd treat them like
any device tensor and nothing is desugared). For each graph and each input signature we:
1. *trace once*: run the FX graph on placeholder lazy tensors (`xla::graph_input` leaves), which
   records its IR; the leaves reached are the graph's inputs, in post-order; lifted scalars and
   device data created inside are captured as constant inputs, RNG offsets as inputs renewed on
   every call; an in-place write to a placeholder is an extra output written back on replay;
2. *replay*: splice one `xla::dynamo_graph` node into the lazy IR, whose inputs are the call's
   arguments (pending or not: no forced sync) and whose rule interprets the traced program. Its
   descriptor is the trace's interned structural id, so the graph cache sees the same key every
   call and compiles once per input signature. No aten kernel runs on replay: the `xla::<op>`
   counters stay still.
By default the outputs are then executed at once (torch_xla's dynamo bridge semantics, so loops
with no sync never grow a graph); `options={"sync": False}` leaves them pending, to be fused with
whatever follows until the next sync. AOTAutograd keeps an inference graph's input mutations in the
graph (`keep_inference_input_mutations`): the replay writes them (step 1), with no `copy_` per
mutated input after it (a compiled optimizer step writes every parameter and state tensor).
CPU tensor arguments are read on every call: see Note [Host values in a trace] in trace_host.py.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from . import analysis, collectives, donation, fallback, graph, metrics, random_state, read_sync
from .config import FLAGS
from .ir import (
    DEVICE_DATA,
    SCALAR,
    Node,
    Ref,
    TensorSpec,
    _user_frame,
    intern_desc,
    node_with_desc,
    post_order,
    scalar,
    structure_key,
)
from .lower import Program
from .tensor import (
    DEVICE_TYPE,
    new_tensor,
    next_seq,
    read,
    retire_since,
    state,
    storage_nbytes,
    write,
)
from .trace_host import GRAPH_INPUT, HostProgram, Tracer, input_rule, tensors_in
from .writes import non_overlapping_and_dense


def _skip_lazyxla_frames() -> None:
    """Dynamo must run lazyxla's own code, never trace it: after a graph break (`backward()`),
    autograd calls our PrivateUse1 kernels, and dynamo would otherwise compile those frames and
    guard on our metrics counters. Registered when this backend is first looked up."""
    from torch._dynamo import trace_rules

    trace_rules.add("lazyxla._src")
    # Nor jax: dynamo calls a nanobind bound method it meets in a traced frame (jax's
    # `default_registry.flatten`) without its `self`, so `jax.device_put` / `tree_unflatten`
    # reached from a compiled frame fail with "flatten(): incompatible function arguments".
    trace_rules.add("jax")
    trace_rules.add("jaxlib")


_skip_lazyxla_frames()


_ARG, _CONST, _HOST, _RNG = (object() for _ in range(4))  # a leaf's feed (Trace.feeds)
_REPLAY = "xla::dynamo_graph"  # the op of a replay's node


class _Leaf:
    """How a traced graph's leaf is fed on replay."""

    __slots__ = ("kind", "arg", "node")

    def __init__(self, kind: str, arg: int = -1, node: Node | None = None) -> None:
        self.kind = kind  # "arg" | "host" | "const" | "rng_seed" | "rng_offset"
        self.arg = arg
        self.node = node


# Note [A trace's constant scalars]
# The Python numbers of a traced graph are lifted scalars (Note [Scalars seen again]), and a
# replay feeds each the node it was traced with: the same value on every call. A foreach
# optimizer's graph has one per parameter for each of its constants (a 2-layer GPT-2's AdamW step:
# 0.9, 0.999 and 0.1 each 28 times, 86 of its 117 scalars), and each was one more argument of the
# step's executable, converted and passed on every call. Equal constants (same dtype, type and
# value, -0.0 apart from 0.0; never a NaN) are fed one shared node: one argument each.
def _scalar_key(n: Node) -> tuple | None:
    v = n.data
    t = type(v)
    if t is float:
        return None if v != v else (n.specs[0].dtype, t, v, math.copysign(1.0, v))
    if t is int or t is bool:
        return (n.specs[0].dtype, t, v)
    return None


def _eager_layout(t: torch.Tensor) -> tuple[int, ...] | None:
    """The strides a replayed output keeps: the traced output's (eager's, as lazyxla records
    them) when they are a permutation of dense ones (a transposed result, channels_last), else
    None (contiguous; a strided slice of an intermediate comes back dense)."""
    if t.is_contiguous():
        return None
    return tuple(t.stride()) if non_overlapping_and_dense(t) else None


class Trace:
    """One FX graph traced for one input signature."""

    def __init__(self, gm: torch.fx.GraphModule, args: Sequence[Any]) -> None:
        first = next_seq()
        try:
            self._trace(gm, args)
        except BaseException as e:
            # Its tensors read placeholders: a later sync must not run them.
            retire_since(first, RuntimeError(f"an abandoned trace-once trace: {e!r}"))
            raise

    def _trace(self, gm: torch.fx.GraphModule, args: Sequence[Any]) -> None:
        fake_args: list[Any] = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.device.type == DEVICE_TYPE:
                spec = TensorSpec(tuple(a.shape), a.dtype)
                node = Node(GRAPH_INPUT, input_rule, (), (i,), (), (spec,))
                fake_args.append(new_tensor((node, 0), spec))
            elif isinstance(a, torch.Tensor):  # a host tensor: a copy, the trace may write it
                fake_args.append(a.detach().clone())
            else:
                fake_args.append(a)
        # Collectives in the graph (torch's functional collectives, as xm.all_reduce records
        # them under dynamo) chain on the ordering token (Note [Cross-process collectives]): it is
        # one more input, placeholder `len(args)`, and its new value one more output.
        token_in = None
        if collectives.active():
            spec = TensorSpec((), torch.int32)
            token_in = new_tensor(
                (Node(GRAPH_INPUT, input_rule, (), (len(args),), (), (spec,)), 0), spec
            )
            outer_token = collectives.swap_token(token_in)
        fallback.tracing_graph = True
        _trace_donors[:] = [{}]  # See Note [Buffer donor config]
        # (export.py traces its own interpreter object, not a GraphModule)
        tracer = Tracer(gm, len(args) + 1) if isinstance(gm, torch.fx.GraphModule) else None
        try:
            with torch.no_grad():
                outs = tracer.run(*fake_args) if tracer is not None else gm(*fake_args)
        finally:
            fallback.tracing_graph = False
            fallback.tracing_target = None
            self.donors: dict[int, bool] = _trace_donors.pop() if _trace_donors else {}
            token_out = collectives.swap_token(outer_token) if token_in is not None else None
        self.collectives = token_out is not None and token_out is not token_in
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        out_nodes: list[Any] = [None] * len(outs)
        if tracer is not None and len(tracer.output_args) == len(outs):
            out_nodes = tracer.output_args
        # Outputs: tensors computed by the graph, inputs passed straight through, host values.
        roots: list[tuple[Node, int]] = []
        # The roots a replay makes a tensor for (its outputs, a host write's source, the token),
        # each with the strides eager gives it (None: contiguous). Roots that only write an input
        # need no tensor of their own: an optimizer step writes hundreds.
        tensor_roots: dict[int, tuple[int, ...] | None] = {}
        self.out_plan: list[tuple[str, Any]] = []
        host_outs = []
        for o, fx_node in zip(outs, out_nodes):
            if (
                isinstance(fx_node, torch.fx.Node)
                and fx_node in tracer.host
                and (fx_node in tracer.dynamic or any(True for _ in tensors_in(o)))
            ):
                self.out_plan.append(("host", fx_node))
                host_outs.append(fx_node)
            elif isinstance(o, torch.Tensor) and o.device.type == DEVICE_TYPE:
                v = read(state(o))
                if v[0].op == GRAPH_INPUT and v[0].args[0] < len(args):
                    self.out_plan.append(("arg", v[0].args[0]))
                else:
                    self.out_plan.append(("out", len(roots)))
                    tensor_roots[len(roots)] = _eager_layout(o)
                    roots.append(v)
            else:
                self.out_plan.append(("py", o))
        # In-place writes to inputs (e.g. BatchNorm running stats kept in the graph).
        self.mutations: list[tuple[int, int]] = []
        for i, t in enumerate(fake_args):
            if isinstance(t, torch.Tensor) and t.device.type == DEVICE_TYPE:
                v = read(state(t))
                if v[0].op != GRAPH_INPUT:
                    self.mutations.append((i, len(roots)))
                    roots.append(v)
        # Host arguments a device op wrote: copied back after the run.
        self.host_writes: list[tuple[int, int]] = []
        for i, ph in tracer.written_args() if tracer is not None else ():
            self.host_writes.append((i, len(roots)))
            tensor_roots[len(roots)] = None
            roots.append(read(state(ph)))
        self.host = None
        if tracer is not None and (
            tracer.inputs or host_outs or any(n in tracer.dynamic for n in tracer.steps)
        ):
            self.host = HostProgram(gm, tracer, host_outs)
        self.token_root = -1
        if self.collectives:
            self.token_root = len(roots)
            tensor_roots[len(roots)] = None
            roots.append(read(state(token_out)))
        nodes = post_order([n for n, _ in roots])
        pos = {id(n): i for i, n in enumerate(nodes)}
        leaves = [n for n in nodes if n.op in (GRAPH_INPUT, DEVICE_DATA, SCALAR)]
        self.leaves: list[_Leaf] = []
        shared: dict[tuple, Node] = {}  # Note [A trace's constant scalars]
        for n in leaves:
            if n.op == GRAPH_INPUT:
                host = tracer.input_nodes.get(id(n)) if tracer is not None else None
                self.leaves.append(_Leaf("arg", n.args[0]) if host is None else _Leaf("host", host))
            elif n.meta is not None:  # a random op's (seed, offset), see ir.rng_scalar
                self.leaves.append(_Leaf(n.meta[0], node=n))
            else:
                n.meta = donation.KEEP  # replayed every call: never donate its buffer
                key = _scalar_key(n) if n.op == SCALAR else None
                fed = n if key is None else shared.setdefault(key, n)
                self.leaves.append(_Leaf("const", node=fed))
        # How replay feeds each leaf: (kind, argument index | (node, 0) | host index | leaf)
        self.feeds: list[tuple[object, Any]] = [
            (_ARG, leaf.arg)
            if leaf.kind == "arg"
            else (_CONST, (leaf.node, 0))
            if leaf.kind == "const"
            else (_HOST, leaf.arg)
            if leaf.kind == "host"
            else (_RNG, leaf)
            for leaf in self.leaves
        ]
        self.arg_leaves = [leaf.arg for leaf in self.leaves if leaf.kind == "arg"]
        self.out_specs = tuple(n.specs[k] for n, k in roots)
        self.program = Program(
            nodes, pos, [(pos[id(n)], k) for n, k in roots], leaf_ids={id(n) for n in leaves}
        )
        parts = structure_key(nodes, (GRAPH_INPUT, DEVICE_DATA, SCALAR))
        self.id = intern_desc(("dynamo_graph", parts, tuple((pos[id(n)], k) for n, k in roots)))
        body = self.program.function()
        self.rule = lambda *arrays: tuple(body(list(arrays[:-1]), []))
        self.n_roots = len(roots)
        # A replay node's static arguments: one reference per leaf, then the graph's id. Its
        # descriptor is interned here, once: hashing those arguments again on every replay cost
        # ~40 us (a GPT-2 step's graphs take ~70 inputs each).
        self.node_args = (*(Ref(i) for i in range(len(self.leaves))), self.id)
        self.desc = Node(_REPLAY, self.rule, (), self.node_args, (), self.out_specs).desc
        # (root, spec, strides, storage bytes) of each output a replay makes a tensor for
        self.out_tensors: list[tuple[int, TensorSpec, tuple[int, ...] | None, int]] = []
        for i, stride in tensor_roots.items():
            spec = self.out_specs[i]
            nbytes = storage_nbytes(spec.shape, stride, spec.dtype.itemsize)
            self.out_tensors.append((i, spec, stride, nbytes))

    def replay(self, args: Sequence[Any], sync: bool, states: list[Any]) -> Any:
        """Splice this trace into the lazy IR as one node over `args` (whose lazy states,
        None for other values, are `states`); returns the FX graph's outputs."""
        if sync and not self.collectives:  # (their ordering token is an input: one graph)
            pending = [s for s in (states[i] for i in self.arg_leaves) if s.is_pending]
            if pending:
                # As torch_xla's bridge: pending inputs run first, in their own graph, so the
                # compiled program is the same whatever produced its inputs.
                read_sync.sync_inputs(pending, analysis.DYNAMO_INPUTS)
        if self.donors or _any_marked(args):
            _mark_donors(self.donors, args)  # See Note [Buffer donor config]
        if self.collectives:
            args = [*args, collectives.current_token()]
            states = [*states, state(args[-1])]
        host_inputs, host_env = self.host.run(args) if self.host is not None else ((), None)
        # torch_xla's timers of a cached graph's run: its input data, then its output tensors
        t0 = time.perf_counter_ns()
        inputs: list[tuple[Node, int]] = []
        offset_pairs: dict[int, tuple[int, int]] = {}
        for kind, v in self.feeds:
            if kind is _ARG:  # `read`, inlined: a base, or a view its base has not moved under
                s = states[v]
                b = s.base
                inputs.append(s.value if b is None or s.seen == b.version else read(s))
            elif kind is _CONST:
                inputs.append(v)
            elif kind is _HOST:
                inputs.append(host_inputs[v])
            else:  # a random op's (seed, offset): fresh every call
                i = v.node.meta[1]
                if i not in offset_pairs:
                    offset_pairs[i] = random_state.next_offset()
                seed, off = offset_pairs[i]
                inputs.append((scalar(seed if v.kind == "rng_seed" else off, torch.int64), 0))
        node = node_with_desc(
            _REPLAY, self.rule, tuple(inputs), self.node_args, (), self.out_specs, self.desc
        )
        if FLAGS.ir_debug:
            node.src = _user_frame()
        t1 = time.perf_counter_ns()
        outs: dict[int, torch.Tensor] = {
            i: new_tensor((node, i), spec, stride, nbytes)
            for i, spec, stride, nbytes in self.out_tensors
        }
        metrics.metric_add("RunCachedGraphInputData", t1 - t0)
        metrics.metric_add("RunCachedGraphOutputData", time.perf_counter_ns() - t1)
        if self.collectives:
            node.meta = collectives.HOLDS_COLLECTIVES
            collectives.swap_token(outs[self.token_root])
        for arg_index, root in self.mutations:
            write(states[arg_index], (node, root))
        if sync and self.n_roots:
            # The written inputs too: left pending, each would run again, alone, before the next
            # call (a static KV cache: one more execution per token).
            written = [state(o) for o in outs.values()]
            for arg_index, _ in self.mutations:
                st = states[arg_index]
                written.append(st.base or st)  # (a view's write is its base's new value)
            with alias_with_buffer_donor_config(True):  # as torch_xla's bridge compiles
                graph.sync_states(written, cause=analysis.DYNAMO_EXECUTE)
        for i, root in self.host_writes:
            args[i].copy_(outs[root].cpu())
        result = []
        for kind, v in self.out_plan:
            if kind == "out":
                result.append(outs[v])
            elif kind == "arg":
                result.append(args[v])
            elif kind == "host":
                result.append(host_env[v])
            else:
                result.append(v)
        return result


_NOT_LAZY = object()


def _lazy_state(t: torch.Tensor) -> Any:
    """`t`'s lazy state, or None for a tensor of another device (one without a storage too)."""
    try:
        return getattr(t.untyped_storage(), "_lx", None)
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return None


class CompiledGraph:
    """An FX graph's traces by input signature; calling it replays (tracing on a new signature).

    A graph holding an op with no lowering is split (as torch_xla's bridge does): the op's nodes
    run through the CPU fallback, counted as `aten::<op>`, between partitions that are each traced
    once and replayed.
    """

    def __init__(self, gm: torch.fx.GraphModule, sync: bool = True) -> None:
        self.gm = gm
        self.sync = sync
        self.traces: dict[tuple, Trace] = {}
        self.partitioned: torch.fx.GraphModule | None = None

    @staticmethod
    def signature(args: Sequence[Any], states: list[Any] | None = None) -> tuple:
        """What a trace depends on: each lazy tensor's spec (shape, dtype) and sharding
        annotation, each other tensor's shape, dtype and device, each other value itself. A lazy
        tensor's state holds its spec: reading it costs a third of building the shape tuple and
        device object (~100 args per call of a GPT-2 step's graphs). `states` receives each
        argument's lazy state (None for anything else), for the replay to read."""
        sig = []
        for a in args:
            s = _lazy_state(a) if isinstance(a, torch.Tensor) else _NOT_LAZY
            if s is _NOT_LAZY:
                sig.append(a)
                s = None
            elif s is not None:
                ann = s.sharding
                sig.append((s.spec, None if ann is None else getattr(ann, "named", None)))
            else:
                sig.append((tuple(a.shape), a.dtype, a.device.type))
            if states is not None:
                states.append(s)
        return tuple(sig)

    def __call__(self, *args: Any) -> Any:
        if self.partitioned is not None:
            out = self.partitioned(*args)
            return list(out) if isinstance(out, (list, tuple)) else [out]
        args = list(args)
        states: list[Any] = []
        key = self.signature(args, states)
        tr = self.traces.get(key)
        if tr is None:
            metrics.counter_inc("DynamoExtractCompiledGraph")
            try:
                tr = self.traces[key] = Trace(self.gm, args)
            except fallback.FallbackWhileTracing as e:
                unsupported = {e.op} if e.node is None else {e.op, e.node}
                self.partitioned = partition_for_cpu_fallback(self.gm, unsupported, self.sync)
                return self(*args)
        return tr.replay(args, self.sync, states)


def _has_lowering(op: Any) -> bool:
    return isinstance(op, torch._ops.OpOverload) and torch._C._dispatch_has_kernel_for_dispatch_key(
        op.name(), "PrivateUse1"
    )


def partition_for_cpu_fallback(
    gm: torch.fx.GraphModule, unsupported: set, sync: bool = True
) -> torch.fx.GraphModule:
    """`gm` with every run of supported nodes fused into a trace-once submodule; the others
    (`unsupported`, and ops lazyxla has no kernel for) stay as calls through the CPU fallback."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupport

    class Support(OperatorSupport):
        def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
            if node.op != "call_function":
                return False
            t = node.target
            if t in unsupported:
                return False
            if isinstance(t, torch._ops.OpOverload) and not _has_lowering(t):
                return torch._C._dispatch_has_kernel_for_dispatch_key(
                    t.name(), "CompositeExplicitAutograd"
                )
            return True

    if not any(n.op == "call_function" and n.target in unsupported for n in gm.graph.nodes):
        # (partitioning would give back the same graph, which fails the same way, endlessly)
        raise RuntimeError(
            f"torch.compile(backend='lazyxla'): {', '.join(map(str, unsupported))} cannot be "
            "traced and is not a node of the graph to partition it out; run this code without "
            "torch.compile, or report it with the graph (TORCH_LOGS=graph_code)"
        )
    partitioner = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True)
    fused = partitioner.fuse_partitions(partitioner.propose_partitions())
    for name, sub in list(fused.named_children()):
        if name.startswith("fused_"):
            compiled = CompiledGraph(sub, sync=sync)
            setattr(fused, name, _Replayed(compiled))
    fused.recompile()
    return fused


class _Replayed(torch.nn.Module):
    """A fused partition as a module: calls its CompiledGraph, returns what the FX call expects."""

    def __init__(self, compiled: CompiledGraph) -> None:
        super().__init__()
        self.compiled = compiled
        out = [n for n in compiled.gm.graph.nodes if n.op == "output"][0]
        self.tuple_out = isinstance(out.args[0], (tuple, list))

    def forward(self, *args: Any) -> Any:
        out = self.compiled(*args)
        return tuple(out) if self.tuple_out else out[0]


def extract_compiled_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """torch_xla's `dynamo_bridge.extract_compiled_graph`: a callable running `gm` optimized."""
    compiled = CompiledGraph(gm)

    def run(*args: Any) -> tuple:
        return tuple(compiled(*args))

    return run


def _make_compiler(sync: bool) -> Callable:
    from functorch.compile import make_boxed_func

    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        compiled = CompiledGraph(gm, sync=sync)

        def run(*args: Any) -> list:
            return compiled(*args)

        return make_boxed_func(run)

    return compiler


# torch.compile's modes, which `torch.compile(backend=..., mode=...)` passes to any backend
# (transformers' CompileConfig passes "reduce-overhead" by default). lazyxla has one: each graph is
# traced once and its executable replayed, which is what "reduce-overhead" asks of inductor.
_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def lazyxla_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: dict | None = None,
    mode: str | None = None,
) -> Callable:
    """The `torch.compile(backend="lazyxla")` entry point (see Note [Trace once])."""
    from torch._dynamo.backends.common import aot_autograd

    if mode not in _MODES:
        raise ValueError(
            f"torch.compile(backend='lazyxla', mode={mode!r}): unknown mode; lazyxla accepts "
            f"{', '.join(repr(m) for m in _MODES)} and runs each the same way (trace once, "
            "replay the executable)"
        )
    sync = True if options is None else bool(options.get("sync", True))
    compiler = _make_compiler(sync)
    return aot_autograd(
        fw_compiler=compiler, bw_compiler=compiler, keep_inference_input_mutations=True
    )(gm, example_inputs)


def register_backends() -> None:
    from torch._dynamo.backends.registry import register_backend

    register_backend(name="lazyxla")(lazyxla_backend)


# Note [Buffer donor config]
# torch_xla's `alias_with_buffer_donor_config`: while it is on, a graph may write its outputs into
# the buffers of inputs marked donatable (`torch_xla._XLAC._set_buffer_donation`, or
# `torch.ops.xla.dynamo_set_buffer_donor_` inside a compiled function), and the marks enter the
# graph's hash. torch_xla's dynamo bridge compiles its graphs with it on, and bakes the aliasing
# into the executable it replays: an argument donated when the graph was compiled is donated on
# every call, though dynamo does not see the mark (the buffer a call returns is not marked). A
# trace does the same: `dynamo_set_buffer_donor_` met on a graph input while tracing, and a mark
# on an argument at a replay, make that argument a donor of the trace (`Trace.donors`), marked
# again before each replay, so the donation mask, and the executable, stay the same.
_alias_with_buffer_donor = [False]
_trace_donors: list[dict[int, bool]] = []  # while a Trace runs its graph: {arg index: donate}


def _any_marked(args: Sequence[Any]) -> bool:
    return donation.donation_marked[0] and any(
        isinstance(a, torch.Tensor)
        and a.device.type == DEVICE_TYPE
        and read(state(a))[0].meta == donation.DONATE
        for a in args
    )


def _mark_donors(donors: dict[int, bool], args: Sequence[Any]) -> None:
    """Mark the trace's donor arguments, after adding the arguments marked now (sticky)."""
    from .xlac import _set_buffer_donation

    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.device.type == DEVICE_TYPE:
            if read(state(a))[0].meta == donation.DONATE:
                donors.setdefault(i, True)
    for i, donate in donors.items():
        if read(state(args[i]))[0].meta != (donation.DONATE if donate else None):
            _set_buffer_donation(args[i], donate)


def _set_buffer_donor(t: torch.Tensor, should_donoate: bool) -> torch.Tensor:
    """`torch.ops.xla.dynamo_set_buffer_donor_` on a lazyxla tensor: mark its buffer (a graph
    input while a trace runs: make it a donor of the trace)."""
    from .xlac import _set_buffer_donation

    node = read(state(t))[0]
    if node.op == GRAPH_INPUT and _trace_donors:
        _trace_donors[-1][node.args[0]] = bool(should_donoate)
        metrics.counter_inc("XlaSetBufferDonation")
    else:
        _set_buffer_donation(t, bool(should_donoate))
    return t


def _define_set_buffer_donor() -> None:
    from .custom_call import XLA_LIB

    XLA_LIB.define("dynamo_set_buffer_donor_(Tensor t, bool should_donoate) -> Tensor")
    XLA_LIB.impl(
        "dynamo_set_buffer_donor_", lambda t, should_donoate: t, "CompositeExplicitAutograd"
    )
    XLA_LIB.impl("dynamo_set_buffer_donor_", _set_buffer_donor, "PrivateUse1")


_define_set_buffer_donor()


def get_alias_with_buffer_donor() -> bool:
    """Whether graphs alias outputs with inputs marked as buffer donors (torch_xla's config)."""
    return _alias_with_buffer_donor[0]


def set_alias_with_buffer_donor(should_alias: bool) -> None:
    _alias_with_buffer_donor[0] = bool(should_alias)


@contextlib.contextmanager
def alias_with_buffer_donor_config(should_alias: bool = True) -> Iterator[bool]:
    """Turn the buffer donor config on (or off) inside the block; yields the previous value.

    Example:
        >>> with alias_with_buffer_donor_config() as saved_config:
        ...     h = torch_xla._XLAC._get_graph_hash([res])  # donor marks count
    """
    saved = get_alias_with_buffer_donor()
    set_alias_with_buffer_donor(should_alias)
    try:
        yield saved
    finally:
        set_alias_with_buffer_donor(saved)
