"""torch.autocast on the lazyxla device ("jax") follows CUDA's policy; compare with CPU autocast."""

import copy

import pytest
import torch

import lazyxla

dev = lazyxla.device()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_matches_cpu_autocast(dtype):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    model = copy.deepcopy(ref).to(dev)
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=dtype):
        y_ref = ref(x)
    with torch.autocast("jax", dtype=dtype):
        y = model(x.to(dev))
        assert y.dtype == dtype
        probs = torch.softmax(y, -1)
        assert probs.dtype == torch.float32  # softmax runs in float32 under autocast
    y_ref.float().pow(2).mean().backward()
    y.float().pow(2).mean().backward()
    tol = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y.cpu().float(), y_ref.float(), **tol)
    assert model[0].weight.grad.dtype == torch.float32  # master weights stay float32
    torch.testing.assert_close(model[0].weight.grad.cpu(), ref[0].weight.grad, **tol)


def test_no_autocast_outside_the_region():
    y = torch.nn.functional.linear(torch.randn(2, 3).to(dev), torch.randn(4, 3).to(dev))
    assert y.dtype == torch.float32
