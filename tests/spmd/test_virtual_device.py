"""SPMD's virtual device (Note [SPMD virtual device] in tensor.py): a CPU tensor moved to the
device stays on the host until `mark_sharding` uploads it straight into its shards, or a first use,
read or sync uploads it replicated. Values are eager's on every path; only the debug text and the
transfer counters (torch_xla's `VirtualDeviceUsage`, `OutboundData`, `SyncTensorsToData`) see the
deferral."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
import lazyxla.distributed.spmd as xs
from lazyxla._src import runtime_api
from lazyxla._src.xlac import _get_xla_sharding_spec
from lazyxla._src.xlac import _get_xla_tensor_debug_info as debug_info

dev = lazyxla.device()


def _outbound() -> float:
    data = met.metric_data("OutboundData")
    return 0.0 if data is None else data.accumulator


def test_to_device_stays_on_the_host_until_an_op_uses_it():
    t = torch.randn(5, 5)
    met.clear_all()
    x = t.to(dev)
    info = debug_info(x)
    for line in ("Device: SPMD:0", "IR: None", "XLAData: None", "Tensor on host: with size [5, 5]"):
        assert line in info
    assert "TransferToDeviceTime" not in met.metric_names() and _outbound() == 0
    assert _get_xla_sharding_spec(x) == ""  # (asking does not upload it)
    assert "Tensor on host: with size [5, 5]" in debug_info(x)
    y = x * 2  # the first use uploads it, replicated over the 8 devices, as torch_xla does
    info = debug_info(x)
    assert "Tensor on host: None" in info and "xla::device_data" in info
    assert "OpSharding: {replicated}" in info and "NumShards: 8" in info
    assert "TransferToDeviceTime" in met.metric_names()
    assert _outbound() == 8 * t.nbytes  # one copy per device, as torch_xla counts it
    torch.testing.assert_close(y.cpu(), t * 2)


def test_mark_sharding_after_to_uploads_each_shard_once(mesh):
    t = torch.randn(16, 8)
    met.clear_all()
    x = t.to(dev)
    xs.mark_sharding(x, mesh, ("x", "y"))
    assert met.counter_value("VirtualDeviceUsage") == 1
    assert _outbound() == t.nbytes  # each device got its shard only: no replicated copy first
    info = debug_info(x)
    assert "Tensor on host: None" in info and "XLAShardedData" in info
    assert "xla::device_data" in info and "OpSharding: {devices=[4,2]0,1,2,3,4,5,6,7}" in info
    arr = lazyxla.debug.sharding_spec(x)
    assert arr == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close(x.cpu(), t)
    # A tensor used before its mark_sharding was uploaded replicated: resharding moves no host data.
    y = t.to(dev)
    torch.testing.assert_close((y + 0).cpu(), t)
    met.clear_all()
    xs.mark_sharding(y, mesh, ("x", "y"))
    assert met.counter_value("VirtualDeviceUsage") is None and _outbound() == 0
    torch.testing.assert_close(y.cpu(), t)


def test_sharded_model_after_model_to_trains_like_eager(mesh):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    ref = copy.deepcopy(model)
    met.clear_all()
    dev_model = model.to(dev)
    assert met.metric_data("TransferToDeviceTime") is None  # every parameter is still on the host
    xs.mark_sharding(dev_model[0].weight, mesh, ("x", "y"))
    xs.mark_sharding(dev_model[2].weight, mesh, ("y", "x"))
    xs.mark_sharding(dev_model[0].bias, mesh, ("x",))
    sharded = sum(p.numel() * p.element_size() for p in (model[0].weight, model[2].weight))
    sharded += 2 * model[0].bias.nbytes  # split over "x" only: each piece on the 2 "y" devices
    assert met.counter_value("VirtualDeviceUsage") == 3 and _outbound() == sharded
    opt = torch.optim.SGD(dev_model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        x, y = torch.randn(32, 8), torch.randn(32, 4)
        loss = torch.nn.functional.mse_loss(dev_model(x.to(dev)), y.to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
        ref_loss = torch.nn.functional.mse_loss(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-6)
    for p, q in zip(dev_model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    assert lazyxla.debug.sharding_spec(dev_model[0].weight) == "{devices=[4,2]0,1,2,3,4,5,6,7}"


def test_in_place_ops_and_views_on_a_deferred_tensor():
    t = torch.arange(12.0).reshape(3, 4)
    x = t.to(dev)
    x.add_(1)
    expected = t + 1
    torch.testing.assert_close(x.cpu(), expected)
    v = t.to(dev)
    row = v[1]  # a view of a deferred tensor
    row.mul_(10)
    e = t.clone()
    e[1].mul_(10)
    torch.testing.assert_close(v.cpu(), e)
    torch.testing.assert_close(row.cpu(), e[1])
    w = t.to(dev)
    w.copy_(torch.ones(3, 4))  # a whole write: the host copy is never uploaded
    torch.testing.assert_close(w.cpu(), torch.ones(3, 4))


def test_cpu_of_a_deferred_tensor_is_its_value_and_the_source_stays_writable():
    t = torch.randn(4, 6)
    x = t.to(dev)
    keep = t.clone()
    t.zero_()  # the device tensor holds its own copy, as an uploaded one does
    torch.testing.assert_close(x.cpu(), keep)
    bf = torch.randn(3, 5).to(torch.bfloat16)
    torch.testing.assert_close(bf.to(dev).cpu(), bf)
    conj = torch.randn(2, 2, dtype=torch.complex64).conj()  # a lazily conjugated CPU tensor
    torch.testing.assert_close(conj.to(dev).cpu(), conj.resolve_conj())


def test_a_sync_uploads_deferred_tensors_replicated():
    x = torch.randn(4, 4).to(dev)
    met.clear_all()
    lazyxla.sync()
    assert met.counter_value("SyncTensorsToData") == 1
    info = debug_info(x)
    assert "Tensor on host: None" in info
    assert "Data Shape: f32[4,4]\n  OpSharding: {replicated}" in info


def test_a_cpu_fallback_result_stays_on_the_host():
    met.clear_all()
    counts = torch.bincount(torch.tensor([0, 1, 1, 3]).to(dev))  # no lowering: runs on the CPU
    assert met.counter_value("aten::bincount") == 1
    assert "Tensor on host: with size [4]" in debug_info(counts)
    assert counts.tolist() == [1, 2, 0, 1]


def test_deferred_inputs_of_compiled_functions():
    def f(a, b):
        return torch.sin(a) @ b + 1

    a, b = torch.randn(4, 8), torch.randn(8, 4)
    compiled = torch.compile(f, backend="lazyxla")
    torch.testing.assert_close(compiled(a.to(dev), b.to(dev)).cpu(), f(a, b))

    @lazyxla.compile
    def step(x):
        return (x * 3).sum(0)

    torch.testing.assert_close(step(a.to(dev)).cpu(), (a * 3).sum(0))


def test_is_spmd_reads_the_environment_as_torch_xla_does():
    assert runtime_api.is_spmd() and os.environ["XLA_USE_SPMD"] == "1"
    del os.environ["XLA_USE_SPMD"]  # torch_xla's own test classes do this between classes
    try:
        assert not runtime_api.is_spmd()
        assert runtime_api.spmd_mode()  # data already placed stays where it is
    finally:
        runtime_api.use_spmd()
    assert runtime_api.is_spmd()
    t = torch.ones(2, 2).to(dev)
    met.clear_all()
    t += 1
    lazyxla.sync(wait=True)
    assert met.counter_value("ExecuteReplicated") == 1  # torch_xla's name for an SPMD execution
    assert met.counter_value("ExecuteComputation") is None


def test_use_spmd_runs_pending_work_and_moves_views_with_their_base(mesh):
    """Tensors made before `use_spmd()`: pending work runs on its one device first, data moves
    replicated, and a view of moved data reads it through the moved base. Joining any of them with
    sharded data ran nothing before ("incompatible devices": the pending graph and the view still
    read the single-device array)."""
    from lazyxla._src import sharding

    sharding._leave_spmd_for_tests()
    x_cpu = torch.arange(8.0)
    x = x_cpu.to(dev)
    lazyxla.sync(wait=True)
    view = x[1:]
    pending = x * 2
    met.clear_all()
    runtime_api.use_spmd()
    assert met.counter_value("ExecuteComputation") == 1  # the pending work, on one device
    t = torch.ones(8, 7).to(dev)
    xs.mark_sharding(t, mesh, ("x", None))
    out = t + pending[1:] + view
    torch.testing.assert_close(out.cpu(), torch.ones(8, 7) + x_cpu[1:] * 3)


def test_the_sharding_strategies_benchmark_layout_trains_like_eager():
    """The layout of torch_xla's test/spmd/test_sharding_strategies.py (run by the upstream tool
    as a program): a batch and an MLP moved to the device, a sync, then FSDP-style weight
    shardings over a hybrid mesh, trained inside `xp.StepTrace` (which syncs)."""
    import lazyxla.debug.profiler as xp

    mesh = xs.HybridMesh(ici_mesh_shape=(1, 8, 1), axis_names=("data", "fsdp", "tensor"))
    torch.manual_seed(1)
    layers = [torch.nn.Linear(16, 64, bias=False), torch.nn.Linear(64, 16, bias=False)]
    model = torch.nn.Sequential(layers[0], torch.nn.Sigmoid(), layers[1], torch.nn.Sigmoid())
    ref = copy.deepcopy(model)
    data = torch.rand(32, 16)
    xdata = data.to(dev)
    xs.mark_sharding(xdata, mesh, (("data", "fsdp"), "tensor"))
    dev_model = model.to(dev)
    lazyxla.sync()
    xs.mark_sharding(dev_model[0].weight, mesh, ("tensor", "fsdp"))
    xs.mark_sharding(dev_model[2].weight, mesh, ("fsdp", "tensor"))
    opt = torch.optim.SGD(dev_model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        with xp.StepTrace("train_sharding"):
            opt.zero_grad()
            torch.sum(dev_model(xdata)).backward()
            opt.step()
        ref_opt.zero_grad()
        torch.sum(ref(data)).backward()
        ref_opt.step()
    for p, q in zip(dev_model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    assert np.prod(mesh.mesh_shape) == 8


@pytest.mark.parametrize("shape", [(3, 5), (7,)])
def test_uneven_mark_sharding_of_a_deferred_tensor_keeps_its_value(mesh, shape):
    t = torch.randn(*shape)
    x = t.to(dev)
    xs.mark_sharding(x, mesh, ("x",) + (None,) * (len(shape) - 1))  # 4 does not divide it
    torch.testing.assert_close((x + 0).cpu(), t)


def test_sharded_data_loader_uploads_shards_only(mesh):
    from lazyxla._src import xla_model

    t = torch.randn(8, 8)
    met.clear_all()
    [x] = xla_model.send_cpu_data_to_device(t, dev, xs.ShardingSpec(mesh, ("x", "y")))
    assert _outbound() == t.nbytes and met.counter_value("VirtualDeviceUsage") == 1
    info = debug_info(x)
    assert "Tensor on host: None" in info and "XLAShardedData" in info
    torch.testing.assert_close(x.cpu(), t)


def test_hlo_dump_and_checkpoint_of_deferred_tensors(tmp_path):
    from lazyxla._src import xla_model

    t = torch.randn(4, 4)
    x = t.to(dev)
    hlo = lazyxla.debug.hlo_text([x + 1])
    assert "parameter(0)" in hlo
    y = t.to(dev)
    path = str(tmp_path / "ckpt.pt")
    xla_model.save({"w": y}, path)
    torch.testing.assert_close(torch.load(path)["w"], t)
