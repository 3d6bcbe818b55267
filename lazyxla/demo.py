"""`python -m lazyxla.demo`: train a small transformer on lazyxla's device, show what lazyxla did.

The model (`lazyxla.models.Decoder`) is plain PyTorch. The training loop is the ordinary one plus
a single `lazyxla.sync()` per step: every op before it is only recorded; the sync compiles the
recorded graph with `jax.jit` once, and every later step, whose graph is the same with new data,
reuses the executable from the cache.

The task is copying: each sequence is 16 random tokens followed by the same 16 tokens again. The
first half cannot be predicted; the second half can, by attending 16 positions back, so the loss,
measured on the second half only, falls from ln(vocab) towards 0.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from rich.console import Console
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

import lazyxla
from lazyxla.debug import metrics
from lazyxla.models import Decoder, DecoderConfig

IGNORE = -100  # cross_entropy's default ignore_index: the unpredictable first half

CONFIG = DecoderConfig(
    vocab_size=64,
    dim=128,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    max_seq_len=32,
    rope=True,
    tie_embeddings=True,
)


def copy_batch(
    batch_size: int, seq_len: int, vocab: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs `[a, a]` (a: seq_len/2 random tokens) and next-token targets, first half ignored."""
    half = seq_len // 2
    a = torch.randint(0, vocab, (batch_size, half), generator=gen)
    seq = torch.cat([a, a, a[:, :1]], dim=1)  # one extra token: the target of the last position
    inputs, targets = seq[:, :-1], seq[:, 1:].clone()
    targets[:, : half - 1] = IGNORE
    return inputs, targets


def _ns(name: str) -> float:
    data = metrics.metric_data(name)
    return data.accumulator if data is not None else 0.0


def _fmt_s(ns: float) -> str:
    return f"{ns / 1e9:.2f} s" if ns >= 1e8 else f"{ns / 1e6:.1f} ms"


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss [cyan]{task.fields[loss]:.4f}"),
        TextColumn("step [magenta]{task.fields[step_ms]:7.1f} ms"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
    )


def train(steps: int, batch_size: int, lr: float, seed: int, console: Console) -> dict:
    """Train `Decoder(CONFIG)` on the copy task on `lazyxla.device()`; return what happened."""
    device = lazyxla.device()
    torch.manual_seed(seed)
    model = Decoder(CONFIG).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed + 1)
    metrics.clear_all()

    losses: list[float] = []
    step_times: list[float] = []
    compile_steps: list[int] = []
    with _progress(console) as progress:
        task = progress.add_task(
            "train", total=steps, loss=math.log(CONFIG.vocab_size), step_ms=0.0
        )
        for step in range(steps):
            t0 = time.perf_counter()
            compiled = metrics.counter_value("UncachedCompile") or 0
            x, y = copy_batch(batch_size, CONFIG.max_seq_len, CONFIG.vocab_size, gen)
            opt.zero_grad()
            loss = model.loss(x.to(device), y.to(device))  # recorded, not run
            loss.backward()
            opt.step()
            lazyxla.sync()  # compile (first steps) or fetch from the cache, then run
            losses.append(loss.item())  # waits for this step's result
            step_times.append(time.perf_counter() - t0)
            if (metrics.counter_value("UncachedCompile") or 0) > compiled:
                compile_steps.append(step)
            progress.update(task, advance=1, loss=losses[-1], step_ms=step_times[-1] * 1e3)

    # Evaluate: greedy predictions on fresh sequences, second half only (one more graph).
    with torch.no_grad():
        x, y = copy_batch(256, CONFIG.max_seq_len, CONFIG.vocab_size, gen)
        pred = model(x.to(device)).argmax(dim=-1).cpu()
    keep = y != IGNORE
    accuracy = (pred[keep] == y[keep]).float().mean().item()
    return {
        "model": model,
        "losses": losses,
        "step_times": step_times,
        "compile_steps": compile_steps,
        "accuracy": accuracy,
    }


def summarize(run: dict, steps: int, batch_size: int, console: Console) -> None:
    """Print what lazyxla did: compiles, cache hits, times, graph size and the loss curve."""
    losses, times = run["losses"], run["step_times"]
    uncached = metrics.counter_value("UncachedCompile") or 0
    cached = metrics.counter_value("CachedCompile") or 0
    graph = metrics.metric_data("TensorsGraphSize")
    graph_nodes = int(max(v for _, v in graph.samples)) if graph is not None else 0
    compile_ns, execute_ns = _ns("CompileTime"), _ns("ExecuteTime")
    tracing_ns = _ns("LazyTracing")
    fallbacks = metrics.cpu_fallback_ops()
    warm = sorted(times[len(run["compile_steps"]) + 1 :]) or sorted(times)
    median_ms = warm[len(warm) // 2] * 1e3
    train_compiles = len(run["compile_steps"])

    table = Table(title="What lazyxla did", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column(style="dim")
    table.add_row("training steps", str(steps), f"batch {batch_size}, AdamW")
    table.add_row(
        "graphs compiled (UncachedCompile)",
        str(uncached),
        f"training: {train_compiles} at step(s) {', '.join(map(str, run['compile_steps']))}; "
        f"eval: {uncached - train_compiles}",
    )
    table.add_row("cache hits (CachedCompile)", str(cached), "steps that reused an executable")
    table.add_row("CompileTime total", _fmt_s(compile_ns), "jax.jit lower + compile")
    table.add_row(
        "ExecuteTime total", _fmt_s(execute_ns), "running the executables (launch to done)"
    )
    table.add_row("LazyTracing total", _fmt_s(tracing_ns), "recording aten ops into the IR")
    table.add_row("largest graph", f"{graph_nodes} nodes", "forward + backward + AdamW, one step")
    table.add_row("median step (warm)", f"{median_ms:.1f} ms", "record + sync + read the loss")
    table.add_row("CPU fallbacks", str(len(fallbacks)), ", ".join(fallbacks) or "none")
    console.print(table)

    n = max(1, len(losses) // 10)
    start, end = sum(losses[:n]) / n, sum(losses[-n:]) / n
    marks = [losses[min(len(losses) - 1, i * (len(losses) - 1) // 8)] for i in range(9)]
    curve = " → ".join(f"{v:.3f}" for v in marks)
    console.print(
        Panel(
            f"loss on the copied half (chance: ln {CONFIG.vocab_size} = "
            f"{math.log(CONFIG.vocab_size):.3f}): "
            f"[cyan]{start:.3f}[/] → [cyan]{end:.3f}[/]  (mean of first / last {n} steps)\n"
            f"curve: {curve}\n"
            f"copy accuracy on 256 fresh sequences: [green]{run['accuracy']:.1%}[/]",
            title="Learning",
            title_align="left",
        )
    )
    why = (
        "the first step's (AdamW has no state yet) and the steady-state one"
        if run["compile_steps"] == [0, 1]
        else f"at steps {', '.join(map(str, run['compile_steps']))}"
    )
    console.print(
        f"[bold]{steps}[/] steps of ordinary PyTorch ran as [bold]{train_compiles}[/] compiled "
        f"graph(s), {why}; the other {steps - train_compiles} steps reused them from the cache. "
        "See [italic]lazyxla.debug.metrics.short_metrics_report()[/] for the raw counters."
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m lazyxla.demo`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    console = Console()
    model_params = sum(p.numel() for p in Decoder(CONFIG).parameters())
    console.print(
        Panel(
            f"Decoder: {CONFIG.n_layers} layers, dim {CONFIG.dim}, {CONFIG.n_heads} heads / "
            f"{CONFIG.n_kv_heads} kv heads (GQA), RoPE, SwiGLU, RMSNorm, tied embeddings, "
            f"{model_params / 1e3:.0f}k parameters\n"
            f"device: {lazyxla.device()} → {', '.join(lazyxla.real_devices())} (JAX)\n"
            f"task: copy. sequences of {CONFIG.max_seq_len // 2} random tokens, repeated once",
            title="lazyxla demo",
            title_align="left",
        )
    )
    run = train(args.steps, args.batch_size, args.lr, args.seed, console)
    summarize(run, args.steps, args.batch_size, console)


if __name__ == "__main__":
    main()
