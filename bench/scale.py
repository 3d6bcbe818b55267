"""Cost as the model grows: the demo decoder (dim 128, batch 32 x 32, AdamW) at 2/8/16/32 layers.

For each depth, per training step: IR nodes (`TensorsGraphSize`), lazy step time beside eager's,
tracing time (forward, backward and AdamW recorded; no sync) per node, and the share of the step
that Python's cyclic garbage collector takes (measured with `gc.callbacks`), beside the step time
with `gc.disable()`. The tracing time of the first and of the last timed steps shows whether the
per-step cost stays flat in the number of steps already run. Tracing and collector times are the
main thread's CPU time (`time.thread_time`), which a shared machine's load disturbs far less than
wall time; step times are wall time (the executable runs on other threads).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

import lazyxla
from lazyxla.debug import metrics
from lazyxla.models import Decoder, DecoderConfig

BATCH, SEQ, VOCAB = 32, 32, 64


class GcTimer:
    """Wall time spent in the cyclic collector, summed over collections (gc.callbacks)."""

    def __init__(self) -> None:
        self.ns = 0
        self.collections = 0
        self._t0 = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.thread_time_ns()
        else:
            self.ns += time.thread_time_ns() - self._t0
            self.collections += 1

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def make(layers: int, device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=VOCAB, dim=128, n_layers=layers, max_seq_len=SEQ)
    model = Decoder(cfg).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def batch(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return x.to(device), x.roll(-1, 1).to(device)


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x, y) -> None:
    opt.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()


def eager_ms(layers: int, steps: int) -> float:
    model, opt = make(layers, "cpu")
    x, y = batch("cpu")
    step(model, opt, x, y)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(model, opt, x, y)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def lazy_run(layers: int, steps: int, disable_gc: bool) -> dict:
    dev = lazyxla.device()
    model, opt = make(layers, dev)
    x, y = batch(dev)
    for _ in range(3):  # compiles: the first step has no optimizer state yet
        step(model, opt, x, y)
        lazyxla.sync(wait=True)
    metrics.clear_all()
    trace, total = [], []
    if disable_gc:
        gc.disable()
    try:
        with GcTimer() as gct:
            for _ in range(steps):
                t0, c0 = time.perf_counter(), time.thread_time()
                step(model, opt, x, y)
                c1 = time.thread_time()
                lazyxla.sync(wait=True)
                t2 = time.perf_counter()
                trace.append(c1 - c0)
                total.append(t2 - t0)
    finally:
        gc.enable()
    nodes = metrics.metric_data("TensorsGraphSize")
    n_nodes = nodes.samples[-1][1] if nodes and nodes.samples else float("nan")
    third = max(1, steps // 3)
    return {
        "nodes": n_nodes,
        "step_ms": statistics.median(total) * 1e3,
        "trace_ms": statistics.median(trace) * 1e3,
        "trace_first_ms": statistics.median(trace[:third]) * 1e3,
        "trace_last_ms": statistics.median(trace[-third:]) * 1e3,
        "gc_ms": gct.ns / 1e6 / steps,
        "gc_collections": gct.collections / steps,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", default="2,8,16,32")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads for eager (0: default)"
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    table = Table(title=f"demo decoder, dim 128, batch {BATCH}x{SEQ}, AdamW ({args.steps} steps)")
    for col in (
        "layers",
        "nodes/step",
        "eager ms",
        "lazy ms",
        "lazy/eager",
        "no-gc lazy ms",
        "trace cpu ms",
        "µs/node",
        "trace first→last third ms",
        "gc ms/step (share)",
        "collections/step",
    ):
        table.add_column(col, justify="right")
    for layers in [int(v) for v in args.layers.split(",")]:
        eager = eager_ms(layers, max(3, args.steps // 2))
        on = lazy_run(layers, args.steps, disable_gc=False)
        off = lazy_run(layers, args.steps, disable_gc=True)
        table.add_row(
            str(layers),
            f"{on['nodes']:.0f}",
            f"{eager:.1f}",
            f"{on['step_ms']:.1f}",
            f"{on['step_ms'] / eager:.2f}x",
            f"{off['step_ms']:.1f}",
            f"{on['trace_ms']:.1f}",
            f"{on['trace_ms'] * 1e3 / on['nodes']:.1f}",
            f"{on['trace_first_ms']:.1f} → {on['trace_last_ms']:.1f}",
            f"{on['gc_ms']:.1f} ({on['gc_ms'] / on['step_ms']:.0%})",
            f"{on['gc_collections']:.0f}",
        )
    Console(width=220).print(table)


if __name__ == "__main__":
    main()
