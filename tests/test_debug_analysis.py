"""PT_XLA_DEBUG_LEVEL: compile and execution cause analysis on stderr, in torch_xla's format."""

from __future__ import annotations

import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla._src import analysis, graph
from lazyxla._src.config import FLAGS

dev = lazyxla.device()


@pytest.fixture
def debug_level():
    def set_level(n: int) -> None:
        FLAGS.set("debug_level", n)
        graph.CACHE.clear()  # graphs compiled by earlier tests would be cache hits here

    yield set_level
    FLAGS.set("debug_level", 0)


def _blocks(err: str, kind: str) -> list[list[str]]:
    """The lines of each `<kind> Analysis` block, prefix removed."""
    out: list[list[str]] = []
    for line in err.splitlines():
        if line.startswith(f"{kind} Analysis: {kind} Cause"):
            out.append([])
        elif out and line.startswith(f"{kind} Analysis: "):
            out[-1].append(line[len(kind) + 11 :])
    return out


def test_level_1_explains_every_compile(debug_level, capsys):
    debug_level(1)
    met.clear_all()
    a, b = torch.randn(2, 3).to(dev), torch.randn(3, 4).to(dev)
    for _ in range(3):
        t = (a @ b + 1).relu()
        lazyxla.sync()
    float((t[0, 0] * 2).cpu())  # (a read of t[0, 0] alone moves data: answered on the host)
    err = capsys.readouterr().err
    blocks = _blocks(err, "Compilation")
    assert len(blocks) == met.counter_value("UncachedCompile") == 2  # the step once, then the read
    # (`lazyxla.sync`, or `torch_xla.sync` once the alias is installed, as torch_xla words it)
    assert blocks[0][0] == f"  {analysis._text(analysis.USER_SYNC)}"
    assert blocks[1][0].startswith("  most likely user code trying to access tensor value before ")
    assert blocks[1][0] == f"  {analysis._text(analysis.VALUE_ACCESS)}"
    assert "  Number of Graph Inputs: 2" in blocks[0]
    assert "  Number of Graph Outputs: 1" in blocks[0]
    assert any(f"test_debug_analysis.py:{_line_of('lazyxla.sync()')})" in x for x in blocks[0])
    assert err.count("Post Compilation Analysis: Graph input size: ") == 2
    assert "Execution Analysis" not in err


def test_level_2_explains_every_execution(debug_level, capsys):
    debug_level(2)
    met.clear_all()
    a = torch.randn(4).to(dev)
    for _ in range(3):
        a = a * 2
        lazyxla.sync()
    err = capsys.readouterr().err
    assert len(_blocks(err, "Execution")) == met.counter_value("ExecuteComputation") == 3
    assert len(_blocks(err, "Compilation")) == 1


def test_recompile_at_same_line_says_what_changed(debug_level, capsys):
    debug_level(1)
    w = torch.randn(3, 4).to(dev)
    for n in (4, 5):
        y = (torch.randn(n, 3).to(dev) @ w).sum()  # noqa: F841 (a live tensor: sync runs it)
        lazyxla.sync()
    blocks = _blocks(capsys.readouterr().err, "Compilation")
    assert len(blocks) == 2
    assert blocks[1][1] == (
        "  recompiled: this line compiled another graph before: input shapes changed from "
        "[f32[3,4]{1,0}, f32[4,3]{1,0}] to [f32[3,4]{1,0}, f32[5,3]{1,0}]"
    )


def _causes(err: str, kind: str) -> list[str]:
    return [b[0].strip() for b in _blocks(err, kind)]


def _names(err: str) -> list[str]:
    return [x.split(": ", 2)[2] for x in err.splitlines() if "Analysis:   Graph Name: " in x]


def test_each_sync_site_gives_its_cause_and_compile_names_its_graphs(debug_level, capsys):
    """torch_xla's causes (its tests and log readers match them): `compile`'s two syncs, named
    `<name>_clear_pending` and `<name>`; the parallel loader's step ends; a StepTrace's exit; a
    torch.compile'd function's pending inputs, then its program; reads; eager mode says nothing."""
    from lazyxla.debug import profiler
    from lazyxla.distributed.parallel_loader import MpDeviceLoader
    from lazyxla.experimental import eager_mode_context

    debug_level(2)
    t = torch.randn(6, 4).to(dev) * 3  # pending

    compiled = lazyxla.compile(lambda x: torch.logsumexp(x, 1), name="toy")
    compiled(t)
    err = capsys.readouterr().err
    clear, comp = (analysis._text(c) for c in (analysis.COMPILE_CLEAR, analysis.COMPILE))
    assert _causes(err, "Compilation") == [clear, comp]
    assert _causes(err, "Execution") == [clear, comp]
    assert _names(err) == ["toy_clear_pending", "toy_clear_pending", "toy", "toy"]

    loader = MpDeviceLoader([torch.ones(2, 3) * i for i in range(3)], dev)
    for batch in loader:
        _ = batch + 100
    err = capsys.readouterr().err
    assert set(_causes(err, "Execution")) == {analysis._text(analysis.PARALLEL_LOADER)}
    assert len(_causes(err, "Execution")) == 3 and not _names(err)

    with profiler.StepTrace("train_step", step_num=0):
        _ = t * 2
    err = capsys.readouterr().err
    assert _causes(err, "Execution") == [analysis._text(analysis.STEP_TRACE)]

    fn = torch.compile(lambda x: x * 100, backend="lazyxla")
    fn(torch.randn(4, 4).to(dev) + 1)  # a pending input: run first, in its own graph
    err = capsys.readouterr().err
    dyn = analysis._text(analysis.DYNAMO_INPUTS)
    assert _causes(err, "Compilation") == [dyn, "dynamo is compiling a FX graph to HLO"]
    assert _causes(err, "Execution") == [dyn, "dynamo is executing a compiled program"]

    (t + 1).sum().item()
    err = capsys.readouterr().err
    assert _causes(err, "Execution") == [analysis._text(analysis.VALUE_ACCESS)]

    with eager_mode_context(True):
        _ = torch.randn(3, device=dev) * 2
        lazyxla.sync()
    assert capsys.readouterr().err == ""


def test_frames_stop_at_pt_xla_debug_max_frame(debug_level, capsys, monkeypatch):
    """PT_XLA_DEBUG_MAX_FRAME frames (8 by default), innermost first from the sync call, then
    torch_xla's "..........", when there are more."""
    debug_level(1)

    def nest(k: int) -> torch.Tensor:
        if k:
            return nest(k - 1)
        out = (torch.randn(3).to(dev) * 5).sum()  # live, so the sync has a graph to run
        lazyxla.sync()
        return out

    monkeypatch.setenv("PT_XLA_DEBUG_MAX_FRAME", "4")
    nest(6)
    frames = _blocks(capsys.readouterr().err, "Compilation")[0]
    frames = frames[frames.index("Python Frame Triggered Execution: ") + 1 : -2]
    assert frames[0].startswith("  sync (") and "api.py" in frames[0]
    assert [f.split(" (")[0] for f in frames[1:4]] == ["  nest"] * 3
    assert frames[4:] == ["  .........."]


def test_off_by_default(capsys):
    (torch.randn(3).to(dev) + 7).cpu()
    assert "Analysis" not in capsys.readouterr().err


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.strip() == text)


@pytest.mark.parametrize(
    "fmt,marker", [("text", "IR {"), ("hlo", "HloModule"), ("dot", "digraph G {")]
)
def test_save_tensors_file_appends_every_sync(tmp_path, fmt, marker):
    path = str(tmp_path / "graphs.txt")
    FLAGS.set("save_tensors_file", path)
    FLAGS.set("save_tensors_fmt", fmt)
    try:
        a, b = torch.randn(2, 3).to(dev), torch.randn(3, 4).to(dev)
        for _ in range(3):
            t = (a @ b + 1).relu()
            lazyxla.sync()
        float((t[0, 0] * 2).cpu())  # (t[0, 0] alone moves data: read on the host, no graph)
    finally:
        FLAGS.set("save_tensors_file", "")
        FLAGS.set("save_tensors_fmt", "text")
    with open(path + ".0") as f:  # torch_xla's name: the device ordinal appended
        text = f.read()
    sections = text.split("[ScheduleSyncTensorsGraph]\n")[1:]
    assert len(sections) == 4  # three syncs and the read
    first = sections[0]
    # The API call first, as torch_xla's golden dump shows `sync (.../torch_xla/torch_xla.py:87)`
    assert first.startswith("TensorsGraphInfo:\n  sync (")
    assert first.split("\n")[2].startswith("  test_save_tensors_file_appends_every_sync (")
    assert "\nRoot Hashes: (" in first and f"## BEGIN_GRAPH\n{marker}" in first
    assert first.endswith("## END_GRAPH\n\n") and "\nGraph Hash: " in first
    assert sections[0] == sections[1]  # the same step, the same graph


def test_dot_layout():
    a, b = torch.randn(2, 3).to(dev), torch.randn(3, 4).to(dev)
    t = (a @ b).relu()
    from lazyxla._src import ir
    from lazyxla._src.tensor import read, state

    assert ir.to_dot([read(state(t))]) == (
        "digraph G {\n"
        '  node0 [label="xla::device_data\\nf32[3,4]{1,0}\\nxla_shape=f32[3,4]{1,0}"]\n'
        '  node1 [label="xla::device_data\\nf32[2,3]{1,0}\\nxla_shape=f32[2,3]{1,0}"]\n'
        '  node2 [label="aten::mm\\nf32[2,4]{1,0}\\nxla_shape=f32[2,4]{1,0}"]\n'
        '  node3 [label="aten::relu\\nf32[2,4]{1,0}\\nxla_shape=f32[2,4]{1,0}\\nROOT=0"]\n'
        "  node2 -> node3\n"
        '  node1 -> node2 [label="i=0"]\n'
        '  node0 -> node2 [label="i=1"]\n'
        "}\n"
    )


def test_save_tensors_file_writes_a_dynamo_section_per_compiled_run(tmp_path):
    """Each run of a compiled graph appends a `[dynamo]` section ending in its graph hash and a
    blank line, as torch_xla's bridge writes it (pytorch/xla's graph dump test reads the hash
    five lines from the end after each call)."""
    path = str(tmp_path / "graphs.txt")
    f = torch.compile(lambda x, y: torch.cos(x) + torch.sin(y), backend="lazyxla")
    x, y = torch.tensor(100.0).to(dev), torch.tensor(200.0).to(dev)
    FLAGS.set("save_tensors_file", path)
    try:
        for _ in range(2):
            f(x, y)
            with open(path + ".0") as fh:
                lines = fh.readlines()
            assert lines[-5].startswith("Graph Hash: "), lines[-6:]
    finally:
        FLAGS.set("save_tensors_file", "")
    with open(path + ".0") as fh:
        assert fh.read().count("[dynamo]\n") == 2


def test_a_line_that_keeps_compiling_new_graphs_warns_once_with_what_changed():
    """Note [Recompiles at one line]: the 8th different graph of the same ops compiled at one
    line warns, at that line, once; a graph seen before at the line, or one of other ops (another
    program synced by the same helper), does not count."""
    import warnings

    graph.CACHE.clear()

    def run(t: torch.Tensor) -> float:
        return t.sum().item()  # the line every graph here compiles at

    def step(n: int) -> float:
        return run(torch.ones(n).to(dev) * 2)  # a new length: a new graph

    def other(n: int) -> float:
        return run(torch.ones(n + 100).to(dev).exp())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (1, 2, 1, 3, 4, 5, 6, 7, 2):  # 7 different graphs: no warning yet
            assert step(n) == 2 * n
            other(n)  # other ops at the same line: 8 more graphs, another family
        assert not [w for w in caught if w.category is analysis.RecompileWarning]
        for n in (8, 9, 10):  # the 8th, then more
            assert step(n) == 2 * n
    warned = [w for w in caught if w.category is analysis.RecompileWarning]
    assert len(warned) == 1
    w = warned[0]
    line = run.__code__.co_firstlineno + 1
    assert (w.filename, w.lineno) == (__file__, line)
    message = str(w.message)
    assert "compiled 8 different graphs of the same ops" in message
    assert "new input shapes f32[8]{0}; no more f32[7]{0}" in message
    assert "cache_implementation" in message and "PT_XLA_DEBUG_LEVEL=1" in message
