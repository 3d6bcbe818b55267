"""torch_xla.core.functions (differentiable collectives on one replica, SyncBatchNorm),
experimental.gru and core.xla_builder.call_jax, against eager PyTorch / jax.numpy on CPU."""

import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla.core import functions as xf
from lazyxla.core import xla_builder as xb
from lazyxla.experimental.gru import GRU

dev = lazyxla.device()


def test_all_reduce_and_all_gather_are_differentiable():
    x = torch.randn(4, 3, requires_grad=True)
    xl = x.detach().to(dev).requires_grad_()
    y = xf.all_reduce("sum", xl, scale=0.5)
    g = xf.all_gather(xl * 2, dim=0)
    (y.pow(2).sum() + g.sum()).backward()
    # One replica: all_reduce(sum, x, 0.5) is 0.5 * x, all_gather is the identity.
    ref = (0.5 * x).pow(2).sum() + (x * 2).sum()
    ref.backward()
    torch.testing.assert_close(y.cpu(), 0.5 * x.detach())
    torch.testing.assert_close(xl.grad.cpu(), x.grad)


def test_all_reduce_max_gradient_flows_where_the_max_was():
    x = torch.tensor([1.0, 5.0, 3.0])
    xl = x.to(dev).requires_grad_()
    xf.all_reduce("max", xl).sum().backward()
    torch.testing.assert_close(xl.grad.cpu(), torch.ones(3))  # one replica: every input is max


def test_distributed_mm_is_a_matmul_on_one_replica():
    w, x = torch.randn(5, 6), torch.randn(6, 4)
    out = xf.distributed_mm(w.to(dev), x.to(dev), split=2)
    torch.testing.assert_close(out.cpu(), w @ x, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="rows"):
        xf.distributed_mm(w.to(dev), torch.randn(5, 4, device=dev))


def test_sync_batch_norm_matches_batch_norm():
    torch.manual_seed(0)
    x = torch.randn(8, 3, 5, 5)
    bn = xf.SyncBatchNorm(3).to(dev)
    out = bn(x.to(dev))
    mean = x.mean(dim=(0, 2, 3))
    var = x.var(dim=(0, 2, 3), unbiased=False)
    ref = F.batch_norm(x, None, None, training=True, eps=1e-5)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    # torch_xla's running stats: momentum 0.1 toward the batch mean and the biased variance.
    torch.testing.assert_close(bn.running_mean.cpu(), 0.1 * mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var.cpu(), 0.9 + 0.1 * var, rtol=1e-5, atol=1e-6)
    bn.eval()
    ev = bn(x.to(dev)).cpu()
    ref_ev = (x - bn.running_mean.cpu().view(1, 3, 1, 1)) / torch.sqrt(
        bn.running_var.cpu().view(1, 3, 1, 1) + 1e-5
    )
    torch.testing.assert_close(ev, ref_ev, rtol=1e-4, atol=1e-4)


def test_scan_gru_matches_nn_gru():
    batch_first = True
    torch.manual_seed(0)
    ref = torch.nn.GRU(4, 6, num_layers=2, batch_first=batch_first).double()
    gru = GRU(4, 6, num_layers=2, batch_first=batch_first).double()
    gru.load_state_dict(ref.state_dict())
    x = torch.randn(5, 3, 4, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 5, 6, dtype=torch.float64)  # (layers, batch, hidden); batch is dim 0
    out, hn = ref(x, h0)
    (out.sum() + hn.pow(2).sum()).backward()
    gru.to(dev)
    xl = x.detach().to(dev).requires_grad_()
    out2, hn2 = gru(xl, h0.to(dev))
    (out2.sum() + hn2.pow(2).sum()).backward()
    torch.testing.assert_close(out2.cpu(), out)
    torch.testing.assert_close(hn2.cpu(), hn)
    torch.testing.assert_close(xl.grad.cpu(), x.grad)
    for (name, p), p2 in zip(ref.named_parameters(), gru.parameters()):
        torch.testing.assert_close(p2.grad.cpu(), p.grad, msg=name)


def test_scan_gru_falls_back_for_bidirectional_and_cpu(caplog):
    g = GRU(4, 6, bidirectional=True)  # torch_xla's behaviour: PyTorch's GRU, with a warning
    assert not isinstance(g, GRU) and isinstance(g, torch.nn.GRU) and g.bidirectional
    assert "falls back" in caplog.text
    torch.manual_seed(0)
    ref = torch.nn.GRU(4, 6)
    scan_gru = GRU(4, 6)
    scan_gru.load_state_dict(ref.state_dict())
    x = torch.randn(5, 2, 4)
    torch.testing.assert_close(scan_gru(x)[0], ref(x)[0])  # CPU input: PyTorch's kernel


def test_alias_patches_nn_gru():
    import lazyxla.compat

    torch_gru = torch.nn.GRU
    lazyxla.compat.install()
    try:
        assert torch.nn.GRU is GRU and torch.nn.GRU._orig is torch_gru
    finally:
        lazyxla.compat.uninstall()
    assert torch.nn.GRU is torch_gru


def test_call_jax_values_and_cache():
    a, b = torch.randn(3, 4), torch.randn(3, 4)

    def f(x, y, *, scale):
        return {"s": x + jnp.sin(y) * scale, "t": (x @ y.T,)}

    out = xb.call_jax(f, (a.to(dev), b.to(dev)), {"scale": 2.0})
    torch.testing.assert_close(out["s"].cpu(), a + torch.sin(b) * 2.0)
    torch.testing.assert_close(out["t"][0].cpu(), a @ b.T, rtol=1e-5, atol=1e-5)
    before = xb._jax_to_xla_computation_cache_elements()
    lazyxla.sync()
    met.clear_all()
    for _ in range(3):
        x, y = torch.randn(3, 4, device=dev), torch.randn(3, 4, device=dev)
        (xb.call_jax(f, (x, y), {"scale": 2.0})["s"] * 3).sum().cpu()
    assert xb._jax_to_xla_computation_cache_elements() == before  # traced once
    assert met.counter_value("UncachedCompile") == 1


def test_call_jax_rejects_cpu_tensors():
    with pytest.raises(TypeError, match="lazyxla device"):
        xb.call_jax(jnp.sin, (torch.ones(2),))


def test_assume_pure_values_grads_and_one_compile():
    from lazyxla.experimental.assume_pure import PureModule, assume_pure

    @assume_pure
    def f(a, b):
        return torch.sin(a @ b) * 2

    met.clear_all()
    for _ in range(3):
        a = torch.randn(3, 3, requires_grad=True)
        al = a.detach().to(dev).requires_grad_()
        out = f(al, al)
        out.sum().backward()
        lazyxla.sync()
        ref = torch.sin(a @ a) * 2
        ref.sum().backward()
        torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(al.grad.cpu(), a.grad, rtol=1e-5, atol=1e-5)
    assert met.counter_value("UncachedCompile") == 1  # the step's graph: traced and built once

    torch.manual_seed(0)
    ref_mod = torch.nn.Linear(3, 2)
    pure = PureModule(torch.nn.Linear(3, 2))
    pure._module.load_state_dict(ref_mod.state_dict())
    pure.to(dev)
    x = torch.randn(4, 3)
    out = pure(x.to(dev))
    out.sum().backward()
    ref_mod(x).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref_mod(x).detach())
    torch.testing.assert_close(pure._module.weight.grad.cpu(), ref_mod.weight.grad)


def test_assume_pure_rng_seed_argument_gives_the_seeds_numbers_on_every_call():
    from lazyxla.experimental.assume_pure import assume_pure

    def add_rand(a):
        return a * 2 + torch.rand_like(a)

    f = assume_pure(add_rand, add_rng_seed_argument=True)
    x = torch.randn(4, 4)
    a = x.to(dev)
    with pytest.raises(AssertionError, match="rng_seed"):
        f(a)
    with pytest.raises(TypeError, match="rng_seed must be an int"):
        f(a, rng_seed=0.5)
    lazyxla.manual_seed(7)
    first = f(a, rng_seed=0).cpu()  # the tracing call
    met.clear_all()
    again = f(a, rng_seed=0).cpu()  # replays
    other = f(a, rng_seed=1).cpu()
    from_tensor = f(a, rng_seed=torch.tensor(1)).cpu()
    assert met.counter_value("UncachedCompile") in (None, 0)  # a new seed is new data only
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    torch.testing.assert_close(other, from_tensor, rtol=0, atol=0)
    assert not torch.equal(first, other)
    noise = first - x * 2  # the deterministic part is eager's; the noise is uniform [0, 1)
    assert bool(((noise >= 0) & (noise < 1)).all())
    # The caller's RNG stream is its own: seeded calls neither reset nor advance it.
    lazyxla.manual_seed(7)
    want = torch.rand(3, device=dev).cpu()
    lazyxla.manual_seed(7)
    f(a, rng_seed=3)
    torch.testing.assert_close(torch.rand(3, device=dev).cpu(), want, rtol=0, atol=0)
