"""Per-step training time: eager, torch.compile (inductor), lazyxla, and lazyxla's limit.

Two models: the `MLP` (4 x Linear(512, 512), batch 64, SGD) and the demo's `Decoder` (batch 32,
AdamW). A step is `zero_grad; loss; backward; optimizer.step`, on data resident on the device.

- eager: PyTorch on the CPU.
- torch.compile: the whole step function compiled with inductor (dynamo splits it at `backward`).
- lazyxla: record the step, `lazyxla.sync(wait=True)`: tracing + cache lookup + execution.
- limit: the cached jitted executable of that step's graph, called directly on the same inputs
  (`exe(cap.data, cap.scalars)`), i.e. lazyxla with zero tracing and zero bookkeeping.

Each figure is the median over timed steps, after warm-up (which includes every compile).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import jax
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

import lazyxla
from lazyxla._src import graph
from lazyxla.debug import metrics
from lazyxla.demo import CONFIG as DECODER_CONFIG
from lazyxla.demo import copy_batch
from lazyxla.models import MLP, Decoder

Step = Callable[[], torch.Tensor]


def _median_ms(fn: Callable[[], object], warmup: int, steps: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


class Workload:
    """A model, its optimizer and one batch, on a device, with a `step()` closure."""

    def __init__(self, name: str, make_model, make_opt, batch, loss_fn, device) -> None:
        self.name = name
        torch.manual_seed(0)
        self.model = make_model().to(device)
        self.opt = make_opt(self.model.parameters())
        self.batch = tuple(t.to(device) for t in batch)
        self.loss_fn = loss_fn

    def step(self) -> torch.Tensor:
        """One training step; returns the (detached) loss."""
        self.opt.zero_grad()
        loss = self.loss_fn(self.model, *self.batch)
        loss.backward()
        self.opt.step()
        return loss.detach()


def workloads() -> dict[str, dict]:
    """The two benchmark workloads, as constructors for `Workload`."""
    gen = torch.Generator().manual_seed(0)
    mlp_batch = (torch.randn(64, 512, generator=gen), torch.randn(64, 512, generator=gen))
    dec_batch = copy_batch(32, DECODER_CONFIG.max_seq_len, DECODER_CONFIG.vocab_size, gen)
    return {
        "MLP 4x512, batch 64, SGD": dict(
            make_model=MLP,
            make_opt=lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
            batch=mlp_batch,
            loss_fn=lambda m, x, y: F.mse_loss(m(x), y),
        ),
        "Decoder (demo), batch 32, AdamW": dict(
            make_model=lambda: Decoder(DECODER_CONFIG),
            make_opt=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
            batch=dec_batch,
            loss_fn=lambda m, x, y: m.loss(x, y),
        ),
    }


def bench_eager(spec: dict, warmup: int, steps: int) -> float:
    """Median ms per eager CPU step."""
    w = Workload("eager", device="cpu", **spec)
    return _median_ms(w.step, warmup, steps)


def bench_inductor(spec: dict, warmup: int, steps: int) -> float:
    """Median ms per step of the step function compiled by torch.compile (inductor)."""
    w = Workload("inductor", device="cpu", **spec)
    step = torch.compile(w.step, backend="inductor")
    return _median_ms(step, warmup, steps)


def bench_lazyxla(spec: dict, warmup: int, steps: int) -> tuple[float, float, int]:
    """`(lazyxla ms/step, limit ms/step, compiles)`: record + sync + wait vs the bare executable."""
    w = Workload("lazyxla", device=lazyxla.device(), **spec)
    before = metrics.counter_value("UncachedCompile") or 0

    def step() -> None:
        w.step()
        lazyxla.sync(wait=True)

    lazy_ms = _median_ms(step, warmup, steps)
    compiles = (metrics.counter_value("UncachedCompile") or 0) - before

    # The limit: record one more step, capture its pending graph, and call the cached executable.
    w.step()
    cap = graph.Capture(graph.pending_states(None))
    exe = graph.compile_capture(cap)  # a cache hit: the same graph ran above
    limit_ms = _median_ms(lambda: jax.block_until_ready(exe(cap.data, cap.scalars)), warmup, steps)
    lazyxla.sync(wait=True)
    return lazy_ms, limit_ms, compiles


def main(argv: list[str] | None = None) -> None:
    """Run every workload in every mode and print one table per workload."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    args = parser.parse_args(argv)
    console = Console()

    for name, spec in workloads().items():
        rows: list[tuple[str, float | None, str]] = []
        with console.status(f"{name}: eager"):
            eager = bench_eager(spec, args.warmup, args.steps)
        rows.append(("eager (CPU)", eager, ""))
        if not args.no_inductor:
            with console.status(f"{name}: torch.compile (inductor)"):
                t0 = time.perf_counter()
                ind = bench_inductor(spec, args.warmup, args.steps)
                ind_compile = time.perf_counter() - t0
            rows.append(
                ("torch.compile (inductor)", ind, f"warm-up incl. compile {ind_compile:.0f} s")
            )
        with console.status(f"{name}: lazyxla"):
            lazy, limit, compiles = bench_lazyxla(spec, args.warmup, args.steps)
        rows.append(("lazyxla (record + sync + wait)", lazy, f"{compiles} graph(s) compiled"))
        rows.append(("limit (cached executable alone)", limit, "exe(cap.data, cap.scalars)"))

        table = Table(title=f"{name}: median of {args.steps} steps after {args.warmup} warm-up")
        table.add_column("mode")
        table.add_column("ms / step", justify="right")
        table.add_column("vs eager", justify="right")
        table.add_column("note", style="dim")
        for mode, ms, note in rows:
            table.add_row(mode, f"{ms:.2f}", f"{ms / eager:.2f}x", note)
        console.print(table)
        console.print(
            f"lazyxla / limit: [bold]{lazy / limit:.2f}x[/] "
            f"(lazyxla spends {lazy - limit:.2f} ms per step outside the executable)\n"
        )


if __name__ == "__main__":
    main()
