"""Memory of large-model features, from XLA's own memory analysis, and their step times.

1. Attention (one training step: forward + backward of q, k, v; batch 1, 2 heads, head dim 64):
   compiled temp bytes of flash attention (lazyxla's sdpa, Note [Blockwise attention]) and of
   naive attention (softmax(q k^T) v) at sequence 512..4096, and their step times.
2. Activation checkpointing of a decoder stack (each layer: causal attention + GELU MLP):
   temp bytes and step time without checkpointing, with torch.utils.checkpoint (reentrant and
   not) and with the matmul-saving policy, under XLA:CPU's default scheduler and its
   memory-minimizing one (Note [Checkpointing]: the default schedules recomputation early).

Temp bytes are deterministic; times are medians of interleaved rounds on a shared machine: read
them as ratios measured side by side in one run.

    python bench/large_models.py [--seqs 512 1024 2048 4096] [--layers 8] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

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


CHECKPOINT_CHILD = r"""
import json, sys, time
import torch, torch.nn as nn, torch.nn.functional as F, torch.utils.checkpoint as tuc
sys.path.insert(0, sys.argv[3])
from _timing import interleaved_ms
import lazyxla
from lazyxla.utils.checkpoint import save_matmuls_context_fn

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(self, x):
        b, s, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))

layers, d = int(sys.argv[1]), int(sys.argv[2])
dev = lazyxla.device()
torch.manual_seed(0)
blocks = nn.ModuleList(Block(d, 4) for _ in range(layers)).to(dev)
x = torch.randn(4, 256, d).to(dev).requires_grad_()
lazyxla.sync()

def run(mode):
    h = x
    for blk in blocks:
        if mode == "none":
            h = blk(h)
        elif mode == "reentrant":
            h = tuc.checkpoint(blk, h, use_reentrant=True)
        elif mode == "non-reentrant":
            h = tuc.checkpoint(blk, h, use_reentrant=False)
        else:
            h = tuc.checkpoint(blk, h, use_reentrant=False, context_fn=save_matmuls_context_fn)
    h.square().mean().backward()

modes = ["none", "reentrant", "non-reentrant", "save-matmuls"]
temp, steps = {}, {}
for m in modes:
    run(m)
    temp[m] = lazyxla.debug.memory_analysis([p.grad for p in blocks.parameters()]).temp_bytes
    blocks.zero_grad(set_to_none=True); x.grad = None
    lazyxla.sync()
    def step(m=m):
        blocks.zero_grad(set_to_none=True); x.grad = None
        run(m)
        lazyxla.sync(wait=True)
    step()
    steps[m] = step
ms = interleaved_ms(steps, rounds=int(sys.argv[4]), per_round=1)
print(json.dumps({"temp": temp, "ms": ms}))
"""


def checkpoint_table(layers: int, d: int, rounds: int) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    print(f"\ndecoder stack ({layers} layers, d={d}, 4 heads, batch 4 x 256 tokens): training step")
    for label, flags in (
        ("XLA:CPU default (concurrency-optimized) scheduler", ""),
        ("memory-minimizing scheduler", "--xla_cpu_enable_concurrency_optimized_scheduler=false"),
    ):
        env = {**os.environ, "XLA_FLAGS": flags, "CPU_NUM_DEVICES": "1"}
        out = subprocess.run(
            [sys.executable, "-c", CHECKPOINT_CHILD, str(layers), str(d), here, str(rounds)],
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
        print(f"  {'mode':>14} {'temp MiB':>9} {'none/mode':>10} {'ms':>8} {'ms/none':>8}")
        for m, t in r["temp"].items():
            print(f"  {m:>14} {t / MiB:>9.1f} {base_t / t:>10.2f} {r['ms'][m]:>8.1f} "
                  f"{r['ms'][m] / base_ms:>8.2f}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="seqs 512 1024, 4 layers, 2 rounds")
    a = p.parse_args()
    if a.quick:
        a.seqs, a.layers, a.rounds = [512, 1024], 4, 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    attention_table(a.seqs, a.rounds)
    checkpoint_table(a.layers, a.d, a.rounds)


if __name__ == "__main__":
    main()
