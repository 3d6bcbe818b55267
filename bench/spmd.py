"""SPMD: the seed notebook's decoder sharded 2-D over a (4, 2) fsdp x tensor mesh vs unsharded.

Runs on 8 virtual CPU devices (`CPU_NUM_DEVICES=8`, set before JAX starts). Reports per-step time
(median after warm-up), compile time (`CompileTime`), and the per-device memory of the parameters:
fully sharded weights should take ~1/8 of the unsharded bytes on each device.

On this 2-core machine the 8 "devices" share two cores, so sharded steps measure partitioning and
collective overhead, not a speed-up: the figure to watch is the memory column.
"""

from __future__ import annotations

import os

os.environ.setdefault("CPU_NUM_DEVICES", "8")

import copy  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import lazyxla  # noqa: E402
import lazyxla.distributed.spmd as xs  # noqa: E402
from lazyxla._src.sharding import XLAShardedTensor  # noqa: E402
from lazyxla.debug import metrics  # noqa: E402
from lazyxla.models import Decoder, DecoderConfig, seed_partition_spec  # noqa: E402

CFG = DecoderConfig(
    vocab_size=1024,
    dim=256,
    n_layers=2,
    n_heads=8,
    n_kv_heads=4,
    ffn_dim=1024,
    max_seq_len=128,
    tie_embeddings=False,
)


def _run(sharded: bool, steps: int = 12, warmup: int = 3) -> dict:
    dev = lazyxla.device()
    torch.manual_seed(0)
    model = copy.deepcopy(Decoder(CFG)).to(dev)
    mesh = xs.Mesh(np.arange(8), (4, 2), ("fsdp", "tensor"))
    if sharded:
        for name, p in model.named_parameters():
            spec = seed_partition_spec(name)
            if spec is not None:
                xs.mark_sharding(p, mesh, spec)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, CFG.vocab_size, (16, CFG.max_seq_len), generator=g).to(dev)
    if sharded:
        xs.mark_sharding(tokens, mesh, ("fsdp", None))
    shards = XLAShardedTensor.wrap if sharded else None
    lazyxla.sync(wait=True)
    metrics.clear_all()
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = model.loss(tokens, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync(wait=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    compile_ns = metrics.metric_data("CompileTime").accumulator
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    per_device = full
    if shards is not None:
        per_device = 0
        for p in model.parameters():
            shard = shards(p).local_shards[0].data
            per_device += shard.numel() * shard.element_size()
    return {
        "step_ms": statistics.median(times) * 1e3,
        "compile_s": compile_ns / 1e9,
        "compiles": metrics.counter_value("UncachedCompile"),
        "param_frac": per_device / full,
        "loss": loss.item(),
    }


def main() -> None:
    base = _run(sharded=False)  # one device, as without SPMD
    xs.use_spmd()
    spmd = _run(sharded=True)
    table = Table(title="Seed decoder, (4, 2) fsdp x tensor mesh, 8 virtual CPU devices")
    for col in ("run", "step ms", "ratio", "compile s", "compiles", "param bytes/device", "loss"):
        table.add_column(col, justify="right")
    for name, r in (("1 device", base), ("2-D sharded", spmd)):
        table.add_row(
            name,
            f"{r['step_ms']:.1f}",
            f"{r['step_ms'] / base['step_ms']:.2f}x",
            f"{r['compile_s']:.2f}",
            str(r["compiles"]),
            f"{r['param_frac']:.3f} of full",
            f"{r['loss']:.5f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
