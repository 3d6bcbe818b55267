"""torch_xla.distributed.fsdp.utils: the patched nn.Linear (Note [Patched nn.Linear]) and
checkpoint_module, forward and backward against eager."""

import copy

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla._src import fsdp_utils
from lazyxla.core import xla_model as xm
from lazyxla.distributed.fsdp.utils import apply_xla_patch_to_nn_linear, checkpoint_module

dev = lazyxla.device()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 4, bias=False)
    ).double()


@pytest.mark.parametrize("shape", [(5, 6), (2, 3, 6)])
def test_patched_linear_matches_eager_forward_and_backward(shape):
    ref = _model()
    lazy = apply_xla_patch_to_nn_linear(copy.deepcopy(ref).to(dev))
    assert all(
        getattr(m.forward, "__func__", None) is fsdp_utils._xla_patched_nn_linear_forward
        for m in lazy.modules()
        if isinstance(m, torch.nn.Linear)
    )
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    xl = x.detach().to(dev).requires_grad_()
    ref(x).pow(2).sum().backward()
    out = lazy(xl)
    out.pow(2).sum().backward()
    torch.testing.assert_close(out.cpu(), ref(x).detach())
    torch.testing.assert_close(xl.grad.cpu(), x.grad)
    for p, q in zip(lazy.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad)


def test_patch_reaches_the_forward_checkpoint_module_wraps():
    ref = _model()
    lazy = copy.deepcopy(ref).to(dev)
    for m in lazy:
        if isinstance(m, torch.nn.Linear):
            checkpoint_module(m)
    apply_xla_patch_to_nn_linear(lazy)
    first = lazy[0]
    assert first._xla_checkpointed_forward_original.__func__ is (
        fsdp_utils._xla_patched_nn_linear_forward
    )
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    xl = x.detach().to(dev).requires_grad_()
    ref(x).sum().backward()
    lazy(xl).sum().backward()
    torch.testing.assert_close(xl.grad.cpu(), x.grad)
    torch.testing.assert_close(lazy[0].weight.grad.cpu(), ref[0].weight.grad)


def test_already_replaced_forwards_are_left_alone():
    lin = torch.nn.Linear(2, 2).to(dev)

    def custom(x):
        return x

    lin.forward = custom
    apply_xla_patch_to_nn_linear(lin)
    assert lin.forward is custom


class Dropper(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.seen = []

    def forward(self, x, *, scale=1.0):
        out = F.dropout(self.fc(x), p=0.5, training=True) * scale
        xm.add_step_closure(lambda o: self.seen.append(o.cpu()), args=(out,))
        return out


def test_checkpoint_module_reruns_the_whole_forward_with_the_same_mask():
    model = checkpoint_module(Dropper().to(dev))
    x = torch.randn(8, 16).to(dev).requires_grad_()
    model(x, scale=2.0).sum().backward()
    lazyxla.sync()
    assert len(model.seen) == 2  # the forward ran again in the backward
    torch.testing.assert_close(model.seen[0], model.seen[1])
    # eager's gradient for the mask used: d/dx sum(dropout(fc(x)) * 2) = (mask * 2 / 0.5) @ W
    mask = (model.seen[0] != 0).double()
    expect = (mask * 4) @ model.fc.weight.detach().cpu().double()
    torch.testing.assert_close(x.grad.cpu().double(), expect, rtol=1e-5, atol=1e-5)


def test_checkpoint_module_without_grad_inputs_runs_plainly():
    model = checkpoint_module(torch.nn.Linear(3, 2).to(dev))
    with torch.no_grad():
        out = model(torch.ones(1, 3, device=dev))
    assert out.shape == (1, 2)


def test_debug_collectives_on_one_replica():
    t = torch.arange(6.0).reshape(3, 2).to(dev)
    torch.testing.assert_close(fsdp_utils.dummy_all_gather(t, dim=1).cpu(), t.cpu())
    torch.testing.assert_close(fsdp_utils.dummy_all_reduce("sum", t, scale=0.5).cpu(), t.cpu() / 2)
    got = []
    rs = fsdp_utils.DummyReduceScatter(shard_count=1)
    rs(t, got.append)
    torch.testing.assert_close(got[0].cpu(), t.cpu())
    bucket = fsdp_utils.BucketizedReduceScatter(0, 1, None, True)
    bucket(t, got.append)
    torch.testing.assert_close(got[1].cpu(), t.cpu())
    with pytest.raises(ValueError, match="world size"):
        fsdp_utils.DummyReduceScatter(shard_count=2)
