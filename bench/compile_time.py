"""Compile time: the first training step of the demo decoder and of a 16-layer decoder, and the
same first step in a fresh process whose persistent compilation cache is warm.

Each figure comes from a fresh process (`--child`), so nothing is cached in memory: one run with
an empty cache directory (`xr.initialize_cache(dir)`: XLA compiles, and the executables are
written to the directory), then one with the directory that run filled (the executables are read
from disk). Per run: the wall time of the first two steps (record + compile + execute; AdamW's
first step creates its state, and is the same graph as the second: Note [A state's first value is
data]), the time spent compiling or loading
them (`CompileTime`), and torch_xla's counters `UncachedCompile` (compiles that missed the
in-memory cache), `PersistentCacheMiss` / `PersistentCacheHit`. A steady step (min of 3, all
cached) shows what the first steps cost beyond compiling. The machine is shared: wall times move
with its load.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

MODELS = {"demo decoder (2 layers)": 2, "decoder, 16 layers": 16}  # dim 128, batch 32x32, AdamW


def child(layers: int, cache: str) -> None:
    """Run two training steps in this fresh process and print the figures as JSON."""
    import torch
    import torch.nn.functional as F

    import lazyxla
    import lazyxla.runtime as xr
    from lazyxla.debug import metrics
    from lazyxla.models import Decoder, DecoderConfig

    xr.initialize_cache(cache)
    dev = lazyxla.device()
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=64, dim=128, n_layers=layers, max_seq_len=32)
    model = Decoder(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 64, (32, 32)).to(dev)
    lazyxla.sync(wait=True)

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, 64), x.reshape(-1))
        loss.backward()
        opt.step()
        lazyxla.sync(wait=True)
        return time.perf_counter() - t0

    metrics.clear_all()
    # AdamW's first step creates its state; the first two steps are one graph, compiled (or
    # loaded) once.
    first = step() + step()
    compile_s = (metrics.metric_data("CompileTime") or (0, 0.0, []))[1] / 1e9

    def counter(name: str) -> int:
        return metrics.counter_value(name) or 0

    out = {
        "first_s": first,
        "compile_s": compile_s,
        "uncached": counter("UncachedCompile"),
        "miss": counter("PersistentCacheMiss"),
        "hit": counter("PersistentCacheHit"),
        "steady_s": min(step() for _ in range(3)),
    }
    print(json.dumps(out))


def run_child(layers: int, cache: str) -> dict:
    cmd = [sys.executable, __file__, "--child", str(layers), "--cache", cache]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"child failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.cache)
        return
    table = Table(title="First two training steps in a fresh process (seconds)")
    for col in ("model", "cache", "steps 1+2", "CompileTime", "steady step", "counters"):
        table.add_column(col, justify="left" if col in ("model", "cache", "counters") else "right")
    for name, layers in MODELS.items():
        with tempfile.TemporaryDirectory() as cache:
            for label in ("empty (compiles)", "warm (from disk)"):
                r = run_child(layers, cache)
                table.add_row(
                    name,
                    label,
                    f"{r['first_s']:.2f}",
                    f"{r['compile_s']:.2f}",
                    f"{r['steady_s']:.3f}",
                    f"Uncached={r['uncached']} Miss={r['miss']} Hit={r['hit']}",
                )
    Console(width=150).print(table)
    print("counters: UncachedCompile, PersistentCacheMiss, PersistentCacheHit")


if __name__ == "__main__":
    main()
