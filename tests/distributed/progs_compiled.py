"""Collectives inside torch.compile (run by test_collectives.py): `xm.all_reduce` traced by
dynamo (torch's functional collective, as torch_xla records it), between eager-recorded
collectives, so the ordering token threads through the compiled graph. Exact values on integer
data; new data replays the same graph (no new compile)."""

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.runtime as xr


def step(x):
    return xm.all_reduce(xm.REDUCE_SUM, x * 2) + 1


def _mp_fn(index):
    n, rank, dev = xr.world_size(), xr.global_ordinal(), torch_xla.device()
    compiled = torch.compile(step, backend="openxla", fullgraph=True)
    compiles = []
    for it in range(3):
        vals = [torch.arange(6.0).reshape(2, 3) * (r + 1) + it for r in range(n)]
        x = vals[rank].to(dev)
        before = xm.all_reduce(xm.REDUCE_MAX, x)  # eager-recorded, then the compiled one
        mid = compiled(x)
        after = xm.all_reduce(xm.REDUCE_SUM, mid, scale=0.5)
        torch_xla.sync()
        total = sum(vals)
        assert torch.equal(before.cpu(), torch.stack(vals).amax(0)), it
        assert torch.equal(mid.cpu(), total * 2 + 1), (it, mid.cpu())
        assert torch.equal(after.cpu(), (total * 2 + 1) * n * 0.5), it
        compiles.append(met.counter_value("UncachedCompile") or 0)
    assert compiles[1] == compiles[2], compiles  # steady state: nothing compiled again


if __name__ == "__main__":
    torch_xla.launch(_mp_fn)
