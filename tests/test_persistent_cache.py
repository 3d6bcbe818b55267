"""The persistent compilation cache (`xr.initialize_cache`) across processes, as pytorch/xla's
test/test_persistent_cache.py checks it: a first process compiles and writes the cache
(`PersistentCacheMiss`), a second one reads the same graphs from it (`PersistentCacheHit`, no
miss), and both compute eager's values. A second process loads each executable by its graph's key
without lowering it (Note [Executables on disk by graph key]); that key names everything the
executable depends on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch
import torch.nn.functional as F

import lazyxla
from lazyxla._src import exe_cache, graph
from lazyxla._src import xla_model as xm
from lazyxla._src.config import FLAGS

_CHILD = """
import json, torch, torch.nn.functional as F, lazyxla, lazyxla.runtime as xr
from lazyxla.debug import metrics
from lazyxla._src import graph
lowered = []
_lower = graph._lower
graph._lower = lambda cap: lowered.append(1) or _lower(cap)
xr.initialize_cache({cache!r})
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
model.to(lazyxla.device())
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
x = torch.randn(5, 8).to(lazyxla.device())
for _ in range(3):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    lazyxla.sync()
out = model(x).cpu()
f = torch.compile(lambda a, b: (a @ b.t()).relu() * 2, backend="lazyxla")
compiled = f(x, x + 1).cpu()
print(json.dumps({{
    "out": out.tolist(),
    "compiled": compiled.tolist(),
    "lowered": len(lowered),
    "uncached": metrics.counter_value("UncachedCompile") or 0,
    "miss": metrics.counter_value("PersistentCacheMiss") or 0,
    "hit": metrics.counter_value("PersistentCacheHit") or 0,
}}))
"""


def _run(cache: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHILD.format(cache=cache))],
        capture_output=True,
        text=True,
        env={**os.environ, "XLA_USE_SPMD": "0"},
        timeout=240,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["stderr"] = r.stderr
    return out


def _eager() -> torch.Tensor:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(5, 8)
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    with torch.no_grad():
        return model(x)


def test_a_second_process_reads_every_graph_from_the_persistent_cache(tmp_path):
    cache = str(tmp_path / "cache")
    first = _run(cache)
    assert first["uncached"] >= 1
    # Every miss is a graph's (AdamW's state starts as uploaded zeros, not a program of its own).
    assert first["miss"] == first["uncached"] and first["hit"] == 0
    assert any(os.scandir(cache))
    second = _run(cache)
    # Not in this process's memory: each graph is a compile request, served from the disk.
    assert second["uncached"] == first["uncached"]
    assert second["miss"] == 0 and second["hit"] == second["uncached"]
    # ... by each graph's key: none was lowered (traced to StableHLO) again, the trace-once
    # replay's graph too.
    assert first["lowered"] == first["uncached"] and second["lowered"] == 0
    assert os.listdir(os.path.join(cache, "lazyxla-exe"))
    ref = _eager()
    torch.testing.assert_close(torch.tensor(first["out"]), ref, rtol=1e-5, atol=1e-6)
    assert second["out"] == first["out"] and second["compiled"] == first["compiled"]


def test_an_unreadable_index_entry_is_lowered_and_compiled_again(tmp_path):
    cache = str(tmp_path / "cache")
    first = _run(cache)
    index = os.path.join(cache, "lazyxla-exe")
    for name in os.listdir(index):
        with open(os.path.join(index, name), "r+b") as f:
            f.truncate(10)
    second = _run(cache)
    assert "executable index failed" in second["stderr"]
    # Lowered again, then found in JAX's own cache (keyed by the lowered program).
    assert second["lowered"] == second["uncached"] and second["miss"] == 0
    assert second["out"] == first["out"] and second["compiled"] == first["compiled"]


def _digest(fn, x: torch.Tensor) -> str | None:
    out = fn(x)  # (kept alive: its pending graph is the one captured)
    cap = graph.Capture(graph.pending_states(None))
    key = exe_cache.digest(cap)
    lazyxla.sync()
    del out
    return key


def test_the_disk_key_names_what_the_executable_depends_on(monkeypatch):
    dev = lazyxla.device()
    x = torch.randn(4, 4, device=dev)
    y = torch.randn(4, 4, device=dev)
    lazyxla.sync()
    base = _digest(lambda t: t.clamp(min=0.0).sum(0), x)
    assert base is not None
    assert _digest(lambda t: t.clamp(min=0.0).sum(0), y) == base  # new data: the same program
    others = [
        lambda t: t.clamp(min=-0.0).sum(0),  # a static's sign of zero
        lambda t: t.clamp(min=0.0).sum(1),  # a static int
        lambda t: t.clamp(max=0.0).sum(0),  # another argument
        lambda t: t.clamp(min=0.0).mean(0),  # another op
        lambda t: t.double().clamp(min=0.0).sum(0),  # another dtype
        lambda t: F.gelu(t, approximate="tanh"),
        lambda t: F.gelu(t),
    ]
    keys = {_digest(f, x) for f in others}
    assert None not in keys and len(keys) == len(others) and base not in keys
    # The flags and environment a program depends on are in the key; reporting ones are not.
    monkeypatch.setattr(FLAGS, "check_indices", True)
    assert _digest(lambda t: t.clamp(min=0.0).sum(0), x) != base
    monkeypatch.setattr(FLAGS, "check_indices", False)
    monkeypatch.setenv(
        "XLA_FLAGS", os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_fast_math=false"
    )
    assert _digest(lambda t: t.clamp(min=0.0).sum(0), x) != base
    monkeypatch.undo()
    monkeypatch.setattr(FLAGS, "metrics_file", "/tmp/elsewhere.txt")
    monkeypatch.setenv("PT_XLA_DEBUG_LEVEL", "0")
    assert _digest(lambda t: t.clamp(min=0.0).sum(0), x) == base


def test_graphs_whose_key_cannot_be_written_out_are_left_to_jax():
    dev = lazyxla.device()
    x = torch.randn(4, 4, device=dev)
    lazyxla.sync()

    def barrier(t: torch.Tensor) -> torch.Tensor:  # a node outside the written-out ops
        u = t + 1
        xm.optimization_barrier_([u])
        return u

    assert _digest(barrier, x) is None
    f = torch.compile(lambda a: a.sin() + 1, backend="lazyxla", options={"sync": False})
    assert _digest(f, x) is not None  # a trace-once replay's nested graph is written out
    q = torch.randn(2, 2, 8, 4, device=dev)
    lazyxla.sync()
    attention = _digest(lambda t: F.scaled_dot_product_attention(t, t, t, is_causal=True), q)
    assert attention is not None  # lazyxla's own ops (flash attention) are written out
