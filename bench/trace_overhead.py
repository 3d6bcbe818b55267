"""Tracing overhead: µs per recorded op on lazyxla beside µs per op in eager on the CPU.

Two chains of 1000 elementwise ops on a (128, 128) float32 tensor: a mixed one (sin, tanh, relu
and arithmetic; eager spends most of its time computing the transcendental functions, which
flatters the ratio) and the cheap one of issue 14, `y * 1.0001 + 0.5` (tensor-scalar ops, where
eager's own cost is smallest), with its tensor-tensor form `y * s + b` beside it (the per-op
target covers both; a Python scalar costs PyTorch's C++ a wrapped-number tensor). On lazyxla the
timed region only records the ops into the IR (no sync; the sync that follows each repetition is
not timed). Eager runs the same chain on the CPU. The cheap chains are timed in interleaved
rounds (lazy, eager, lazy, ...) and report the minimum of each, the figure least disturbed by a
shared machine's load; so are view ops (transpose, select, view, slice of a (128, 128) tensor),
whose eager cost is only the new tensor's metadata. Last, host-to-device uploads (`.to(device)`)
of three sizes beside `jax.device_put` of the same array and an eager host copy (`clone`), in
interleaved rounds (Note [Uploads to one device]). jax.device_put on the CPU aliases an aligned
numpy buffer (a torch tensor's is) instead of copying it; lazyxla copies first, since the host
tensor stays writable, so a large upload costs it one host copy more.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax
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


def cheap_chain(x: torch.Tensor, n_ops: int = N_OPS) -> torch.Tensor:
    """`n_ops` ops of `y * 1.0001 + 0.5` (half multiplies, half adds): tensor-scalar."""
    y = x
    for _ in range(n_ops // 2):
        y = y * 1.0001 + 0.5
    return y


def cheap_tensor_chain(x: torch.Tensor, n_ops: int = N_OPS) -> torch.Tensor:
    """`n_ops` ops of `y * s + b`, `s` and `b` tensors of `x`'s shape: tensor-tensor."""
    s, b = torch.full_like(x, 1.0001), torch.full_like(x, 0.5)
    y = x
    for _ in range(n_ops // 2):
        y = y * s + b
    return y


def chain_us(
    fn: Callable[[torch.Tensor], object],
    x_cpu: torch.Tensor,
    x_dev: torch.Tensor,
    rounds: int = 15,
) -> tuple:
    """Minimum µs per op of `fn` (`N_OPS` ops) on lazyxla and in eager, in interleaved rounds."""
    lazy, eager = [], []
    for i in range(rounds + WARMUP):
        t0 = time.perf_counter()
        y = fn(x_dev)
        dt = time.perf_counter() - t0
        lazyxla.sync(wait=True)
        del y
        t0 = time.perf_counter()
        fn(x_cpu)
        de = time.perf_counter() - t0
        if i >= WARMUP:
            lazy.append(dt)
            eager.append(de)
    return min(lazy) / N_OPS * 1e6, min(eager) / N_OPS * 1e6


def view_ops(x: torch.Tensor, n_ops: int = N_OPS) -> None:
    """`n_ops` view ops on `x` (transpose, select, view, slice), each result dropped."""
    for _ in range(n_ops // 4):
        x.t()
        x[3]
        x.view(-1)
        x[:, 2:5]


def upload_us(host: torch.Tensor, rounds: int = 200) -> tuple[float, float, float]:
    """Minimum µs of `.to(device)` on lazyxla, of `jax.device_put` of the same values, and of an
    eager host copy (`clone`), in interleaved rounds."""
    dev = lazyxla.device()
    arr, jdev = host.numpy(), jax.devices()[0]
    fns = (
        lambda: host.to(dev),
        lambda: jax.block_until_ready(jax.device_put(arr, jdev)),
        lambda: host.clone(),
    )
    best = [float("inf")] * 3
    for i in range(rounds + 20):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if i >= 20:
                best[k] = min(best[k], dt)
    return best[0] * 1e6, best[1] * 1e6, best[2] * 1e6


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
    for what, fn in (
        ("cheap chain `y * 1.0001 + 0.5`", cheap_chain),
        ("tensor-tensor chain `y * s + b`", cheap_tensor_chain),
    ):
        lazy_c, eager_c = chain_us(fn, x_cpu, x_dev)
        console.print(
            f"{what} ({N_OPS} ops, min of interleaved rounds): lazyxla "
            f"[bold]{lazy_c:.1f} µs/op[/], eager {eager_c:.1f} µs/op, lazyxla / eager "
            f"[bold]{lazy_c / eager_c:.2f}x[/]"
        )
    lazy_v, eager_v = chain_us(view_ops, x_cpu, x_dev)
    console.print(
        f"view ops `x.t(), x[3], x.view(-1), x[:, 2:5]` ({N_OPS} ops, min of interleaved "
        f"rounds): lazyxla [bold]{lazy_v:.1f} µs/op[/], eager {eager_v:.1f} µs/op"
    )
    uploads = Table(title="host -> device upload, float32 (µs, min of interleaved rounds)")
    for col in ("shape", "lazyxla .to(device)", "jax.device_put", "eager clone", "vs device_put"):
        uploads.add_column(col, justify="right")
    for shape in ((31,), (64, 512), (1024, 1024)):
        lazy_u, jax_u, clone_u = upload_us(torch.randn(shape))
        uploads.add_row(
            str(shape), f"{lazy_u:.1f}", f"{jax_u:.1f}", f"{clone_u:.1f}", f"{lazy_u / jax_u:.2f}x"
        )
    console.print(uploads)


if __name__ == "__main__":
    main()
