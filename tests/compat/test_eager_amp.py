"""torch_xla's eager mode (Note [Eager mode]) and torch_xla.amp (autocast, the sync-free
GradScaler and optimizers; Note [Sync-free mixed precision]), against eager PyTorch on CPU."""

import copy

import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla._src.tensor import state
from lazyxla.amp import GradScaler, autocast, syncfree
from lazyxla.experimental import eager_mode, eager_mode_context, is_eager_mode

dev = lazyxla.device()


@pytest.fixture(autouse=True)
def lazy_mode():
    yield
    eager_mode(False)


def test_eager_mode_runs_each_op_and_caches_it():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    ref = copy.deepcopy(model)
    model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    xl = x.to(dev)
    eager_mode(True)
    assert is_eager_mode()
    compiles = []
    for _ in range(3):
        met.clear_all()
        for m, o, inp in ((model, opt, xl), (ref, ref_opt, x)):
            o.zero_grad()
            m(inp).pow(2).sum().backward()
            o.step()
        compiles.append(met.counter_value("UncachedCompile") or 0)
        # Nothing is left pending: every op ran when it was called.
        assert not any(state(p).is_pending for p in model.parameters())
    assert compiles[0] > 0 and compiles[1:] == [0, 0]  # each op's graph is compiled once
    assert met.metric_data("EagerOpExecuteTime").total_samples > 10
    assert met.metric_data("ExecuteTime") is None  # eager ops are counted under their own name
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)


def test_eager_mode_in_place_through_a_view():
    with eager_mode_context(True) as previous:
        assert previous is False
        y = torch.ones(3, device=dev) * 3
        assert not state(y).is_pending
        y[1:].mul_(2)
        assert not state(y).is_pending
        torch.testing.assert_close(y.cpu(), torch.tensor([3.0, 6.0, 6.0]))
    assert not is_eager_mode()
    z = torch.ones(2, device=dev) + 1
    assert state(z).is_pending  # lazy again outside the context


def test_compile_region_is_one_graph_in_eager_mode():
    @lazyxla.compile
    def step(a):
        return ((a * 2 + 1).sin() * 3).sum()

    eager_mode(True)
    a = torch.randn(5, device=dev)
    met.clear_all()
    out = step(a)
    assert met.metric_data("ExecuteTime").total_samples == 1  # the region: one graph
    assert met.metric_data("EagerOpExecuteTime") is None
    torch.testing.assert_close(out.cpu(), ((a.cpu() * 2 + 1).sin() * 3).sum())


def test_autocast_runs_matmuls_in_bf16():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with autocast(dev):
        out = a.to(dev) @ b.to(dev)
        soft = torch.softmax(out, dim=-1)
    assert out.dtype == torch.bfloat16 and soft.dtype == torch.float32
    ref = (a.bfloat16() @ b.bfloat16()).float()
    torch.testing.assert_close(out.float().cpu(), ref, rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="XLA device"):
        autocast("cuda")


@pytest.mark.parametrize(
    "cls,ref_cls,kw",
    [
        (syncfree.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
        (syncfree.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
        (syncfree.Adam, torch.optim.Adam, dict(lr=0.01, weight_decay=0.01)),
        (syncfree.AdamW, torch.optim.AdamW, dict(lr=0.01, amsgrad=True)),
    ],
)
def test_syncfree_optimizer_skips_on_found_inf_without_syncing(cls, ref_cls, kw):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).double()
    ref = copy.deepcopy(model)
    model.to(dev)
    opt, ref_opt = cls(model.parameters(), **kw), ref_cls(ref.parameters(), **kw)
    x = torch.randn(5, 4, dtype=torch.float64)
    for i in range(4):
        skip = i % 2 == 0
        opt.zero_grad()
        model(x.to(dev)).pow(2).sum().backward()
        met.clear_all()
        opt.step(found_inf=torch.tensor(float(skip), device=dev))
        assert met.metric_data("ExecuteTime") is None  # no host sync inside step()
        lazyxla.sync()
        ref_opt.zero_grad()
        ref(x).pow(2).sum().backward()
        if not skip:
            ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q)


def test_grad_scaler_with_syncfree_optimizer_is_one_graph():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    ref = copy.deepcopy(model)
    model.to(dev)
    opt = syncfree.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    scaler = GradScaler(init_scale=4.0, growth_interval=2)
    x = torch.randn(5, 4)
    scales = []
    for i in range(3):
        opt.zero_grad()
        loss = model(x.to(dev)).pow(2).sum()
        if i == 1:
            loss = loss * float("inf")  # an overflow: the step is skipped, the scale halves
        met.clear_all()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        assert met.metric_data("ExecuteTime") is None  # nothing ran on the host's request
        lazyxla.sync()
        scales.append(scaler.get_scale())
        if i != 1:
            ref_opt.zero_grad()
            ref(x).pow(2).sum().backward()
            ref_opt.step()
    assert scales == [4.0, 2.0, 2.0]
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)


def test_full_graph_training_step_in_eager_mode():
    """The region's backward runs on autograd's device thread: eager mode stays suspended there
    (it used to sync inside the region and abort the process)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    ref = copy.deepcopy(model)
    model.to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)

    @lazyxla.compile(full_graph=True)
    def step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    eager_mode(True)
    for _ in range(3):
        x = torch.randn(5, 4)
        loss = step(x.to(dev))
        ref_opt.zero_grad()
        ref_loss = ref(x).pow(2).mean()
        ref_loss.backward()
        ref_opt.step()
        torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-6)


def test_fetch_gradients_returns_each_grad_data_in_group_order():
    """`xm._fetch_gradients` (torch_xla's helper its syncfree tests use to poison a gradient):
    the `.data` of every gradient, in param-group order; writing one changes the parameter's
    gradient without autograd seeing it."""
    import lazyxla.core.xla_model as xm

    a, b = torch.nn.Linear(3, 2).to(dev), torch.nn.Linear(2, 1).to(dev)
    opt = torch.optim.SGD([{"params": a.parameters()}, {"params": b.parameters()}], lr=0.1)
    b(a(torch.randn(4, 3, device=dev))).sum().backward()
    b.bias.grad = None
    grads = xm._fetch_gradients(opt)
    assert len(grads) == 3
    for g, p in zip(grads, [a.weight, a.bias, b.weight]):
        assert not g.requires_grad and g.untyped_storage()._lx is p.grad.untyped_storage()._lx
    grads[0].mul_(torch.nan)
    assert torch.isnan(a.weight.grad.cpu()).all()


def test_optimization_barrier_runs_at_once_in_eager_mode():
    # recorded without the dispatcher, it still executes as its own eager op (torch_xla's test)
    import lazyxla.core.xla_model as xm

    x = torch.randn(5, 5)
    with eager_mode_context(True):
        t = x.to(dev)
        xm.wait_device_ops()
        met.clear_all()
        xm.optimization_barrier_([t])
        assert not state(t).is_pending
        assert met.metric_data("EagerOpExecuteTime").total_samples == 1
    torch.testing.assert_close(t.cpu(), x)
