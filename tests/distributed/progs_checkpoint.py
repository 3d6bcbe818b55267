"""Distributed checkpoint across processes (run by test_checkpoint.py).

`python progs_checkpoint.py save DIR` on N processes: one global SPMD mesh over every process's
devices, a model with sharded weights and AdamW trained 2 steps, saved with CheckpointManager
(SPMDSavePlanner: each process writes its own shards); process 0 also writes the full state it
saved to DIR/expected.pt. `python progs_checkpoint.py load DIR` on M processes with another mesh
and shardings: a fresh model and primed optimizer restored in place, then compared with
expected.pt (bit-equal); process 0 writes DIR/loaded.json."""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch_xla.experimental.distributed_checkpoint import CheckpointManager, prime_optimizer

mode, out = sys.argv[1], sys.argv[2]
xr.use_spmd()
dist.init_process_group("gloo", init_method="xla://")
procs, rank, n = xr.process_count(), xr.process_index(), xr.global_runtime_device_count()
dev = torch_xla.device()


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.Tanh(), torch.nn.Linear(40, 6))


def full_state(model, opt) -> dict:
    """Every tensor of the model and optimizer state on the CPU (a gather: all processes call)."""
    st = {f"model.{k}": v.cpu() for k, v in model.state_dict().items()}
    for i, s in opt.state_dict()["state"].items():
        st.update({f"optim.{i}.{k}": v.cpu() for k, v in s.items()})
    return st


model = make_model(0 if mode == "save" else 1).to(dev)
if mode == "save":  # mesh (4, 2) over 8 devices: rows of weight 0 over "a", columns over "b"
    mesh = xs.Mesh(np.arange(n), (n // 2, 2), ("a", "b"))
    xs.mark_sharding(model[0].weight, mesh, ("a", "b"))
    xs.mark_sharding(model[2].weight, mesh, (None, "a"))
else:  # another mesh, other shardings, uneven splits (40 rows over 4 devices is even; 6 is not)
    mesh = xs.Mesh(np.arange(n)[::-1].copy(), (n,), ("x",))
    xs.mark_sharding(model[0].weight, mesh, (None, "x"))
    xs.mark_sharding(model[2].weight, mesh, ("x", None))
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
mgr = CheckpointManager(os.path.join(out, "ckpt"), save_interval=1, chkpt_on_preemption=False)

if mode == "save":
    g = torch.Generator().manual_seed(2)
    for _ in range(2):
        x = torch.randn(8, 12, generator=g).to(dev)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch_xla.sync()
    assert mgr.save(7, {"model": model.state_dict(), "optim": opt.state_dict()})
    expected = full_state(model, opt)
    if rank == 0:
        torch.save(expected, os.path.join(out, "expected.pt"))
else:
    prime_optimizer(opt)
    assert mgr.all_steps() == [7], mgr.all_steps()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    mgr.restore(7, state)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    got = full_state(model, opt)
    expected = torch.load(os.path.join(out, "expected.pt"))
    assert got.keys() == expected.keys(), (sorted(got), sorted(expected))
    bad = [k for k in got if not torch.equal(got[k], expected[k])]
    assert not bad, f"process {rank}: differ after load: {bad}"
    assert opt.state_dict()["state"][0]["step"].item() == 2
    if rank == 0:
        with open(os.path.join(out, "loaded.json"), "w") as f:
            json.dump({"processes": procs, "devices": n, "keys": sorted(got)}, f)
dist.destroy_process_group()
