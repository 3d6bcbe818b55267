"""Eager mode under SPMD: each op runs as its own SPMD program, with a collective where GSPMD needs
one, and data-parallel training equals eager. (Dispatched without waiting, such programs deadlocked
XLA:CPU's all-reduce rendezvous in torch_xla's eager SPMD data-parallel example on 4 devices of a
2-core machine, Note [One SPMD execution at a time on the CPU] in graph.py; this small case does
not deadlock either way: the example, run by lazyxla.tools.upstream, is the reproduction.)"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

import lazyxla
import lazyxla.distributed.spmd as xs
from lazyxla._src import eager


def test_eager_mode_data_parallel_training_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 4),
    )
    dev_model = copy.deepcopy(model).to(lazyxla.device())
    mesh = xs.Mesh(np.arange(8), (8,), ("data",))
    batches = [(torch.randn(64, 16), torch.randn(64, 4)) for _ in range(4)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    dev_opt = torch.optim.SGD(dev_model.parameters(), lr=0.1, momentum=0.9)
    eager.eager_mode(True)
    try:
        for x, y in batches:
            xd, yd = x.to(lazyxla.device()), y.to(lazyxla.device())
            xs.mark_sharding(xd, mesh, ("data", None))
            xs.mark_sharding(yd, mesh, ("data", None))
            for m, o, a, b in ((model, opt, x, y), (dev_model, dev_opt, xd, yd)):
                o.zero_grad()
                F.mse_loss(m(a), b).backward()
                o.step()
    finally:
        eager.eager_mode(False)
    for p, q in zip(dev_model.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)
