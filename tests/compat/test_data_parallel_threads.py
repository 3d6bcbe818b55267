"""torch_xla.distributed.data_parallel.DataParallel: replicas in threads averaging gradients
(Note [DataParallel replicas]), against eager replicas on the CPU."""

import copy

import pytest
import torch
import torch.nn.functional as F

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla.core import xla_model as xm
from lazyxla.distributed.data_parallel import DataParallel, ReplicaAborted


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
    ).double()


def _data(n):
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(3, 4, generator=g, dtype=torch.float64),
            torch.randn(3, 1, generator=g, dtype=torch.float64),
        )
        for _ in range(n)
    ]


def _eager_replicas(net, data, replicas, lr=0.1):
    """Eager reference: batch k to replica k % N, gradients averaged over replicas each step."""
    models = [copy.deepcopy(net) for _ in range(replicas)]
    opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.5) for m in models]
    losses = [[] for _ in range(replicas)]
    for step in range(len(data) // replicas):
        for r, (m, o) in enumerate(zip(models, opts)):
            x, y = data[step * replicas + r]
            o.zero_grad()
            loss = F.mse_loss(m(x), y)
            loss.backward()
            losses[r].append(loss.item())
        for ps in zip(*[m.parameters() for m in models]):
            mean = sum(p.grad for p in ps) / replicas
            for p in ps:
                p.grad = mean.clone()
        for o in opts:
            o.step()
    return models, losses


def _loop(model, loader, device, context):
    opt = context.getattr_or(
        "opt", lambda: torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    )
    losses = []
    for x, y in loader:
        assert x.device == device
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        xm.optimizer_step(opt)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("replicas", [1, 3])
def test_replicas_train_as_eager_replicas_with_averaged_gradients(replicas):
    net, data = _net(), _data(9)
    ref_models, ref_losses = _eager_replicas(net, data, replicas)
    devices = xm.get_xla_supported_devices()[:replicas]
    dp = DataParallel(net, device_ids=devices)
    assert dp.devices == devices and len(dp.models) == replicas
    losses = dp(_loop, data)
    for got, want in zip(losses, ref_losses):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want))
    for m, r in zip(dp.models, ref_models):
        for p, q in zip(m.parameters(), r.parameters()):
            torch.testing.assert_close(p.cpu(), q.detach())
    # a second epoch continues from the replicas' state (and their contexts' optimizers)
    ref_models, _ = _eager_replicas(net, data + data, replicas)
    dp(_loop, data)
    for p, q in zip(dp.models[0].parameters(), ref_models[0].parameters()):
        torch.testing.assert_close(p.cpu(), q.detach())


def test_all_reduce_over_replicas_and_groups():
    dp = DataParallel(torch.nn.Linear(1, 1), device_ids=xm.get_xla_supported_devices()[:4])
    data = [(torch.tensor([float(k)]),) for k in range(4)]

    def loop(model, loader, device, context):
        (x,) = next(iter(loader))
        total = xm.all_reduce(xm.REDUCE_SUM, x)
        biggest = xm.all_reduce(xm.REDUCE_MAX, x)
        pair = [x.clone()]
        xm.all_reduce(xm.REDUCE_SUM, pair, scale=0.5, groups=[[0, 1], [2, 3]])
        return total.item(), biggest.item(), pair[0].item()

    assert dp(loop, data) == [(6.0, 3.0, 0.5), (6.0, 3.0, 0.5), (6.0, 3.0, 2.5), (6.0, 3.0, 2.5)]


def test_replicas_see_their_ordinal_and_other_collectives_refuse():
    dp = DataParallel(torch.nn.Linear(1, 1), device_ids=xm.get_xla_supported_devices()[:3])
    data = [(torch.ones(1),)] * 3

    def loop(model, loader, device, context):
        return xm.get_ordinal(), xm.xrt_world_size(), xm.is_master_ordinal()

    assert dp(loop, data) == [(0, 3, True), (1, 3, False), (2, 3, False)]
    assert xm.get_ordinal() == 0 and xm.xrt_world_size() == 1  # the caller is no replica

    def gather(model, loader, device, context):
        (x,) = next(iter(loader))
        return xm.all_gather(x)

    with pytest.raises(NotImplementedError, match="inside a DataParallel replica"):
        dp(gather, data)


def test_training_compiles_once_per_graph():
    net, data = _net(), _data(14)
    dp = DataParallel(net, device_ids=xm.get_xla_supported_devices()[:2])
    dp(_loop, data[:6])  # warm up: the first steps (no momentum buffers yet) and the steady ones
    met.clear_all()
    dp(_loop, data[6:])
    assert not met.counter_value("UncachedCompile")
    assert met.counter_value("CachedCompile")


def test_a_failing_replica_fails_the_call_and_releases_the_others():
    dp = DataParallel(torch.nn.Linear(2, 2), device_ids=xm.get_xla_supported_devices()[:2])
    data = [(torch.ones(1, 2),)] * 4

    def loop(model, loader, device, context):
        for (x,) in loader:
            xm.all_reduce(xm.REDUCE_SUM, x)
            if model is dp.models[1]:
                raise ValueError("replica 1 broke")

    with pytest.raises(ValueError, match="replica 1 broke"):
        dp(loop, data)
    assert issubclass(ReplicaAborted, RuntimeError)


def test_a_replica_leaving_early_is_an_error_not_a_hang():
    dp = DataParallel(torch.nn.Linear(1, 1), device_ids=xm.get_xla_supported_devices()[:2])
    data = [(torch.ones(1),)] * 4

    def loop(model, loader, device, context):
        if model is dp.models[0]:
            return "left"
        for (x,) in loader:
            xm.all_reduce(xm.REDUCE_SUM, x)

    with pytest.raises(RuntimeError, match="already returned from loop_fn"):
        dp(loop, data)


def test_no_devices_runs_the_module_where_it_is():
    net, data = _net(), _data(2)
    dp = DataParallel(net, device_ids=[])
    assert dp.devices == ["cpu"]
    out = dp(
        lambda model, loader, device, context: [model(x).sum().item() for x, _ in loader], data
    )
    assert out == [[net(x).sum().item() for x, _ in data]]


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="lazyxla devices"):
        DataParallel(torch.nn.Linear(1, 1), device_ids=["cpu"])
    with pytest.raises(TypeError, match="nn.Module"):
        DataParallel(lambda: 3, device_ids=[str(lazyxla.device())])
    dp = DataParallel(torch.nn.Linear(1, 1), device_ids=[str(lazyxla.device())])
    with pytest.raises(TypeError, match="batchdim"):
        dp(lambda *a: None, [], batchdim="0")
