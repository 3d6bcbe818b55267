"""Model helpers under SPMD: patched linear, FSDPv2, data parallel inputs, pictures."""

import copy

import numpy as np
import torch
from torch import nn

import lazyxla
import lazyxla.debug.metrics as met
import lazyxla.distributed.spmd as xs
from lazyxla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

dev = lazyxla.device()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))


def _train(model, opt, batches, place):
    losses = []
    for x, y in batches:
        x, y = place(x), place(y)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if x.device.type == "jax":
            lazyxla.sync()
        losses.append(loss.item())
    return losses


def _batches(n=5):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(16, 16, generator=g), torch.randn(16, 8, generator=g)) for _ in range(n)]


def test_patched_linear_matches_eager(mesh):
    torch.manual_seed(0)
    x = torch.randn(4, 6, 16, requires_grad=True)
    lin = nn.Linear(16, 8)
    ref = lin(x)
    ref.sum().backward()
    lin_d = copy.deepcopy(lin).to(dev)
    xd = x.detach().to(dev).requires_grad_()
    out = xs.xla_patched_nn_linear_forward(lin_d, xd)
    out.sum().backward()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lin_d.weight.grad.cpu(), lin.weight.grad, rtol=1e-5, atol=1e-5)


def test_fsdpv2_matches_eager():
    mesh = xs.Mesh(np.arange(8), (8, 1), ("fsdp", "tensor"))
    ref = _mlp()
    model = SpmdFullyShardedDataParallel(copy.deepcopy(ref).to(dev), mesh=mesh)
    w = model.module[0].weight
    assert lazyxla.debug.sharding_spec(w) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    batches = _batches()
    ref_losses = _train(ref, torch.optim.SGD(ref.parameters(), lr=0.1), batches, lambda t: t)
    met.clear_all()
    losses = _train(
        model, torch.optim.SGD(model.parameters(), lr=0.1), batches, lambda t: t.to(dev)
    )
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert lazyxla.debug.sharding_spec(w) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert met.counter_value("UncachedCompile") <= 2


def test_data_parallel_sharded_inputs_match_eager():
    mesh = xs.Mesh(np.arange(8), (8,), ("data",))
    ref = _mlp()
    model = copy.deepcopy(ref).to(dev)
    batches = _batches()
    ref_losses = _train(ref, torch.optim.SGD(ref.parameters(), lr=0.1), batches, lambda t: t)
    spec = xs.ShardingSpec(mesh, ("data", None))

    def place(t):
        t = t.to(dev)
        spec.apply(t)
        return t

    losses = _train(model, torch.optim.SGD(model.parameters(), lr=0.1), batches, place)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)


def test_visualize(mesh, capsys):
    t = torch.randn(8, 8).to(dev)
    xs.mark_sharding(t, mesh, ("x", "y"))
    xs.visualize_tensor_sharding(t)
    xs.visualize_sharding("{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}")
    out = capsys.readouterr().out
    assert "CPU [0, 2, 4, 6]" in out and "CPU [1, 3, 5, 7]" in out


def test_mp_device_loader_places_batches_sharded():
    import lazyxla.distributed.parallel_loader as pl

    mesh = xs.Mesh(np.arange(8), (8,), ("data",))
    batches = _batches(4)
    ref = _mlp()
    model = copy.deepcopy(ref).to(dev)
    ref_losses = _train(ref, torch.optim.SGD(ref.parameters(), lr=0.1), batches, lambda t: t)
    loader = pl.MpDeviceLoader(batches, dev, input_sharding=xs.ShardingSpec(mesh, ("data", None)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in loader:
        assert lazyxla.debug.sharding_spec(x) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
