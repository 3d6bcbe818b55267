"""`torch.prod`'s gradient on lazy tensors with nothing read on the host (Note [Product
gradients without a sync]): eager's values for inputs with no, one and several zeros, double
backward, and eager's own path where a dispatch mode watches."""

import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met

dev = lazyxla.device()
INPUTS = {
    "no_zero": [[1.5, 0.5, 2.0], [1.0, -3.0, 3.0]],
    "one_zero": [[1.5, 0.0, 2.0], [1.0, -3.0, 3.0]],
    "zeros_in_a_row": [[0.0, -0.0, 2.0], [1.0, -3.0, 3.0]],
    "zeros_in_rows": [[0.0, 2.0, -1.0], [3.0, -0.5, 0.0]],
}
PRODS = {
    "all": lambda t: t.prod(),
    "dim": lambda t: t.prod(1),
    "dim0_keepdim": lambda t: t.prod(0, keepdim=True),
    "negative_dim": lambda t: t.prod(-1),
    "dtype": lambda t: t.prod(1, dtype=torch.float64),
}
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _grads(fn, values, dtype, device):
    x = torch.tensor(values).to(dtype).to(device).requires_grad_()
    y = fn(x)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad((g * g).sum(), x)
    return y.detach().cpu(), g.detach().cpu(), gg.cpu()


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("values", list(INPUTS))
@pytest.mark.parametrize("fn", list(PRODS))
def test_prod_gradients_match_eager_with_no_sync(fn, values, dtype):
    met.clear_counters()
    y, g, gg = _grads(PRODS[fn], INPUTS[values], dtype, dev)
    fallbacks = [k for k in met.counter_names() if k.startswith("aten::") and "scalar" not in k]
    assert not fallbacks  # (eager's own formula reads the zeros: `nonzero` on the CPU fallback)
    assert met.counter_value("xla::where")  # the branches are selected on the device
    ey, eg, egg = _grads(PRODS[fn], INPUTS[values], dtype, "cpu")
    # the first derivative rounds as eager's (the same ops), zeros' signs included; the second
    # sums its terms in another order (autograd's), within rounding
    assert torch.equal(y, ey) and torch.equal(g, eg) and torch.equal(g.signbit(), eg.signbit())
    torch.testing.assert_close(gg, egg, rtol=TOL[dtype], atol=TOL[dtype])


def test_full_product_with_two_zeros_is_eagers_plain_zeros():
    """Outside a differentiable backward eager returns zeros_like for two or more zeros: +0.0
    where the zero-safe products would give -0.0."""
    x = torch.tensor([0.0, -0.0, -2.0], requires_grad=True)
    xd = x.detach().to(dev).requires_grad_()
    (g,) = torch.autograd.grad(xd.prod(), xd)
    (eg,) = torch.autograd.grad(x.prod(), x)
    assert torch.equal(g.cpu(), eg) and not g.cpu().signbit().any()


def test_trace_once_takes_eagers_path():
    fn = torch.compile(lambda t: t.prod(1).sum(), backend="lazyxla")
    x = torch.tensor(INPUTS["one_zero"], dtype=torch.float64, requires_grad=True)
    xd = x.detach().to(dev).requires_grad_()
    (g,) = torch.autograd.grad(fn(xd), xd)
    (eg,) = torch.autograd.grad(x.prod(1).sum(), x)
    torch.testing.assert_close(g.cpu(), eg)
