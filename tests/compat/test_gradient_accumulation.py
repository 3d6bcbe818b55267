"""torch_xla.experimental.gradient_accumulation (Note [Gradient accumulation loop]): loss, carried
tensors and every parameter's .grad against the eager Python loop on CPU, one compile for new
data, random ops per iteration, activation checkpointing inside, SPMD gradient shardings, and the
errors for bad input or an impure train_step."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import lazyxla
from lazyxla._src import sharding
from lazyxla._src.tensor import state
from lazyxla._src.xlac import _get_xla_sharding_spec
from lazyxla.debug import metrics
from lazyxla.experimental.gradient_accumulation import gradient_accumulation
from lazyxla.utils.checkpoint import checkpoint

DEV = lazyxla.device()


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _eager_loop(model, train_step, xs, carried):
    """The reference: torch_xla's documented equivalent, run eagerly on CPU."""
    steps = xs[0].shape[0]
    total = torch.zeros(())
    for i in range(steps):
        out = train_step(model, *(x[i] for x in xs), *carried)
        loss, carried = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
        loss = loss / steps
        loss.backward()
        total = total + loss.detach()
    return total, carried


def _run(model, train_step, xs, carried):
    return gradient_accumulation(
        lambda *a: train_step(model, *a),
        tuple(x.to(DEV) for x in xs),
        model,
        *(c.to(DEV) for c in carried),
    )


def _step_with_carry(model, x, y, count, acc):
    out = model(x)
    loss = nn.functional.mse_loss(out, y)
    return loss, count + 1, acc + out.detach().sum(0)


def test_matches_eager_loop_loss_grads_and_carried():
    cpu = _model()
    lazy = copy.deepcopy(cpu).to(DEV)
    torch.manual_seed(1)
    xs = (torch.randn(4, 5, 6), torch.randn(4, 5, 3))
    carried = (torch.tensor(0), torch.zeros(3))
    want_loss, want_carried = _eager_loop(cpu, _step_with_carry, xs, carried)
    loss, count, acc = _run(lazy, _step_with_carry, xs, carried)
    torch.testing.assert_close(loss.cpu(), want_loss)
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert count.item() == 4 == want_carried[0].item()
    torch.testing.assert_close(acc.cpu(), want_carried[1])
    for (name, p), q in zip(lazy.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, msg=name)


def test_adds_to_existing_grads_and_skips_frozen_and_unused_params():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = _model()
            self.extra = nn.Linear(2, 2)  # never used: its .grad stays None, as in eager

        def forward(self, x):
            return self.body(x)

    cpu = Net()
    cpu.body[0].bias.requires_grad_(False)
    lazy = copy.deepcopy(cpu).to(DEV)
    torch.manual_seed(2)
    xs = (torch.randn(3, 5, 6), torch.randn(3, 5, 3))

    def step(model, x, y):
        return nn.functional.mse_loss(model(x), y)

    for _ in range(2):  # the second call adds to the gradients of the first
        _eager_loop(cpu, step, xs, ())
        loss = _run(lazy, step, xs, ())
    assert isinstance(loss, torch.Tensor)
    for (name, p), q in zip(lazy.named_parameters(), cpu.parameters()):
        if q.grad is None:
            assert p.grad is None, name
        else:
            torch.testing.assert_close(p.grad.cpu(), q.grad, msg=name)
    assert lazy.body[0].bias.grad is None and lazy.extra.weight.grad is None


def test_new_data_compiles_nothing_new():
    lazy = _model().to(DEV)
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1)

    def step(model, x, y):
        return nn.functional.mse_loss(model(x), y)

    def train(seed):
        torch.manual_seed(seed)
        loss = _run(lazy, step, (torch.randn(4, 5, 6), torch.randn(4, 5, 3)), ())
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
        return loss.item()

    train(0)
    train(1)
    metrics.clear_all()
    losses = {train(2), train(3)}
    assert len(losses) == 2
    assert (metrics.counter_value("UncachedCompile") or 0) == 0
    assert metrics.counter_value("xla::scan") == 2


def test_random_ops_draw_anew_each_iteration():
    lazy = _model().to(DEV)

    def step(x, y, prev, draws):
        loss = nn.functional.mse_loss(lazy(x), y)
        r = torch.rand((), device=DEV)
        return loss, r, draws + (r != prev).to(draws.dtype)

    xs = (torch.randn(5, 2, 6).to(DEV), torch.randn(5, 2, 3).to(DEV))
    init = (torch.tensor(-1.0, device=DEV), torch.tensor(0, device=DEV))
    _, last1, changed = gradient_accumulation(step, xs, lazy, *init)
    assert changed.item() == 5  # every iteration drew a new number
    _, last2, _ = gradient_accumulation(step, xs, lazy, *init)
    assert last1.item() != last2.item()  # and every call too


def test_activation_checkpointing_inside_train_step(monkeypatch):
    from lazyxla._src import remat

    monkeypatch.setattr(remat, "_scheduler_checked", False)  # (warned once per process)
    cpu = _model()
    lazy = copy.deepcopy(cpu).to(DEV)
    torch.manual_seed(3)
    xs = (torch.randn(3, 4, 6), torch.randn(3, 4, 3))

    def step(model, x, y):
        h = model[0](x)
        if x.device.type == DEV.type:
            h = checkpoint(model[1], h, use_reentrant=True)
            h = checkpoint(model[2], h, use_reentrant=True)
        else:
            h = model[2](model[1](h))
        return nn.functional.mse_loss(h, y)

    want, _ = _eager_loop(cpu, step, xs, ())
    with pytest.warns(UserWarning, match="scheduler"):
        loss = _run(lazy, step, xs, ())
    torch.testing.assert_close(loss.cpu(), want)
    for p, q in zip(lazy.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad)
        assert not state(p).is_pending  # the barrier left the parameters as they were


def test_in_place_write_to_an_input_is_refused_and_undone():
    lazy = _model().to(DEV)
    before = [p.detach().cpu().clone() for p in lazy.parameters()]
    xs = (torch.randn(2, 3, 6).to(DEV), torch.randn(2, 3, 3).to(DEV))

    def bumps_counter(x, y, counter):
        counter += 1
        return nn.functional.mse_loss(lazy(x), y), counter

    with pytest.raises(AssertionError, match="in place"):
        gradient_accumulation(bumps_counter, xs, lazy, torch.tensor(0, device=DEV))

    def writes_weight(x, y):
        with torch.no_grad():
            lazy[0].weight.mul_(2)
        return nn.functional.mse_loss(lazy(x), y)

    with pytest.raises(AssertionError, match="model parameter"):
        gradient_accumulation(writes_weight, xs, lazy)
    for p, b in zip(lazy.parameters(), before):
        torch.testing.assert_close(p.detach().cpu(), b)
        assert p.grad is None


def test_buffer_updates_are_refused_and_undone():
    torch.manual_seed(5)
    lazy = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4)).to(DEV)
    mean = lazy[1].running_mean.cpu()
    xs = (torch.randn(2, 3, 6).to(DEV),)
    with pytest.raises(AssertionError, match="buffer"):
        gradient_accumulation(lambda x: lazy(x).sum(), xs, lazy)
    torch.testing.assert_close(lazy[1].running_mean.cpu(), mean)
    lazy.eval()  # no buffer updates: runs, equal to the eager loop
    cpu = copy.deepcopy(lazy).cpu()
    want, _ = _eager_loop(cpu, lambda m, x: m(x).sum(), (xs[0].cpu(),), ())
    torch.testing.assert_close(gradient_accumulation(lambda x: lazy(x).sum(), xs, lazy).cpu(), want)
    for p, q in zip(lazy.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


def test_bad_input_errors():
    lazy = _model().to(DEV)
    x = torch.randn(2, 3, 6).to(DEV)

    def step(x, y=None, *c):
        return lazy(x).sum()

    with pytest.raises(ValueError, match="cannot be empty"):
        gradient_accumulation(step, (), lazy)
    with pytest.raises(ValueError, match="inconsistent first dimension"):
        gradient_accumulation(step, (x, torch.randn(3, 3).to(DEV)), lazy)
    with pytest.raises(ValueError, match="not a tensor"):
        gradient_accumulation(step, (x, 3), lazy)
    with pytest.raises(ValueError, match="is on cpu"):
        gradient_accumulation(step, (torch.randn(2, 3, 6),), lazy)
    with pytest.raises(ValueError, match="empty"):
        gradient_accumulation(step, (torch.zeros(0, 3).to(DEV),), lazy)
    with pytest.raises(ValueError, match="must be a scalar"):
        gradient_accumulation(lambda x: lazy(x), (x,), lazy)
    with pytest.raises(ValueError, match="keep its shape and dtype"):
        gradient_accumulation(
            lambda x, c: (lazy(x).sum(), c.float()), (x,), lazy, torch.tensor(0, device=DEV)
        )
    with pytest.raises(ValueError, match="returned 1 values"):
        gradient_accumulation(lambda x, c: lazy(x).sum(), (x,), lazy, torch.tensor(0, device=DEV))


@pytest.fixture
def spmd():
    sharding.use_spmd()
    yield
    sharding._leave_spmd_for_tests()


def test_gradients_are_sharded_like_their_parameters(spmd):
    import lazyxla.distributed.spmd as xs

    mesh = xs.Mesh(np.arange(8), (4, 2), ("x", "y"))
    cpu = _model()
    cpu[0] = nn.Linear(6, 16)
    lazy = copy.deepcopy(cpu).to(DEV)
    xs.mark_sharding(lazy[0].weight, mesh, ("x", None))
    torch.manual_seed(4)
    data = (torch.randn(2, 8, 6), torch.randn(2, 8, 3))

    def step(model, x, y):
        return nn.functional.mse_loss(model(x), y)

    want, _ = _eager_loop(cpu, step, data, ())
    loss = _run(lazy, step, data, ())
    lazyxla.sync()
    torch.testing.assert_close(loss.cpu(), want)
    for p, q in zip(lazy.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad)
    assert _get_xla_sharding_spec(lazy[0].weight.grad) == _get_xla_sharding_spec(lazy[0].weight)
    assert _get_xla_sharding_spec(lazy[0].weight) != ""
