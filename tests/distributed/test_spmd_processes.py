"""SPMD across processes: one global mesh over 2 processes x 4 devices equals 1 process x 8
devices and eager (per-process batch rows assembled into global batches by the loader)."""

import json

import numpy as np
import torch
from mp_util import free_port, run_launch, start


def _eager_losses():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(4)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_two_processes_of_four_devices_equal_one_of_eight(tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    port = free_port()
    procs = [start("progs_spmd.py", r, 2, port, [str(two)], devices=4) for r in range(2)]
    run_launch("progs_spmd.py", 8, [str(one)])  # alone: CPU_NUM_DEVICES=8, no launch
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-4000:]
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    eager = _eager_losses()
    np.testing.assert_allclose(b["losses"], a["losses"], rtol=1e-5)
    np.testing.assert_allclose(b["weights"], a["weights"], rtol=1e-5)
    np.testing.assert_allclose(a["losses"], eager, rtol=1e-5)
