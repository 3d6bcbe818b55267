"""torch_xla._dynamo.dynamo_backend2 (the FX graph as one lazy node per call) against eager CPU:
in-place updates, random ops, training gradients, outputs left pending, one compile for new
data; and dynamo_bridge.alias_with_buffer_donor_config's set/restore semantics."""

from __future__ import annotations

import copy

import torch
from torch import nn

import lazyxla
from lazyxla._dynamo import dynamo_backend2
from lazyxla._dynamo.dynamo_bridge import alias_with_buffer_donor_config
from lazyxla._src.dynamo import get_alias_with_buffer_donor
from lazyxla._src.tensor import state
from lazyxla.debug import metrics

DEV = lazyxla.device()


def setup_function():
    torch._dynamo.reset()


def test_in_place_update_matches_eager():
    def inplace_update(a):
        a += 1
        return a

    f = torch.compile(inplace_update, backend=dynamo_backend2.dynamo_backend, fullgraph=True)
    t = torch.tensor([0, 1, 2], device=DEV)
    for _ in range(10):
        t = f(t)
    assert torch.equal(t.cpu(), torch.tensor([10, 11, 12]))


def test_outputs_stay_pending_and_new_data_compiles_nothing():
    def fn(x, y):
        return torch.tanh(x @ y) + 1

    f = torch.compile(fn, backend=dynamo_backend2.dynamo_backend, fullgraph=True)
    xs = [torch.randn(3, 4) for _ in range(3)]
    y = torch.randn(4, 2)
    ly = y.to(DEV)
    f(xs[0].to(DEV), ly).cpu()
    metrics.clear_all()
    for x in xs[1:]:
        out = f(x.to(DEV), ly)
        assert state(out).is_pending  # one node in the lazy graph, not executed yet
        torch.testing.assert_close(out.cpu(), fn(x, y), rtol=1e-5, atol=1e-5)
    assert (metrics.counter_value("UncachedCompile") or 0) == 0


def test_random_ops_differ_each_call():
    def random_op(a):
        return torch.randn(5, 5, device=a.device) + a

    f = torch.compile(random_op, backend=dynamo_backend2.dynamo_backend, fullgraph=True)
    t = torch.randn(5, 5).to(DEV)
    r1, r2, r3 = (f(t).cpu() for _ in range(3))
    assert not torch.allclose(r1, r2) and not torch.allclose(r2, r3)


def test_training_step_gradients_match_eager():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    lazy = copy.deepcopy(cpu).to(DEV)
    compiled = torch.compile(lazy, backend=dynamo_backend2.dynamo_backend)
    for _ in range(2):
        x, y = torch.randn(6, 4), torch.randn(6, 2)
        nn.functional.mse_loss(cpu(x), y).backward()
        loss = nn.functional.mse_loss(compiled(x.to(DEV)), y.to(DEV))
        loss.backward()
        for p, q in zip(lazy.parameters(), cpu.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


def test_alias_with_buffer_donor_config_sets_and_restores():
    assert get_alias_with_buffer_donor() is False
    with alias_with_buffer_donor_config() as saved:
        assert saved is False and get_alias_with_buffer_donor() is True
        with alias_with_buffer_donor_config(False) as inner:
            assert inner is True and get_alias_with_buffer_donor() is False
        assert get_alias_with_buffer_donor() is True
    assert get_alias_with_buffer_donor() is False
    try:
        with alias_with_buffer_donor_config():
            raise KeyError("boom")
    except KeyError:
        pass
    assert get_alias_with_buffer_donor() is False
