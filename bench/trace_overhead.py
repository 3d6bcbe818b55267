"""Tracing overhead: µs per recorded op on lazyxla beside µs per op in eager on the CPU.

A chain of 1000 elementwise ops on a (128, 128) float32 tensor. On lazyxla the timed region only
records the ops into the IR (no sync; the sync that follows each repetition is not timed). Eager
runs the same chain on the CPU. Medians over repetitions, after warm-up.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table

import lazyxla

N_OPS = 1000
SHAPE = (128, 128)
WARMUP = 2
REPEATS = 7

# One cycle of ops, each (128, 128) → (128, 128); values stay bounded over the chain.
CYCLE: list[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = [
    lambda y, x: y + x,
    lambda y, x: y * 0.5,
    lambda y, x: torch.sin(y),
    lambda y, x: y - x,
    lambda y, x: torch.tanh(y),
    lambda y, x: y * x,
    lambda y, x: torch.relu(y),
    lambda y, x: y + 1.0,
]


def chain(x: torch.Tensor, n_ops: int = N_OPS) -> torch.Tensor:
    """Apply `n_ops` elementwise ops to `x`, cycling through `CYCLE`."""
    y = x
    for i in range(n_ops):
        y = CYCLE[i % len(CYCLE)](y, x)
    return y


def time_chain(x: torch.Tensor, after: Callable[[torch.Tensor], None]) -> list[float]:
    """Seconds per chain for each timed repetition; `after(y)` runs untimed after each one."""
    times = []
    for i in range(WARMUP + REPEATS):
        t0 = time.perf_counter()
        y = chain(x)
        dt = time.perf_counter() - t0
        after(y)
        if i >= WARMUP:
            times.append(dt)
    return times


def main() -> None:
    """Measure and print the table."""
    torch.manual_seed(0)
    x_cpu = torch.randn(SHAPE)
    x_dev = x_cpu.to(lazyxla.device())
    lazyxla.sync()

    eager = statistics.median(time_chain(x_cpu, lambda y: None))
    lazy = statistics.median(time_chain(x_dev, lambda y: lazyxla.sync(wait=True)))

    eager_us, lazy_us = eager / N_OPS * 1e6, lazy / N_OPS * 1e6
    table = Table(
        title=f"{N_OPS}-op elementwise chain on a {SHAPE} float32 tensor (median of {REPEATS})"
    )
    table.add_column("backend")
    table.add_column("µs / op", justify="right")
    table.add_column("ms / chain", justify="right")
    table.add_column("vs eager", justify="right")
    table.add_row("eager CPU (runs the op)", f"{eager_us:.1f}", f"{eager * 1e3:.1f}", "1.00x")
    table.add_row(
        "lazyxla (records the op)",
        f"{lazy_us:.1f}",
        f"{lazy * 1e3:.1f}",
        f"{lazy_us / eager_us:.2f}x",
    )
    console = Console()
    console.print(table)
    console.print(f"lazyxla / eager per op: [bold]{lazy_us / eager_us:.2f}x[/]")


if __name__ == "__main__":
    main()
