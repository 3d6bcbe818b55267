"""A training loop is one graph from its first step: the optimizer state a first step creates as
zeros is read as data (Note [A state's first value is data]) and a sync numbers its outputs in
graph order (Note [Roots in graph order]). Values against eager, in float64 so that no tolerance
depends on the CPU's rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla._src import graph
from lazyxla.debug import metrics
from lazyxla.models import Decoder, DecoderConfig

dev = lazyxla.device()


def _compiles() -> int:
    return metrics.counter_value("UncachedCompile") or 0


@pytest.mark.parametrize("name", ["AdamW", "Adam", "RMSprop", "Adagrad", "NAdam"])
def test_a_training_loop_compiles_one_graph_from_its_first_step(name):
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=64, dim=32, n_layers=1, max_seq_len=16)
    ref = Decoder(cfg).double()
    model = Decoder(cfg).double()
    model.load_state_dict(ref.state_dict())
    model.to(dev)
    opts = [getattr(torch.optim, name)(m.parameters(), lr=1e-2) for m in (ref, model)]
    x = torch.randint(0, 64, (4, 16))
    xd = x.to(dev)
    lazyxla.sync(wait=True)
    graph.CACHE.clear()  # (a graph another test compiled would be a cache hit here)
    before = _compiles()
    for step in range(3):
        for m, opt, inp in ((ref, opts[0], x), (model, opts[1], xd)):
            opt.zero_grad()
            F.cross_entropy(m(inp).reshape(-1, 64), inp.reshape(-1)).backward()
            opt.step()
        lazyxla.sync(wait=True)
        # step 1 created the state from zeros; steps 2 and 3 run the same graph
        assert _compiles() - before == 1, f"step {step + 1}"
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-9, atol=1e-12)
    for sa, sb in zip(opts[1].state.values(), opts[0].state.values()):
        for k in sb:
            torch.testing.assert_close(torch.as_tensor(sa[k]).cpu(), torch.as_tensor(sb[k]))


def _data_inputs() -> int:
    return len(graph.Capture(graph.pending_states(None)).data)


def test_a_fill_written_in_place_is_data_and_one_only_read_is_a_constant():
    x = torch.arange(6.0, dtype=torch.float64)
    xd = x.to(dev)
    lazyxla.sync()
    read_only = xd + torch.zeros(6, dtype=torch.float64, device=dev)
    assert _data_inputs() == 1  # xd: the zeros stay a constant
    torch.testing.assert_close(read_only.cpu(), x)
    acc = torch.zeros(6, dtype=torch.float64, device=dev)
    acc.add_(xd)
    assert _data_inputs() == 2  # xd and acc's first value
    torch.testing.assert_close(acc.cpu(), x)

    def masked(t: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(6, dtype=torch.float64, device=dev)
        mask[:3] = 1  # written in place, then gone by the sync: a constant, no upload
        return t * mask

    out = masked(xd)
    assert _data_inputs() == 1
    torch.testing.assert_close(out.cpu(), x * torch.tensor([1.0, 1, 1, 0, 0, 0], dtype=x.dtype))


def test_marked_fills_keep_every_reader_and_view_right():
    x = torch.arange(6.0, dtype=torch.float64)
    xd = x.to(dev)
    lazyxla.sync()
    z = torch.ones(6, dtype=torch.float64, device=dev)
    before = z * 2  # reads the fill before it is written
    view = z[1:4]
    z.add_(xd)  # marks the fill
    view.mul_(3)  # written through a view of the written tensor
    buf = torch.zeros(2, 3, dtype=torch.float64, device=dev)
    buf[1].copy_(xd[:3])  # the first write is through a view
    want_z = torch.ones(6, dtype=torch.float64) + x
    want_z[1:4] *= 3
    want_buf = torch.zeros(2, 3, dtype=torch.float64)
    want_buf[1] = x[:3]
    lazyxla.sync()
    torch.testing.assert_close(before.cpu(), torch.full((6,), 2.0, dtype=torch.float64))
    torch.testing.assert_close(z.cpu(), want_z)
    torch.testing.assert_close(view.cpu(), want_z[1:4])
    torch.testing.assert_close(buf.cpu(), want_buf)


def test_marked_fills_with_buffer_donation(monkeypatch):
    from lazyxla._src.config import FLAGS

    monkeypatch.setattr(FLAGS, "donate_buffers", True)
    x = torch.arange(4.0, dtype=torch.float64)
    xd = x.to(dev)
    lazyxla.sync()
    acc = torch.zeros(4, dtype=torch.float64, device=dev)
    for _ in range(3):
        acc.add_(xd)
        lazyxla.sync()
    torch.testing.assert_close(acc.cpu(), 3 * x)
    torch.testing.assert_close(xd.cpu(), x)
