"""Trace once vs lazy: torch.compile(backend="lazyxla") against lazyxla's per-step tracing.

Per model and mode, the median time of one training step (or one inference call), side by side:
- eager (CPU) and torch.compile with inductor (CPU),
- lazyxla lazy: record every op each step, `sync(wait=True)`,
- lazyxla trace-once: the model through `torch.compile(backend="lazyxla")` (forward and backward
  replayed, each executed at once as torch_xla's bridge does), the optimizer recorded lazily, then
  `sync(wait=True)`; the same with `options={"sync": False}` (one fused graph per step); and that
  with `optimizer.step` compiled too (no per-step optimizer recording),
- trace-once async: the one-graph-plus-optimizer step with `sync()` not waiting, as a torch_xla
  training loop calls mark_step, so the next step's Python overlaps this step's execution; one
  wait every 10 steps (pytorch/xla's examples read the loss every 10 steps), timed per step,
- the limit: the cached jitted executable of that step called directly on the same inputs.
Ratios: trace-once / limit (target <= 1.10; the best mode that waits each step, and the async
one), trace-once over lazy (target >= 2x geomean), and the decoder training step via trace-once vs
eager (target <= 1.0).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))

import models as models_bench  # noqa: E402
from _timing import interleaved_ms, warm  # noqa: E402

import lazyxla  # noqa: E402
from lazyxla._src import graph  # noqa: E402
from lazyxla._src.tensor import read, state  # noqa: E402
from lazyxla.demo import CONFIG as DECODER_CONFIG  # noqa: E402
from lazyxla.demo import copy_batch  # noqa: E402
from lazyxla.models import MLP, Decoder  # noqa: E402


def _hf(make: Callable[[], torch.nn.Module]) -> dict:
    b = models_bench._text_batch(torch.Generator().manual_seed(0), mlm=False)
    return dict(
        make=make,
        opt=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        batch=(b["input_ids"], b["attention_mask"], b["labels"]),
        loss=lambda m, i, a, y: m(input_ids=i, attention_mask=a, labels=y).loss,
        train=True,
    )


def _workloads() -> dict[str, dict]:
    gen = torch.Generator().manual_seed(0)
    mlp_batch = (torch.randn(64, 512, generator=gen), torch.randn(64, 512, generator=gen))
    dec_batch = copy_batch(32, DECODER_CONFIG.max_seq_len, DECODER_CONFIG.vocab_size, gen)
    return {
        "MLP train": dict(
            make=MLP,
            opt=lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
            batch=mlp_batch,
            loss=lambda m, x, y: F.mse_loss(m(x), y),
            train=True,
        ),
        "Decoder train": dict(
            make=lambda: Decoder(DECODER_CONFIG),
            opt=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
            batch=dec_batch,
            loss=lambda m, x, y: m.loss(x, y),
            train=True,
        ),
        "Llama train (transformers)": _hf(models_bench._llama),
        "GPT-2 train (transformers)": _hf(models_bench._gpt2),
        "Decoder inference": dict(
            make=lambda: Decoder(DECODER_CONFIG),
            opt=None,
            batch=dec_batch[:1],
            loss=lambda m, x: m(x),
            train=False,
        ),
    }


def _to(model: torch.nn.Module, device: str | torch.device) -> torch.nn.Module:
    """`model.to(device)`, re-tying shared weights (moving to an XLA device unties them)."""
    model = model.to(device)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model


def _step_fn(
    spec: dict,
    device: str | torch.device,
    compile_backend: str | None,
    options=None,
    compile_optimizer: bool = False,
):
    torch.manual_seed(0)
    model = _to(spec["make"](), device)
    batch = tuple(t.to(device) for t in spec["batch"])

    def run(*b: torch.Tensor) -> torch.Tensor:
        return spec["loss"](model, *b)

    if compile_backend is not None:  # the whole loss computation, not just `forward`
        run = torch.compile(run, backend=compile_backend, options=options)
    lazy = device != "cpu"
    if not spec["train"]:
        model.eval()

        def infer() -> None:
            with torch.no_grad():
                out = run(*batch)
            if lazy:  # wait for this output (trace-once may have dispatched it already)
                graph.sync_states([state(out)], wait=True)
                jax.block_until_ready(read(state(out))[0].data)

        return infer
    opt = spec["opt"](model.parameters())
    opt_step = opt.step
    if compile_optimizer:  # dynamo captures optimizer.step too: no per-step foreach recording
        opt_step = torch.compile(opt.step, backend=compile_backend, options=options)

    def step(wait: bool = True) -> None:
        opt.zero_grad()
        loss = run(*batch)
        loss.backward()
        opt_step()
        if lazy:
            lazyxla.sync(wait=wait)

    return step


ASYNC = "trace-once async (one graph + optimizer)"
ASYNC_STEPS = 10


def _async_steps(spec: dict, device: torch.device) -> Callable[[], None]:
    """ASYNC_STEPS - 1 steps that do not wait, then one that waits (each step reads the
    parameters the step before wrote, so waiting for the last waits for all), timed together and
    reported per step. (A `sync(wait=True)` with nothing pending returns at once.)"""
    step = _step_fn(spec, device, "lazyxla", {"sync": False}, compile_optimizer=True)

    def steps() -> None:
        for _ in range(ASYNC_STEPS - 1):
            step(wait=False)
        step()

    return steps


def _lazy_limit(spec: dict) -> Callable[[], None]:
    """Record one step without syncing and keep its (cached) executable."""
    torch.manual_seed(0)
    dev = lazyxla.device()
    model = _to(spec["make"](), dev)
    batch = tuple(t.to(dev) for t in spec["batch"])
    run = torch.compile(
        lambda *b: spec["loss"](model, *b), backend="lazyxla", options={"sync": False}
    )
    keep: list[torch.Tensor] = []  # the output stays alive, so it is a root of the graph
    if spec["train"]:
        opt = spec["opt"](model.parameters())

        def record() -> None:
            opt.zero_grad()
            run(*batch).backward()
            opt.step()
    else:
        model.eval()

        def record() -> None:
            keep.clear()
            with torch.no_grad():
                keep.append(run(*batch))

    for _ in range(3):
        record()
        lazyxla.sync(wait=True)
    record()
    cap = graph.Capture(graph.pending_states(None))
    exe = graph.compile_capture(cap)
    scalars = cap.args()[-1]  # as an execution passes them (Note [Scalars seen again])
    lazyxla.sync(wait=True)
    return lambda: jax.block_until_ready(exe(cap.data, scalars))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=4)
    parser.add_argument("--no-inductor", action="store_true")
    args = parser.parse_args(argv)
    console = Console()
    dev = lazyxla.device()
    over_lazy, rows = [], []
    for name, spec in _workloads().items():
        # Each workload compiles the same `run` code object again (3 trace-once modes): without a
        # reset, the fifth workload passes dynamo's recompile limit and silently runs uncompiled.
        torch._dynamo.reset()
        modes: dict[str, Callable[[], object]] = {
            "eager": _step_fn(spec, "cpu", None),
        }
        if not args.no_inductor:
            modes["inductor"] = _step_fn(spec, "cpu", "inductor")
        modes["lazyxla lazy"] = _step_fn(spec, dev, None)
        modes["trace-once"] = _step_fn(spec, dev, "lazyxla")
        modes["trace-once, one graph"] = _step_fn(spec, dev, "lazyxla", {"sync": False})
        if spec["train"]:
            modes["trace-once, one graph + optimizer"] = _step_fn(
                spec, dev, "lazyxla", {"sync": False}, compile_optimizer=True
            )
            modes[ASYNC] = _async_steps(spec, dev)
        with console.status(f"{name}: warm-up (compiles)"):
            for fn in modes.values():
                warm(fn, args.warmup)
            modes["limit"] = _lazy_limit(spec)
            warm(modes["limit"], 2)
        with console.status(f"{name}: timing"):
            ms = interleaved_ms(modes, args.rounds, args.per_round)
        if ASYNC in ms:
            ms[ASYNC] /= ASYNC_STEPS
        table = Table(title=f"{name}: median ms per step")
        for col in ("mode", "ms", "vs eager", "vs limit"):
            table.add_column(col, justify="right" if col != "mode" else "left")
        for mode, v in ms.items():
            table.add_row(mode, f"{v:.2f}", f"{v / ms['eager']:.2f}x", f"{v / ms['limit']:.2f}x")
        console.print(table)
        best = min(v for k, v in ms.items() if k.startswith("trace-once") and k != ASYNC)
        over_lazy.append(ms["lazyxla lazy"] / best)
        async_ratio = f"{ms[ASYNC] / ms['limit']:.2f}x" if ASYNC in ms else "-"
        rows.append(
            (name, best / ms["limit"], async_ratio, ms["lazyxla lazy"] / best, best / ms["eager"])
        )
    summary = Table(title="trace-once summary (best trace-once mode that waits each step)")
    for col in (
        "workload",
        "trace-once / limit",
        "async / limit",
        "lazy / trace-once",
        "trace-once / eager",
    ):
        summary.add_column(col, justify="right")
    for name, a, asy, b, c in rows:
        summary.add_row(name, f"{a:.2f}x", asy, f"{b:.2f}x", f"{c:.2f}x")
    console.print(summary)
    geo = math.exp(statistics.fmean(math.log(x) for x in over_lazy))
    console.print(f"trace-once over lazy, geomean: [bold]{geo:.2f}x[/]")


if __name__ == "__main__":
    main()
