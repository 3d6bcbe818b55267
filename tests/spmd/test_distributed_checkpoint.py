"""torch.distributed.checkpoint with lazyxla's SPMD planners and CheckpointManager, on 8 devices
in one process (several processes: tests/distributed/test_checkpoint.py). Saved values are
compared with what was saved, bit for bit, across meshes, shardings and uneven splits."""

import os
import signal

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dist_cp
from torch.distributed.checkpoint.api import CheckpointException

import lazyxla
import lazyxla.debug.metrics as met
import lazyxla.distributed.spmd as xs
from lazyxla.experimental.distributed_checkpoint import (
    CheckpointManager,
    SPMDLoadPlanner,
    SPMDSavePlanner,
    prime_optimizer,
)
from lazyxla.experimental.distributed_checkpoint._helpers import (
    _CpuShards,
    _sharded_cpu_state_dict,
)

dev = lazyxla.device()


def _model(seed: int, mesh=None, specs=()) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.Tanh(), torch.nn.Linear(40, 6))
    m = m.to(dev)
    for p, spec in zip((m[0].weight, m[2].weight), specs):
        xs.mark_sharding(p, mesh, spec)
    return m


def _cpu(sd: dict) -> dict:
    return {k: v.cpu() for k, v in sd.items()}


def _save(state_dict, path, planner=None):
    dist_cp.save(state_dict, storage_writer=dist_cp.FileSystemWriter(str(path)), planner=planner)


def _load(state_dict, path, planner=None):
    dist_cp.load(state_dict, storage_reader=dist_cp.FileSystemReader(str(path)), planner=planner)


MESH_A = dict(
    mesh=lambda: xs.Mesh(np.arange(8), (4, 2), ("a", "b")), specs=(("a", "b"), (None, "a"))
)
MESH_B = dict(
    mesh=lambda: xs.Mesh([4, 5, 6, 7, 0, 1, 2, 3], (8,), ("x",)),
    specs=((None, "x"), ("x", None)),  # 12 columns and 6 rows over 8 devices: uneven
)


@pytest.mark.parametrize(
    "src,dst",
    [(MESH_A, MESH_B), (MESH_B, MESH_A), (MESH_A, None), (None, MESH_B)],
    ids=["2d-to-permuted-uneven", "uneven-to-2d", "sharded-to-unsharded", "unsharded-to-sharded"],
)
def test_reshard_round_trip(tmp_path, src, dst):
    a = _model(0, src["mesh"](), src["specs"]) if src else _model(0)
    b = _model(1, dst["mesh"](), dst["specs"]) if dst else _model(1)
    spec_before = [lazyxla.debug.sharding_spec(p) for p in b.parameters()]
    expected = _cpu(a.state_dict())
    _save(a.state_dict(), tmp_path, SPMDSavePlanner())
    assert not torch.equal(b[0].weight.cpu(), expected["0.weight"])
    met.clear_all()
    _load(b.state_dict(), tmp_path, SPMDLoadPlanner())
    assert met.counter_value("UncachedCompile") in (None, 0)  # a load is data placement only
    got = _cpu(b.state_dict())
    for k in expected:
        assert torch.equal(got[k], expected[k]), k
    assert [lazyxla.debug.sharding_spec(p) for p in b.parameters()] == spec_before


def test_save_from_host_shards_and_load_into_cpu_state_dict(tmp_path):
    a = _model(0, MESH_A["mesh"](), MESH_A["specs"])
    host = _sharded_cpu_state_dict(a.state_dict())
    assert isinstance(host["0.weight"], _CpuShards) and host["0.bias"].device.type == "cpu"
    _save(host, tmp_path, SPMDSavePlanner())
    cpu_model = torch.nn.Sequential(
        torch.nn.Linear(12, 40), torch.nn.Tanh(), torch.nn.Linear(40, 6)
    )
    sd = cpu_model.state_dict()
    _load(sd, tmp_path)  # DCP's default planner, CPU tensors
    for k, v in _cpu(a.state_dict()).items():
        assert torch.equal(sd[k], v), k


def test_optimizer_state_round_trip_and_training_continues_identically(tmp_path):
    mesh = MESH_A["mesh"]()
    a = _model(0, mesh, MESH_A["specs"])
    opt_a = torch.optim.AdamW(a.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(3)
    batches = [torch.randn(8, 12, generator=g) for _ in range(4)]

    def step(m, o, x):
        loss = m(x.to(dev)).square().mean()
        o.zero_grad()
        loss.backward()
        o.step()
        lazyxla.sync()

    for x in batches[:2]:
        step(a, opt_a, x)
    mgr = CheckpointManager(str(tmp_path), save_interval=5, chkpt_on_preemption=False)
    assert mgr.save(5, {"model": a.state_dict(), "optim": opt_a.state_dict()})

    b = _model(1, MESH_B["mesh"](), MESH_B["specs"])
    opt_b = prime_optimizer(torch.optim.AdamW(b.parameters(), lr=0.05))
    state = {"model": b.state_dict(), "optim": opt_b.state_dict()}
    mgr.restore(5, state)
    b.load_state_dict(state["model"])
    opt_b.load_state_dict(state["optim"])
    for k, v in opt_a.state_dict()["state"].items():
        for name, t in v.items():
            assert torch.equal(opt_b.state_dict()["state"][k][name].cpu(), t.cpu()), (k, name)
    for x in batches[2:]:
        step(a, opt_a, x)
        step(b, opt_b, x)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pb.cpu(), pa.cpu(), rtol=1e-6, atol=1e-7)


def test_manager_steps_interval_max_to_keep_and_async(tmp_path):
    m = _model(0, MESH_A["mesh"](), MESH_A["specs"])
    mgr = CheckpointManager(
        str(tmp_path), save_interval=10, max_to_keep=2, chkpt_on_preemption=False
    )
    assert not mgr.save(3, m.state_dict())
    assert mgr.save(10, m.state_dict()) and mgr.save(20, m.state_dict())
    assert mgr.save_async(30, m.state_dict())
    mgr.join()
    assert mgr.all_steps() == [20, 30]
    assert sorted(os.listdir(tmp_path)) == ["20", "30"]
    again = CheckpointManager(str(tmp_path), save_interval=10, chkpt_on_preemption=False)
    assert again.all_steps() == [20, 30]  # tracked steps persist
    with pytest.raises(ValueError, match="untracked step 10"):
        again.restore(10, m.state_dict())


def test_sigterm_sets_the_preemption_sync_point(tmp_path):
    m = _model(0)
    mgr = CheckpointManager(str(tmp_path), save_interval=100)
    try:
        assert not mgr.save(7, m.state_dict())
        os.kill(os.getpid(), signal.SIGTERM)  # the process keeps running: the flag is set
        assert mgr.reached_preemption(8)
        assert mgr.save(8, m.state_dict())  # off the interval: taken for the preemption
        assert mgr.all_steps() == [8]
    finally:
        from lazyxla._src import dcp_manager

        dcp_manager.deactivate_preemption_sync_manager()


def test_load_into_a_model_of_another_shape_is_a_clear_error(tmp_path):
    a = _model(0, MESH_A["mesh"](), MESH_A["specs"])
    _save(a.state_dict(), tmp_path, SPMDSavePlanner())
    other = torch.nn.Linear(12, 48).to(dev)
    sd = {"0.weight": other.weight, "0.bias": other.bias}
    before = other.weight.cpu()
    # DCP gathers each process's error into a CheckpointException; it plans keys sorted
    with pytest.raises(CheckpointException, match=r"'0.bias' has shape \(40,\).*\(48,\)"):
        _load(sd, tmp_path, SPMDLoadPlanner())
    assert torch.equal(other.weight.cpu(), before)  # nothing was changed
