"""Compile time and step time of a 16-layer decoder training step: `scan_layers` vs unrolled.

The demo `Decoder` (lazyxla/models.py) with its block loop run two ways:
- unrolled: `for block in blocks: x = block(x)`, so the step's graph holds 16 copies of a layer
  (forward and backward) and XLA compiles each;
- scan: `scan_layers(blocks, x, is_layer_pure=True)`, so the graph holds one `lax.scan` over the
  stacked weights (forward) and one reversed `lax.scan` (backward), each compiling one layer.

A step is `zero_grad; loss; backward; AdamW step; sync(wait=True)`, on data resident on the
device. Reported, for each mode from one run of this script:
- compile: XLA compile time of the step's graph (lazyxla's `CompileTime` metric, first step);
- first step: wall time of the first step (tracing + AOTAutograd for scan + compile + run);
- step: median wall time of later steps (cache hits), timed in interleaved rounds;
and the ratios unrolled/scan for compile time (target >= 5x) and scan/unrolled for step time
(target <= 1.2x). Both models start from the same weights and their losses are checked equal.
The machine is shared with other jobs: read the ratios, measured side by side, not the absolutes.

Run: `python bench/scan_layers.py [--layers 16 --dim 128 --seq 64 --batch 4 --steps 10]`.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from _timing import interleaved_ms
from torch import nn

import lazyxla
from lazyxla.debug import metrics
from lazyxla.experimental.scan_layers import scan_layers
from lazyxla.models import Decoder, DecoderBlock, DecoderConfig, rotary_tables

PARTITION = None  # set by --partition


class Block(nn.Module):
    """A `DecoderBlock` whose causal mask and rotary tables are its own buffers, so it maps
    hidden states to hidden states, as `scan_layers` needs (the mask and tables are stacked
    with the weights and sliced per layer; they are small)."""

    def __init__(self, cfg: DecoderConfig, seq: int) -> None:
        super().__init__()
        self.block = DecoderBlock(cfg)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1))
        cos, sin = rotary_tables(cfg.head_dim, seq, cfg.rope_theta)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, self.mask, (self.cos, self.sin))


class Model(nn.Module):
    """The demo decoder's embedding, blocks, norm and tied head; blocks scanned or unrolled."""

    def __init__(self, cfg: DecoderConfig, seq: int, scanned: bool) -> None:
        super().__init__()
        ref = Decoder(cfg)  # the demo's initialization, blocks included
        self.embed, self.norm = ref.embed, ref.norm
        self.blocks = nn.ModuleList(Block(cfg, seq) for _ in range(cfg.n_layers))
        for mine, theirs in zip(self.blocks, ref.blocks):
            mine.block.load_state_dict(theirs.state_dict())
        self.scanned = scanned

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.scanned:
            x = scan_layers(self.blocks, x, is_layer_pure=True, partition_fn=PARTITION)
        else:
            for block in self.blocks:
                x = block(x)
        return F.linear(self.norm(x), self.embed.weight)


class Run:
    def __init__(self, cfg: DecoderConfig, seq: int, batch: int, scanned: bool) -> None:
        dev = lazyxla.device()
        torch.manual_seed(0)
        self.model = Model(cfg, seq, scanned).to(dev)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        self.tokens = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(dev)
        self.targets = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(dev)
        lazyxla.sync(wait=True)

    def step(self) -> torch.Tensor:
        self.opt.zero_grad()
        logits = self.model(self.tokens)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.targets.reshape(-1))
        loss.backward()
        self.opt.step()
        lazyxla.sync(wait=True)
        return loss.detach()

    def first_step(self) -> tuple[float, float, float]:
        """(compile seconds, first-step seconds, loss) of the first step."""
        metrics.clear_all()
        t0 = time.perf_counter()
        loss = self.step()
        wall = time.perf_counter() - t0
        data = metrics.metric_data("CompileTime")
        return (data[1] / 1e9 if data else 0.0), wall, loss.cpu().item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help="timed steps per mode")
    p.add_argument(
        "--partition",
        choices=("default", "min_cut"),
        default="default",
        help="scan_layers' partition_fn: save activations, or recompute them (min-cut remat)",
    )
    a = p.parse_args()
    if a.partition == "min_cut":
        from functorch.compile import min_cut_rematerialization_partition

        global PARTITION
        PARTITION = min_cut_rematerialization_partition
    cfg = DecoderConfig(
        dim=a.dim, n_layers=a.layers, n_heads=4, n_kv_heads=2, max_seq_len=a.seq, vocab_size=256
    )
    runs = {"unrolled": Run(cfg, a.seq, a.batch, False), "scan": Run(cfg, a.seq, a.batch, True)}
    first = {name: r.first_step() for name, r in runs.items()}
    for r in runs.values():  # a second step: any remaining one-time work happens here
        r.step()
    metrics.clear_all()
    ms = interleaved_ms({n: r.step for n, r in runs.items()}, rounds=a.steps, per_round=1)
    assert (metrics.counter_value("UncachedCompile") or 0) == 0, "a timed step recompiled"
    losses = {n: r.step().cpu().item() for n, r in runs.items()}
    print(
        f"{a.layers}-layer decoder (dim {a.dim}, seq {a.seq}, batch {a.batch}), AdamW step, "
        "lazyxla on CPU; machine shared with other jobs"
    )
    print(f"{'mode':10} {'compile s':>10} {'first step s':>13} {'step ms':>9} {'loss@1':>9}")
    for n in runs:
        c, w, loss = first[n]
        print(f"{n:10} {c:10.2f} {w:13.2f} {ms[n]:9.1f} {loss:9.5f}")
    print(f"compile time, unrolled / scan: {first['unrolled'][0] / first['scan'][0]:.1f}x")
    print(f"first step,   unrolled / scan: {first['unrolled'][1] / first['scan'][1]:.1f}x")
    print(f"step time,    scan / unrolled: {ms['scan'] / ms['unrolled']:.2f}x")
    print(f"losses after {a.steps + 3} steps: {losses}")


if __name__ == "__main__":
    main()
