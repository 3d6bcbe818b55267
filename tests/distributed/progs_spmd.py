"""SPMD across processes (run by test_spmd_processes.py): `python progs_spmd.py OUT` with
`LAZYXLA_NUM_PROCESSES` etc. set by the test, `CPU_NUM_DEVICES` devices per process, or alone with
all 8 devices. One global mesh (4, 2) over every process's devices; weights sharded on "model",
the batch on "data" through `MpDeviceLoader(input_sharding=ShardingSpec(minibatch=True))` (each
process loads only its rows); SGD. Writes every step's loss and the final weights' checksum."""

import json
import sys

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

xr.use_spmd()
procs, rank = xr.process_count(), xr.process_index()
mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
g = torch.Generator().manual_seed(1)
batches = [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(4)]
rows = slice(rank * 8 // procs, (rank + 1) * 8 // procs)  # this process's part of each batch
local = [(x[rows], y[rows]) for x, y in batches]

dev = torch_xla.device()
model = model.to(dev)
xs.mark_sharding(model[0].weight, mesh, ("model", None))
xs.mark_sharding(model[2].weight, mesh, (None, "model"))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
spec = xs.ShardingSpec(mesh, ("data", None), minibatch=True)
loader = pl.MpDeviceLoader(local, dev, input_sharding=spec)
losses = []
for x, y in loader:
    assert tuple(x.shape) == (8, 16), x.shape  # the global batch
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    xm.mark_step()
    losses.append(loss.item())
weights = [p.detach().cpu() for p in model.parameters()]  # every process reads (a gather)
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"losses": losses, "weights": [w.double().sum().item() for w in weights]}, f)
