"""Data parallelism over processes: step time and the gradient all-reduce, for 1, 2 and 4
processes, beside a plain `jax` all-reduce of the same bytes in the same run.

    python bench/distributed.py [--procs 1 2 4] [--steps 10]

Each configuration is one `torch_xla.launch` of this file (rank 0 reports). Per process: the demo
decoder (lazyxla/demo.py's config), global batch 32 x 32 tokens split over the processes, AdamW,
`xm.optimizer_step` (gradients all-reduced inside the step's graph). The all-reduce is timed alone
too: one graph that all-reduces tensors shaped like every gradient (lazyxla's path), and a jitted
`shard_map` psum of the same arrays over the same devices (JAX's floor); the table gives both as
bytes/s and their ratio. On one CPU host the processes share its cores: the step time shows the
cost of communication and of splitting the work, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

BATCH, SEQ = 32, 32


def _worker(index: int, steps: int, out: str) -> None:
    import jax
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    from jax.sharding import PartitionSpec

    from lazyxla._src import collectives
    from lazyxla.demo import CONFIG
    from lazyxla.models import Decoder

    n, rank = xr.world_size(), xr.global_ordinal()
    dev = torch_xla.device()
    torch.manual_seed(0)
    model = Decoder(CONFIG).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    local = BATCH // n

    def step() -> None:
        tokens = torch.randint(0, CONFIG.vocab_size, (local, SEQ + 1), generator=g).to(dev)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        xm.optimizer_step(opt)
        xm.mark_step(wait=True)

    def timed(fn, k: int) -> float:
        for _ in range(2):
            fn()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        return (time.perf_counter() - t0) / k

    step_s = timed(step, steps)
    grads = [p.grad for p in model.parameters()]
    nbytes = sum(t.numel() * t.element_size() for t in grads)
    result: dict = {"n": n, "step_ms": step_s * 1e3, "bytes": nbytes}
    if n > 1:
        bufs = [torch.ones_like(t) for t in grads]

        def lazy_all_reduce() -> None:
            xm.all_reduce(xm.REDUCE_SUM, bufs, scale=1.0 / n)
            xm.mark_step(wait=True)

        mesh = collectives.replica_mesh()
        arrays = collectives.globalize([np.ones(tuple(t.shape), np.float32) for t in grads])
        psum = jax.jit(
            jax.shard_map(
                lambda xs: [jax.lax.psum(x, collectives.REPLICAS) / n for x in xs],
                mesh=mesh,
                in_specs=PartitionSpec(),
                out_specs=PartitionSpec(),
                check_vma=False,
            )
        )
        result["allreduce_ms"] = timed(lazy_all_reduce, steps) * 1e3
        result["jax_allreduce_ms"] = timed(lambda: jax.block_until_ready(psum(arrays)), steps) * 1e3
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)


def _run(n: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        env = {**os.environ, "CPU_NUM_DEVICES": str(n)}
        subprocess.run(
            [sys.executable, "-m", "lazyxla", "run", __file__, "--worker", out, str(steps)],
            env=env,
            check=True,
        )
        with open(out) as f:
            return json.load(f)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        import torch_xla

        out, steps = sys.argv[2], int(sys.argv[3])
        torch_xla.launch(_worker, args=(steps, out))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=10)
    ns = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"demo decoder, global batch {BATCH}x{SEQ}, AdamW, xm.optimizer_step")
    for col in ("processes", "step ms", "grad bytes", "all-reduce ms", "jax all-reduce ms"):
        table.add_column(col, justify="right")
    table.add_column("lazyxla / jax", justify="right")
    for n in ns.procs:
        r = _run(n, ns.steps)
        ar, jx = r.get("allreduce_ms"), r.get("jax_allreduce_ms")
        table.add_row(
            str(n),
            f"{r['step_ms']:.1f}",
            f"{r['bytes'] / 1e6:.2f} MB",
            "-" if ar is None else f"{ar:.2f} ({r['bytes'] / ar / 1e3:.0f} MB/s)",
            "-" if jx is None else f"{jx:.2f} ({r['bytes'] / jx / 1e3:.0f} MB/s)",
            "-" if ar is None else f"{ar / jx:.2f}x",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
