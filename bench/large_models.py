"""Large-model features measured: XLA's memory analysis, compile times and step times.

1. `attention` (one training step: forward + backward of q, k, v; batch 1, 2 heads, head dim 64):
   compiled temp bytes of flash attention (lazyxla's sdpa, Note [Blockwise attention]) and of
   naive attention (softmax(q k^T) v) at sequence 512..4096, and their step times.
2. `checkpoint`: activation checkpointing of a decoder stack (bench/_checkpoint_decoder.py, the
   stack tests/test_checkpointing.py also uses): temp bytes and step time without checkpointing,
   with torch.utils.checkpoint (reentrant and not) and with the matmul-saving policy, under
   XLA:CPU's default scheduler and its memory-minimizing one (Note [Checkpointing]).
3. `scan`: compile time and step time of a 16-layer decoder training step, `scan_layers` vs
   unrolled (and, `--stacked`, a scan over parameters stored stacked, so the optimizer updates
   each stacked weight in one op), with AdamW, SGD or no optimizer (`--optimizer`):
   - unrolled: `for block in blocks: x = block(x)`, 16 copies of a layer in the graph;
   - scan: `scan_layers(blocks, x, is_layer_pure=True)`, one `lax.scan` forward and one backward;
   - stacked: `scan` over `[L, ...]` Parameters (not per-layer ones) through `functional_call`.
   Reported per mode: XLA compile time of the step's graph (`CompileTime`, first step), the first
   step's wall time, and the median step time of later steps (interleaved rounds), with the ratios
   unrolled/scan for compile time (target >= 5x) and scan/unrolled for step time (target <= 1.2x).

Temp bytes are deterministic; times are medians of interleaved rounds on a shared machine: read
them as ratios measured side by side in one run.

    python bench/large_models.py [attention] [checkpoint] [scan] [--quick] [--seqs ...]
        [--layers 8] [--d 256] [--scan-layers 16] [--optimizer adamw|sgd|none] [--stacked]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

MiB = 2**20


def attention_table(seqs: list[int], rounds: int) -> None:
    import torch
    import torch.nn.functional as F
    from _timing import interleaved_ms

    import lazyxla

    dev = lazyxla.device()

    def naive(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) / 8.0, -1) @ v

    print("attention training step (B=1, H=2, D=64): compiled temp memory and step time")
    print(f"{'seq':>6} {'flash MiB':>10} {'naive MiB':>10} {'naive/flash':>11} "
          f"{'flash ms':>9} {'naive ms':>9} {'time naive/flash':>16}")  # fmt: skip
    prev = None
    for s in seqs:
        q = torch.randn(1, 2, s, 64, device=dev, requires_grad=True)
        lazyxla.sync()
        temps, steps = {}, {}
        for name, fn in (("flash", F.scaled_dot_product_attention), ("naive", naive)):

            def step(fn=fn):
                q.grad = None
                fn(q, q, q).sum().backward()
                lazyxla.sync(wait=True)

            fn(q, q, q).sum().backward()
            temps[name] = lazyxla.debug.memory_analysis([q.grad]).temp_bytes
            q.grad = None
            lazyxla.sync()
            step()  # compile
            steps[name] = step
        ms = interleaved_ms(steps, rounds=rounds, per_round=1)
        growth = (
            ""
            if prev is None
            else f"  (x{temps['flash'] / prev[0]:.2f} / x{temps['naive'] / prev[1]:.2f})"
        )  # noqa: E501
        prev = (temps["flash"], temps["naive"])
        print(f"{s:>6} {temps['flash'] / MiB:>10.1f} {temps['naive'] / MiB:>10.1f} "
              f"{temps['naive'] / temps['flash']:>11.2f} {ms['flash']:>9.1f} {ms['naive']:>9.1f} "
              f"{ms['naive'] / ms['flash']:>16.2f}{growth}")  # fmt: skip


def checkpoint_table(layers: int, d: int, rounds: int) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    modes = ["none", "torch_reentrant", "torch_nonreentrant", "save_matmuls"]
    print(f"\ndecoder stack ({layers} layers, d={d}, 4 heads, batch 4 x 256 tokens): training step")
    for label, flags in (
        ("XLA:CPU default (concurrency-optimized) scheduler", ""),
        ("memory-minimizing scheduler", "--xla_cpu_enable_concurrency_optimized_scheduler=false"),
    ):
        env = {**os.environ, "XLA_FLAGS": flags, "CPU_NUM_DEVICES": "1"}
        args = ["--layers", str(layers), "--d", str(d), "--rounds", str(rounds), "--modes", *modes]
        out = subprocess.run(
            [sys.executable, os.path.join(here, "_checkpoint_decoder.py"), *args],
            capture_output=True,
            text=True,
            env=env,
        )
        if out.returncode:
            print(out.stderr[-3000:])
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        base_t, base_ms = r["temp"]["none"], r["ms"]["none"]
        print(f"  {label}")
        print(f"  {'mode':>18} {'temp MiB':>9} {'none/mode':>10} {'ms':>8} {'ms/none':>8}")
        for m, t in r["temp"].items():
            print(f"  {m:>18} {t / MiB:>9.1f} {base_t / t:>10.2f} {r['ms'][m]:>8.1f} "
                  f"{r['ms'][m] / base_ms:>8.2f}")  # fmt: skip


# --- scan_layers against unrolled layers ----------------------------------------------------------


def _scan_models() -> Any:
    """The decoder models of the `scan` section (imported late: torch and lazyxla load here)."""
    import copy

    import torch
    import torch.nn.functional as F
    from torch import nn

    from lazyxla.experimental.scan import scan
    from lazyxla.experimental.scan_layers import scan_layers
    from lazyxla.models import Decoder, DecoderBlock, DecoderConfig, rotary_tables

    class Block(nn.Module):
        """A `DecoderBlock` whose causal mask and rotary tables are its own buffers, so it maps
        hidden states to hidden states, as `scan_layers` needs."""

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
        """The demo decoder's embedding, blocks, norm and tied head; blocks unrolled, scanned with
        `scan_layers`, or scanned over parameters stored stacked."""

        def __init__(self, cfg: DecoderConfig, seq: int, mode: str) -> None:
            super().__init__()
            ref = Decoder(cfg)  # the demo's initialization, blocks included
            self.embed, self.norm, self.mode = ref.embed, ref.norm, mode
            blocks = nn.ModuleList(Block(cfg, seq) for _ in range(cfg.n_layers))
            for mine, theirs in zip(blocks, ref.blocks):
                mine.block.load_state_dict(theirs.state_dict())
            if mode != "stacked":
                self.blocks = blocks
                return
            self.template = copy.deepcopy(blocks[0])
            names = [n for n, _ in blocks[0].named_parameters()]
            self.stacked = nn.ParameterList(
                nn.Parameter(torch.stack([dict(b.named_parameters())[n].detach() for b in blocks]))
                for n in names
            )
            self.names = names
            self.buffer_names = [n for n, _ in blocks[0].named_buffers()]
            for i, n in enumerate(self.buffer_names):
                stacked = torch.stack([dict(b.named_buffers())[n] for b in blocks])
                self.register_buffer(f"stacked_buffer{i}", stacked)
            self.layer_fn = self._layer  # one function object: scan's trace cache keys on it

        def _layer(self, x: torch.Tensor, weights: tuple) -> tuple[torch.Tensor, None]:
            params, buffers = weights
            named = {**dict(zip(self.names, params)), **dict(zip(self.buffer_names, buffers))}
            return torch.func.functional_call(self.template, named, x), None

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embed(tokens)
            if self.mode == "scan":
                x = scan_layers(self.blocks, x, is_layer_pure=True)
            elif self.mode == "stacked":
                bufs = [getattr(self, f"stacked_buffer{i}") for i in range(len(self.buffer_names))]
                x, _ = scan(self.layer_fn, x, (list(self.stacked), bufs), is_fn_pure=True)
            else:
                for block in self.blocks:
                    x = block(x)
            return F.linear(self.norm(x), self.embed.weight)

    return Model, DecoderConfig, F


def scan_table(layers: int, dim: int, seq: int, batch: int, steps: int, optimizer: str,
               stacked: bool) -> None:  # fmt: skip
    import time

    import torch
    from _timing import interleaved_ms

    import lazyxla
    from lazyxla.debug import metrics

    Model, DecoderConfig, F = _scan_models()
    cfg = DecoderConfig(
        dim=dim, n_layers=layers, n_heads=4, n_kv_heads=2, max_seq_len=seq, vocab_size=256
    )
    dev = lazyxla.device()

    class Run:
        def __init__(self, mode: str) -> None:
            torch.manual_seed(0)
            self.model = Model(cfg, seq, mode).to(dev)
            params = list(self.model.parameters())
            self.opt = {
                "adamw": lambda: torch.optim.AdamW(params, lr=1e-3),
                "sgd": lambda: torch.optim.SGD(params, lr=1e-2),
                "none": lambda: None,
            }[optimizer]()
            g = torch.Generator().manual_seed(1)
            self.tokens = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(dev)
            self.targets = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(dev)
            lazyxla.sync(wait=True)

        def step(self) -> torch.Tensor:
            self.model.zero_grad(set_to_none=False)
            logits = self.model(self.tokens)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.targets.reshape(-1))
            loss.backward()
            if self.opt is not None:
                self.opt.step()
            lazyxla.sync(wait=True)
            return loss.detach()

        def first_step(self) -> tuple[float, float, float]:
            metrics.clear_all()
            t0 = time.perf_counter()
            loss = self.step()
            wall = time.perf_counter() - t0
            data = metrics.metric_data("CompileTime")
            return (data[1] / 1e9 if data else 0.0), wall, loss.cpu().item()

    modes = ["unrolled", "scan"] + (["stacked"] if stacked else [])
    runs = {m: Run(m) for m in modes}
    first = {m: r.first_step() for m, r in runs.items()}
    for r in runs.values():  # a second step: the .grad buffers exist from now on
        r.step()
    for r in runs.values():
        r.step()
    metrics.clear_all()
    ms = interleaved_ms({m: r.step for m, r in runs.items()}, rounds=steps, per_round=1)
    recompiled = metrics.counter_value("UncachedCompile") or 0
    losses = {m: round(r.step().cpu().item(), 5) for m, r in runs.items()}
    print(
        f"\n{layers}-layer decoder (dim {dim}, seq {seq}, batch {batch}), optimizer {optimizer}, "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}"
    )
    print(f"{'mode':10} {'compile s':>10} {'first step s':>13} {'step ms':>9} {'loss@1':>9}")
    for m in runs:
        c, w, loss = first[m]
        print(f"{m:10} {c:10.2f} {w:13.2f} {ms[m]:9.1f} {loss:9.5f}")
    for m in modes[1:]:
        print(f"compile time, unrolled / {m}: {first['unrolled'][0] / first[m][0]:.2f}x; "
              f"step time, {m} / unrolled: {ms[m] / ms['unrolled']:.2f}x")  # fmt: skip
    print(f"losses after {steps + 4} steps: {losses}; recompiles while timed: {recompiled}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sections", nargs="*", default=["attention", "checkpoint", "scan"])
    p.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    p.add_argument("--layers", type=int, default=8, help="checkpoint: decoder layers")
    p.add_argument("--d", type=int, default=256, help="checkpoint: model width")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--scan-layers", type=int, default=16)
    p.add_argument("--scan-dim", type=int, default=128)
    p.add_argument("--scan-seq", type=int, default=64)
    p.add_argument("--scan-batch", type=int, default=4)
    p.add_argument("--optimizer", choices=("adamw", "sgd", "none"), default="adamw")
    p.add_argument("--stacked", action="store_true", help="scan: also parameters stored stacked")
    p.add_argument("--quick", action="store_true", help="small sizes, 2 rounds")
    a = p.parse_args()
    if a.quick:
        a.seqs, a.layers, a.rounds, a.scan_layers = [512, 1024], 4, 2, 4
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if "attention" in a.sections:
        attention_table(a.seqs, a.rounds)
    if "checkpoint" in a.sections:
        checkpoint_table(a.layers, a.d, a.rounds)
    if "scan" in a.sections:
        scan_table(a.scan_layers, a.scan_dim, a.scan_seq, a.scan_batch, a.rounds, a.optimizer,
                   a.stacked)  # fmt: skip


if __name__ == "__main__":
    main()
