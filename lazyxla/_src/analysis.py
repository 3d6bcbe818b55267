"""PT_XLA_DEBUG_LEVEL: why a graph compiled, and why it ran, on stderr in torch_xla's format;
XLA_SAVE_TENSORS_FILE: every synced graph appended to a file.

Level 1 prints a "Compilation Analysis" before every compile (cache miss) and a "Post Compilation
Analysis" after it; level 2 adds an "Execution Analysis" before every execution. `PT_XLA_DEBUG=1`
is level 2, as in torch_xla. Beyond torch_xla, a compile at a Python line that compiled a
different graph before says what changed (input shapes, an op, a baked-in scalar): the usual
reason for a silent recompile in a training loop.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import math
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from . import ir
from .config import FLAGS

# Why a graph compiled or ran, in torch_xla's words (its tests and log parsers match them).
# `{api}` is the module the program calls: `torch_xla` under the alias, else `lazyxla`.
USER_SYNC = "user {api}.sync"
VALUE_ACCESS = "most likely user code trying to access tensor value before {api}.sync"
PARALLEL_LOADER = "{api}.sync in parallel loader at step end"
STEP_TRACE = "{api}.sync when exiting a profiler StepTrace region"
COMPILE_CLEAR = "{api}.compile clear the pending graph prior calling the target function"
COMPILE = "{api}.compile"
DYNAMO_INPUTS = "{api}.sync when dynamo processing input graphs"
DYNAMO_EXECUTE = "dynamo is executing a compiled program"
ENTER_SPMD = "use_spmd() runs the work pending on one device before entering SPMD mode"
# A dynamo graph's compile has its own cause; its execution's is DYNAMO_EXECUTE.
_COMPILE_CAUSE = {DYNAMO_EXECUTE: "dynamo is compiling a FX graph to HLO"}
# Eager mode's op-by-op executions: torch_xla analyses none of them.
QUIET = ""

_RULE, _DASH = "=" * 80, "-" * 80
_GB = float(1 << 30)
# The graph each Python call site last compiled: (graph hash, summary), for the recompile reason.
_LAST_AT_SITE: dict[str, tuple[str, Any]] = {}


def _write(text: str) -> None:
    """An analysis goes to PT_XLA_DEBUG_FILE (appended) if set, else to stderr, as in torch_xla."""
    if FLAGS.debug_file:
        with open(FLAGS.debug_file, "a") as f:
            f.write(text)
    else:
        sys.stderr.write(text)


def level() -> int:
    return max(FLAGS.debug_level, 2 if FLAGS.pt_xla_debug else 0)


def _text(cause: str) -> str:
    from . import compat

    return cause.format(api="torch_xla" if compat.is_installed() else "lazyxla")


# The name of the graph being run, if its caller named it (`compile(name=...)`): a "Graph Name"
# line in the analysis, as torch_xla prints it.
_graph_name: list[str | None] = [None]


@contextlib.contextmanager
def graph_name(name: str | None) -> Iterator[None]:
    saved, _graph_name[0] = _graph_name[0], name
    try:
        yield
    finally:
        _graph_name[0] = saved


def graph_hash(cap: Any) -> str:
    return hashlib.md5(repr(cap.key).encode()).hexdigest()


# The API functions a user calls to sync (`sync`, `mark_step`): shown as the innermost frame, as
# torch_xla shows its `sync (torch_xla/torch_xla.py:87)`, although they live in lazyxla.
ENTRY_POINTS: set[Any] = set()


def _frames(limit: int | None = None) -> list[str]:
    """The Python frames that triggered the sync, innermost first, outside lazyxla and torch
    (PT_XLA_DEBUG_MAX_FRAME of them, 8 by default, then "..........", as in torch_xla)."""
    if limit is None:
        limit = int(os.environ.get("PT_XLA_DEBUG_MAX_FRAME", "8"))
    out: list[str] = []
    f: Any = sys._getframe(1)
    while f is not None:
        if len(out) > limit:
            out[limit:] = [".........."]
            break
        code = f.f_code
        fn = code.co_filename
        if code in ENTRY_POINTS or (
            not fn.startswith(ir._SKIP_PREFIXES) and not fn.startswith("<frozen")
        ):
            out.append(f"{code.co_name} ({fn}:{f.f_lineno})")
        f = f.f_back
    return out


def _num_inputs(cap: Any) -> int:
    """The graph's parameters as torch_xla counts them: device data and lifted scalars, a random
    op's (seed, offset) pair as its one seed."""
    scalars = sum(
        1
        for n in cap.nodes
        if n.op == ir.SCALAR and not (isinstance(n.meta, tuple) and n.meta[0] == "rng_offset")
    )
    return len(cap.data) + scalars


def _block(prefix: str, title: str, cause: str, cap: Any, extra: list[str]) -> str:
    lines = [_RULE, f"{title} Cause", f"  {_text(cause)}", *extra, "Graph Info: "]
    if _graph_name[0]:
        lines.append(f"  Graph Name: {_graph_name[0]}")
    lines += [
        f"  Graph Hash: {graph_hash(cap)}",
        f"  Number of Graph Inputs: {_num_inputs(cap)}",
        f"  Number of Graph Outputs: {len(cap.root_values)}",
        "Python Frame Triggered Execution: ",
    ]
    lines += [f"  {fr}" for fr in _frames()]
    lines += [_DASH, _RULE]
    return "\n".join(f"{prefix}: {x}" for x in lines) + "\n"


# Note [Recompiles at one line]
# A program whose graph changes every step compiles every step: a sequence that grows by a token
# (text generation with a dynamic KV cache), a last partial batch, a Python number baked into the
# graph. torch_xla compiles such graphs silently (PT_XLA_DEBUG_LEVEL names each cause, if asked).
# lazyxla warns once per Python line (the innermost frame outside lazyxla and torch when the graph
# compiled) when that line has compiled RECOMPILE_WARN_AT different graphs of the same ops (the
# same set of op names: the shapes or baked values changed), with what changed last and what to do
# about it, as dynamo warns at its recompile_limit. Different programs synced at one line (a helper
# that trains several models, a train and an eval step) have other ops and do not add up. Graphs
# are told apart by their key's hash; eager mode's one-op graphs are not counted.
RECOMPILE_WARN_AT = 8
# (file, line) -> ops of a family -> (the family's graph hashes, its last graph's summary)
_GRAPHS_AT_SITE: dict[tuple[str, int], dict[frozenset, tuple[set[int], GraphSummary]]] = {}
_WARNED_SITES: set[tuple[str, int]] = set()


class RecompileWarning(UserWarning):
    """The same line of a program keeps compiling new graphs (Note [Recompiles at one line])."""


def count_compile(cap: Any) -> None:
    """Count a compile at its line; warn at the RECOMPILE_WARN_AT-th different graph of the same
    ops there."""
    f = ir.user_frame(sys._getframe(1))
    if f is None:
        return
    site = (f.f_code.co_filename, f.f_lineno)
    if site in _WARNED_SITES:
        return
    summary = GraphSummary(cap)
    families = _GRAPHS_AT_SITE.setdefault(site, {})
    ops = frozenset(summary.ops)
    graphs, last = families.get(ops, (set(), None))
    h = hash(cap.key)
    if h in graphs:
        return
    graphs.add(h)
    families[ops] = (graphs, summary)
    if len(graphs) < RECOMPILE_WARN_AT or last is None:
        return
    _WARNED_SITES.add(site)
    warnings.warn_explicit(
        f"this line has compiled {len(graphs)} different graphs of the same ops, each a full XLA "
        f"compile (the last one: {summary.brief_diff(last)}). A shape that changes every step "
        "compiles every step: pad inputs to a few fixed sizes (a last partial batch: "
        "drop_last=True), generate text with a static KV cache (transformers' "
        'cache_implementation="static"), pass changing Python numbers as tensors. '
        "PT_XLA_DEBUG_LEVEL=1 prints why each graph compiles; "
        "lazyxla.compile(max_different_graphs=N) makes more than N an error",
        RecompileWarning,
        site[0],
        site[1],
    )


def compilation(cap: Any, cause: str) -> None:
    """Before a compile: why, which graph, from where."""
    extra = []
    frames = _frames()
    site = frames[0] if frames else ""
    h = graph_hash(cap)
    last = _LAST_AT_SITE.get(site)
    summary = GraphSummary(cap)
    if last is not None and last[0] != h:
        extra.append(
            f"  recompiled: this line compiled another graph before: {summary.diff(last[1])}"
        )
    _LAST_AT_SITE[site] = (h, summary)
    cause = _COMPILE_CAUSE.get(cause, cause)
    _write("\n" + _block("Compilation Analysis", "Compilation", cause, cap, extra))


def post_compilation(cap: Any, exe: Any) -> None:
    """After a compile: the executable's sizes, in torch_xla's units."""
    mem = exe.memory_analysis()
    _write(f"\nComputation hash: {hashlib.md5(exe.as_text().encode()).hexdigest()}\n\n")
    inputs = sum(a.nbytes for a in cap.data)
    aliased = sum(a.nbytes for a, d in zip(cap.data, cap.donate) if d)
    outputs = sum(
        math.prod(n.specs[k].shape) * n.specs[k].dtype.itemsize for n, k in cap.root_values
    )
    rows = [
        ("Graph input size", inputs),
        ("Graph output size", outputs),
        ("Aliased Input size", aliased),
        ("Intermediate tensor size", getattr(mem, "temp_size_in_bytes", 0)),
        ("Compiled program size", getattr(mem, "generated_code_size_in_bytes", 0)),
    ]
    lines = [_RULE] + [f"{k}: {v / _GB:.6f} GB" for k, v in rows] + [_DASH, _RULE]
    _write("\n".join(f"Post Compilation Analysis: {x}" for x in lines) + "\n")


def execution(cap: Any, cause: str) -> None:
    _write("\n" + _block("Execution Analysis", "Execution", cause, cap, []))


def save_graph(cap: Any, cause: str | None = None) -> None:
    """Append the graph of a sync to XLA_SAVE_TENSORS_FILE + '.0' (the device ordinal, as torch_xla
    names it), as IR text, HLO or Graphviz dot (XLA_SAVE_TENSORS_FMT), with the Python frames
    that triggered it. A compiled graph's run (`cause` DYNAMO_EXECUTE) is a `[dynamo]` section
    followed by a blank line, as torch_xla's bridge writes it at each cached graph's run."""
    fmt = FLAGS.save_tensors_fmt
    if fmt == "text":
        body = ir.to_text(cap.root_values)
    elif fmt == "dot":
        body = ir.to_dot(cap.root_values)
    elif fmt == "hlo":
        body = cap.function().lower(*cap.args()).compiler_ir("hlo").as_hlo_text()
    else:
        raise ValueError(f"XLA_SAVE_TENSORS_FMT={fmt!r}: use text, hlo or dot")
    h = graph_hash(cap)
    roots = ", ".join(hashlib.md5(repr((cap.key[0], r)).encode()).hexdigest() for r in cap.roots)
    frames = "\n".join(f"  {fr}" for fr in _frames())
    dynamo = cause is DYNAMO_EXECUTE
    section = (
        f"[{'dynamo' if dynamo else 'ScheduleSyncTensorsGraph'}]\nTensorsGraphInfo:\n{frames}\n\n"
        f"Root Hashes: ({roots})\n\n## BEGIN_GRAPH\n{body}\nGraph Hash: {h}\n\n## END_GRAPH\n\n"
        + ("\n" if dynamo else "")
    )
    with open(FLAGS.save_tensors_file + ".0", "a") as f:
        f.write(section)


class GraphSummary:
    """What a user can recognise in a graph: its input shapes and its op sequence."""

    def __init__(self, cap: Any) -> None:  # a graph.Capture
        self.inputs = [ir.shape_str(n.specs[0]) for n in cap.nodes if n.op == ir.DEVICE_DATA]
        self.ops = [n.op for n in cap.nodes if not n.is_leaf]

    def brief_diff(self, other: GraphSummary, most: int = 3) -> str:
        """`diff` in a line: at most `most` input shapes that appeared, and that went."""
        if self.inputs != other.inputs:
            now, before = collections.Counter(self.inputs), collections.Counter(other.inputs)

            def shapes(c: collections.Counter) -> str:
                items = [f"{k}" + (f" x{n}" if n > 1 else "") for k, n in c.items()]
                more = f" and {len(items) - most} more" if len(items) > most else ""
                return ", ".join(items[:most]) + more

            new, gone = now - before, before - now
            parts = [f"new input shapes {shapes(new)}"] if new else []
            parts += [f"no more {shapes(gone)}"] if gone else []
            return "; ".join(parts) or "the inputs' order changed"
        return self.diff(other)

    def diff(self, other: GraphSummary) -> str:
        """How `self` differs from an earlier graph `other`, in words."""
        if self.inputs != other.inputs:
            before, after = ", ".join(other.inputs), ", ".join(self.inputs)
            return f"input shapes changed from [{before}] to [{after}]"
        for i, (a, b) in enumerate(zip(other.ops, self.ops)):
            if a != b:
                return f"the traced ops changed: op #{i} was {a}, now {b}"
        if len(self.ops) != len(other.ops):
            return f"the number of traced ops changed from {len(other.ops)} to {len(self.ops)}"
        return (
            "an op's static arguments changed (a Python scalar baked into the graph, a dtype "
            "or a shape)"
        )
