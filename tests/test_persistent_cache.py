"""The persistent compilation cache (`xr.initialize_cache`) across processes, as pytorch/xla's
test/test_persistent_cache.py checks it: a first process compiles and writes the cache
(`PersistentCacheMiss`), a second one reads the same graphs from it (`PersistentCacheHit`, no
miss), and both compute eager's values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch

_CHILD = """
import json, torch, torch.nn.functional as F, lazyxla, lazyxla.runtime as xr
from lazyxla.debug import metrics
xr.initialize_cache({cache!r})
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
model.to(lazyxla.device())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(5, 8).to(lazyxla.device())
for _ in range(3):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    lazyxla.sync()
out = model(x).cpu()
print(json.dumps({{
    "out": out.tolist(),
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
    return json.loads(r.stdout.strip().splitlines()[-1])


def _eager() -> torch.Tensor:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
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
    assert first["miss"] >= first["uncached"] and first["hit"] == 0
    assert any(os.scandir(cache))
    second = _run(cache)
    # Not in this process's memory: each graph is a compile request, served from the disk.
    assert second["uncached"] == first["uncached"]
    assert second["miss"] == 0 and second["hit"] >= second["uncached"]
    ref = _eager()
    torch.testing.assert_close(torch.tensor(first["out"]), ref, rtol=1e-5, atol=1e-6)
    assert second["out"] == first["out"]
