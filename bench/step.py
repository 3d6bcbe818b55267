"""Per-step training time: eager, torch.compile (inductor), lazyxla, and lazyxla's limit.

Two models: the `MLP` (4 x Linear(512, 512), batch 64, SGD) and the demo's `Decoder` (batch 32,
AdamW). A step is `zero_grad; loss; backward; optimizer.step`, on data resident on the device.

- eager: PyTorch on the CPU.
- torch.compile: the whole step function compiled with inductor (dynamo splits it where it must).
- lazyxla: record the step, `lazyxla.sync(wait=True)`: tracing + cache lookup + execution.
- lazyxla async: the same, but `lazyxla.sync()` without waiting, as a torch_xla training loop
  calls mark_step: the next step is traced while this one executes; one wait every 10 steps, as
  pytorch/xla's examples (`examples/train_*_base.py`) read the loss every 10 steps.
- limit: the cached jitted executable of that step's graph, called directly on the same inputs
  (`exe(cap.data, cap.scalars)`), i.e. lazyxla with zero tracing and zero bookkeeping.

Each figure is the median over timed steps, after warm-up (which includes every compile). The
modes are timed in interleaved rounds, so that a change of load on a shared machine hits them all.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import jax
import torch
import torch.nn.functional as F
from _timing import interleaved_ms, warm
from rich.console import Console
from rich.table import Table

import lazyxla
from lazyxla._src import graph
from lazyxla._src.config import FLAGS
from lazyxla.debug import metrics
from lazyxla.demo import CONFIG as DECODER_CONFIG
from lazyxla.demo import copy_batch
from lazyxla.models import MLP, Decoder

Step = Callable[[], torch.Tensor]
ASYNC = "lazyxla (record + async sync)"
ASYNC_STEPS = 10  # steps per wait (pytorch/xla's examples log every 10 steps)


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


def prepare(spec: dict, warmup: int, inductor: bool) -> tuple[dict, dict]:
    """Warm up every mode of one workload; return `({mode: step fn}, {mode: note})`."""
    modes: dict[str, Callable[[], object]] = {}
    notes: dict[str, str] = {}

    eager = Workload("eager", device="cpu", **spec)
    modes["eager (CPU)"] = eager.step
    notes["eager (CPU)"] = ""
    warm(eager.step, warmup)

    if inductor:
        ind = Workload("inductor", device="cpu", **spec)
        compiled = torch.compile(ind.step, backend="inductor")
        modes["torch.compile (inductor)"] = compiled
        notes["torch.compile (inductor)"] = f"warm-up incl. compile {warm(compiled, warmup):.0f} s"

    lazy = Workload("lazyxla", device=lazyxla.device(), **spec)

    def lazy_step() -> None:
        lazy.step()
        lazyxla.sync(wait=True)

    before = metrics.counter_value("UncachedCompile") or 0
    warm_s = warm(lazy_step, warmup)
    compiles = (metrics.counter_value("UncachedCompile") or 0) - before
    modes["lazyxla (record + sync + wait)"] = lazy_step
    notes["lazyxla (record + sync + wait)"] = f"{compiles} compile(s) in warm-up ({warm_s:.0f} s)"

    # A training loop as torch_xla's examples write it: `sync()` (mark_step) returns once the
    # step is dispatched, so the next step's tracing overlaps this one's execution; the loss is
    # read every few steps. Timed over ASYNC_STEPS steps ending in a wait, per step.
    def lazy_async() -> None:
        for _ in range(ASYNC_STEPS - 1):
            lazy.step()
            lazyxla.sync()
        lazy_step()

    modes[ASYNC] = lazy_async
    notes[ASYNC] = f"per step, {ASYNC_STEPS} steps per wait"

    # The limit: record one more step, capture its pending graph (the same graph as every warm
    # step, so the executable comes from the cache), then finish the step with a sync.
    # With buffer donation the step's graph donates its inputs; the limit reruns its executable
    # on the same inputs, so it is the same graph compiled without donation.
    lazy.step()
    cap = graph.Capture(graph.pending_states(None))
    before = metrics.counter_value("UncachedCompile") or 0
    exe = graph.compile_capture(cap)
    if not FLAGS.donate_buffers:
        assert (metrics.counter_value("UncachedCompile") or 0) == before, "limit graph not cached"
    data = [jax.numpy.array(a, copy=True) for a in cap.data]  # a donating step deletes cap.data
    lazyxla.sync(wait=True)
    scalars = cap.args()[-1]  # as an execution passes them (Note [Scalars seen again])
    modes["limit (cached executable alone)"] = lambda: jax.block_until_ready(exe(data, scalars))
    notes["limit (cached executable alone)"] = "exe(cap.data, cap.scalars)"
    return modes, notes


def main(argv: list[str] | None = None) -> None:
    """Run every workload in every mode and print one table per workload."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-round", type=int, default=5)
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    args = parser.parse_args(argv)
    console = Console()
    n = args.rounds * args.per_round

    for name, spec in workloads().items():
        with console.status(f"{name}: warming up (compiles)"):
            modes, notes = prepare(spec, args.warmup, not args.no_inductor)
        with console.status(f"{name}: timing"):
            ms = interleaved_ms(modes, args.rounds, args.per_round)
            ms[ASYNC] /= ASYNC_STEPS

        eager = ms["eager (CPU)"]
        table = Table(
            title=f"{name}: median of {n} steps per mode ({args.rounds} interleaved rounds), "
            f"after {args.warmup} warm-up"
        )
        table.add_column("mode")
        table.add_column("ms / step", justify="right")
        table.add_column("vs eager", justify="right")
        table.add_column("note", style="dim")
        for mode, v in ms.items():
            table.add_row(mode, f"{v:.2f}", f"{v / eager:.2f}x", notes[mode])
        console.print(table)
        lazy, limit = ms["lazyxla (record + sync + wait)"], ms["limit (cached executable alone)"]
        console.print(
            f"lazyxla / limit: [bold]{lazy / limit:.2f}x[/] waiting each step, "
            f"[bold]{ms[ASYNC] / limit:.2f}x[/] async "
            f"(lazyxla spends {lazy - limit:.2f} ms per step outside the executable)\n"
        )


if __name__ == "__main__":
    main()
