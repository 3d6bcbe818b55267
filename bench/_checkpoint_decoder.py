"""The decoder stack that activation checkpointing is measured and tested on (shared by
bench/large_models.py and tests/test_checkpointing.py), and its memory/time measurement.

Each layer is causal attention + a GELU MLP with pre-norms. `run(blocks, x, mode)` runs the stack
with every layer checkpointed the way `mode` says. As a script it prints, as one JSON line, XLA's
temp bytes of a training step's graph per mode and (with `--rounds`) the step times; XLA_FLAGS is
read when the CPU client starts, so callers comparing schedulers run it in a subprocess:

    python bench/_checkpoint_decoder.py --layers 8 --d 256 --modes none torch_nonreentrant
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tuc

MODES = (
    "none",
    "torch_reentrant",
    "torch_nonreentrant",
    "xla_reentrant",
    "xla_nonreentrant",
    "save_matmuls",
)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, p: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        return x + self.drop(self.down(F.gelu(self.up(self.ln2(x)))))


def run(blocks: nn.ModuleList, x: torch.Tensor, mode: str) -> torch.Tensor:
    """The stack on `x`, each layer checkpointed as `mode` (one of MODES) says."""
    from lazyxla.utils.checkpoint import checkpoint as xla_checkpoint
    from lazyxla.utils.checkpoint import save_matmuls_context_fn

    for blk in blocks:
        if mode == "none":
            x = blk(x)
        elif mode == "torch_reentrant":
            x = tuc.checkpoint(blk, x, use_reentrant=True)
        elif mode == "torch_nonreentrant":
            x = tuc.checkpoint(blk, x, use_reentrant=False)
        elif mode == "xla_reentrant":
            x = xla_checkpoint(blk, x)
        elif mode == "xla_nonreentrant":
            x = xla_checkpoint(blk, x, use_reentrant=False)
        elif mode == "save_matmuls":
            x = xla_checkpoint(blk, x, use_reentrant=False, context_fn=save_matmuls_context_fn)
        else:
            raise ValueError(f"unknown checkpointing mode {mode!r}; one of {MODES}")
    return x


def measure(
    layers: int, d: int, batch: int, seq: int, modes: list[str], rounds: int
) -> dict[str, dict[str, float]]:
    """{"temp": bytes per mode, "ms": median step ms per mode (if rounds)} of a training step."""
    import lazyxla

    dev = lazyxla.device()
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(d, 4) for _ in range(layers)).to(dev)
    x = torch.randn(batch, seq, d).to(dev).requires_grad_()
    lazyxla.sync()
    temp, steps = {}, {}
    for m in modes:

        def step(m: str = m) -> None:
            blocks.zero_grad(set_to_none=True)
            x.grad = None
            run(blocks, x, m).square().mean().backward()
            lazyxla.sync(wait=True)

        run(blocks, x, m).square().mean().backward()
        grads = [p.grad for p in blocks.parameters()]
        temp[m] = lazyxla.debug.memory_analysis(grads).temp_bytes
        blocks.zero_grad(set_to_none=True)
        x.grad = None
        lazyxla.sync()
        if rounds:
            step()  # compile
        steps[m] = step
    out: dict[str, dict[str, float]] = {"temp": temp}
    if rounds:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _timing import interleaved_ms

        out["ms"] = interleaved_ms(steps, rounds=rounds, per_round=1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--rounds", type=int, default=0, help="timed rounds (0: memory only)")
    a = p.parse_args()
    print(json.dumps(measure(a.layers, a.d, a.batch, a.seq, a.modes, a.rounds)))


if __name__ == "__main__":
    main()
