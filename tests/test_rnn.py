"""nn.LSTM / nn.GRU / their cells on lazyxla (the fused cells, Note [Fused RNN cells]): outputs
and gradients against a float64 reference, no farther from it than eager float32 is (Note
[Float64 reference] in test_models.py), and one compile for new data."""

from __future__ import annotations

import copy

import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met

dev = lazyxla.device()
F32_EPS = torch.finfo(torch.float32).eps


def _run(module: torch.nn.Module, x: torch.Tensor, device) -> tuple[torch.Tensor, list]:
    """Output and gradients (input first) of a weighted sum of the module's output."""
    m = copy.deepcopy(module).to(device)
    xd = x.detach().clone().to(device).requires_grad_()
    out = m(xd)
    out = out[0] if isinstance(out, tuple) else out
    if isinstance(out, tuple):  # LSTMCell: (h, c)
        out = out[0] + 0.5 * out[1]
    weights = torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype, device=device)
    (out * weights).sum().backward()
    grads = [xd.grad] + [p.grad for p in m.parameters()]
    assert all(g.dtype == x.dtype for g in [out, *grads])
    return out.detach().cpu().double(), [g.cpu().double() for g in grads]


def _check(make, x, dtype=torch.float32):
    """float32: as Note [Float64 reference]. bfloat16/float16: the float64 reference runs on the
    weights and input rounded to the dtype, and lazyxla may be 4x eager's error plus 2 ulps of the
    largest magnitude from it (Note [Low-precision criterion] in tests/ops/test_modules.py)."""
    torch.manual_seed(0)
    module = make()
    if dtype is torch.float32:
        ref_out, ref_grads = _run(module.double(), x.double(), "cpu")
        floor = 8 * F32_EPS
    else:
        ref_out, ref_grads = _run(
            copy.deepcopy(module).to(dtype).double(), x.to(dtype).double(), "cpu"
        )
        floor = 2 * torch.finfo(dtype).eps
    eager_out, eager_grads = _run(module.to(dtype), x.to(dtype), "cpu")
    lazy_out, lazy_grads = _run(module.to(dtype), x.to(dtype), dev)

    def ok(lazy, eager, ref):
        eager_err = (eager - ref).abs().max().item()
        lazy_err = (lazy - ref).abs().max().item()
        assert lazy_err <= 4 * eager_err + floor * ref.abs().max().item(), (
            lazy_err,
            eager_err,
        )

    ok(lazy_out, eager_out, ref_out)
    assert len(lazy_grads) == len(ref_grads)
    for lazy, eager, ref in zip(lazy_grads, eager_grads, ref_grads):
        ok(lazy, eager, ref)


DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["float32", "bfloat16", "float16"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
def test_lstm_and_gru_match_float64_like_eager(cls, bias, dtype):
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(1))
    _check(lambda: cls(8, 16, num_layers=2, batch_first=True, bias=bias), x, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
def test_bidirectional_with_projection_free_shapes(cls, dtype):
    x = torch.randn(6, 2, 4, generator=torch.Generator().manual_seed(2))  # (seq, batch, feature)
    _check(lambda: cls(4, 8, bidirectional=True), x, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("cls", [torch.nn.LSTMCell, torch.nn.GRUCell])
def test_cells(cls, dtype):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    _check(lambda: cls(8, 16), x, dtype)


def test_lstm_training_compiles_once_and_runs_no_op_on_the_cpu():
    torch.manual_seed(0)
    model = torch.nn.LSTM(8, 16, batch_first=True).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(4)
    met.clear_all()
    compiles = []
    for _ in range(3):
        x = torch.randn(2, 5, 8, generator=gen).to(dev)
        opt.zero_grad()
        model(x)[0].square().mean().backward()
        opt.step()
        lazyxla.sync()
        compiles.append(met.counter_value("UncachedCompile"))
    assert compiles[2] == compiles[1]  # new data, same graph: no compile
    assert not met.cpu_fallback_ops()
