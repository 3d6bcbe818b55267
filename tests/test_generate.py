"""Text generation: a decode loop compiles a bounded number of graphs and equals eager.

`model.generate()` reads a value each token (the stop check) while the KV cache is written in
place and the generated sequence grows by `cat`. A value read runs every pending tensor (Note
[What a value read syncs], graph.py), and a slice of a pending `cat` reads only its piece (Note
[Reading the tail of a cat], view_kernels.py), so with a static cache every token runs the same
graph; generate's small integer reads run on the host (Note [Small integer reads on the host]).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers
from util import TINY_DECODER

import lazyxla
from lazyxla.debug import metrics

transformers.logging.set_verbosity_error()
DEV = lazyxla.device()
VOCAB = 96


def _uncached() -> int:
    return metrics.counter_value("UncachedCompile") or 0


def _llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, **TINY_DECODER)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").eval()


def _generate(model: torch.nn.Module, ids: torch.Tensor, n: int, **kw) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            **kw,
        )
    return out.cpu()


def test_static_cache_decode_compiles_three_graphs_for_any_length():
    torch.manual_seed(0)
    model = _llama()
    ids = torch.randint(0, VOCAB, (1, 6))
    static = {"cache_implementation": "static"}
    ref5, ref11 = _generate(model, ids, 5, **static), _generate(model, ids, 11, **static)
    model.to(DEV)
    ids_d = ids.to(DEV)
    c0 = _uncached()
    out5 = _generate(model, ids_d, 5, **static)
    first = _uncached() - c0
    c1 = _uncached()
    out11 = _generate(model, ids_d, 11, **static)
    # The first call compiles the prefill and one decode graph for every token. generate's
    # setup reads (special tokens, the attention mask) and the returned sequence (a cat of the
    # new tokens) are answered on the host (Note [Small integer reads on the host]), and the
    # max-length criterion's `full(n, done)` lifts its bool (dispatch.STORES_SCALAR), so the last
    # token runs the same graph. Another length compiles nothing.
    assert first <= 3
    assert _uncached() - c1 == 0
    c2 = _uncached()
    again = _generate(model, ids_d, 11, **static)
    assert _uncached() == c2
    assert torch.equal(out5, ref5)
    assert torch.equal(out11, ref11)
    assert torch.equal(again, ref11)


@pytest.mark.parametrize("options", [None, {"sync": False}], ids=["sync", "no-sync"])
def test_compiled_decoding_step_equals_eager_with_graphs_independent_of_length(
    options, monkeypatch
):
    """transformers' automatic compilation of the decoding step with lazyxla's backend (its
    CompileConfig's default mode included): tokens equal eager's, and the graphs do not grow with
    the sequence. The compiled step's pending inputs ran in a full sync, which also ran the
    sequence's growing cat: two new graphs every token (47 compiles for 24 tokens)."""
    import torch._dynamo

    from lazyxla._src.config import FLAGS

    # Each compile's analysis (why, and how the graph differs from the last one compiled at its
    # line) goes to the captured stderr, which a failure prints: CI once saw one compile more in
    # the second call (no-sync) that no local run reproduces.
    monkeypatch.setattr(FLAGS, "debug_level", 1)
    torch._logging.set_logs(recompiles=True)  # (and dynamo's recompiles, to the captured log)
    try:
        _check_compiled_decoding(options)
    finally:
        torch._logging.set_logs()


def _check_compiled_decoding(options: dict | None) -> None:
    torch._dynamo.reset()
    model = _llama()
    ids = torch.tensor([[3, 14, 15, 9]])
    ref = _generate(model, ids, 10, cache_implementation="static")
    model.to(DEV)
    cc = transformers.CompileConfig(backend="lazyxla")
    if options is not None:
        cc = transformers.CompileConfig(backend="lazyxla", mode=None, options=options)
    cc._compile_all_devices = True
    kw = dict(cache_implementation="static", compile_config=cc)
    c0 = _uncached()
    out = _generate(model, ids.to(DEV), 10, **kw)
    first = _uncached() - c0
    assert torch.equal(out, ref)
    c1 = _uncached()
    assert torch.equal(_generate(model, ids.to(DEV), 10, **kw), ref)
    assert _uncached() == c1
    assert first <= 4, first  # prefill, the compiled step, reads around it: not one per token


def test_dynamic_cache_generate_equals_eager_with_one_graph_per_length():
    torch.manual_seed(0)
    model = _gpt2()
    ids = torch.randint(0, VOCAB, (1, 5))
    ref = _generate(model, ids, 6)
    model.to(DEV)
    c0 = _uncached()
    out = _generate(model, ids.to(DEV), 6)
    # The cache grows by a token each step: one graph per length, none that grows with the loop.
    assert _uncached() - c0 <= 6 + 4
    assert torch.equal(out, ref)
    c1 = _uncached()
    assert torch.equal(_generate(model, ids.to(DEV), 6), ref)
    assert _uncached() == c1


def test_read_in_a_loop_cuts_the_pending_state_each_iteration():
    """A buffer written in place and a sequence grown by cat, one value read per iteration: the
    loop runs one graph per iteration, equal to eager, and the same graph every iteration."""

    def loop(dev: str, n: int) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
        cache = torch.zeros(8, device=dev)
        seq = torch.arange(3, device=dev).view(1, 3).float()
        x = torch.ones(8, device=dev)
        reads = []
        for _ in range(n):
            last = seq[:, -1:]  # a slice of the growing cat reads only its last piece
            x = torch.tanh(x * 0.5 + last.squeeze(0))
            cache.mul_(0.9).add_(x)
            seq = torch.cat([seq, x[:1].view(1, 1) + seq[:, -1:]], dim=1)
            reads.append(float(x.sum()))  # the value read cuts cache, x and seq's new piece
        return cache.cpu(), seq.cpu(), reads

    ref = loop("cpu", 7)
    loop(DEV, 3)  # the first iterations compile
    c0 = _uncached()
    cache, seq, reads = loop(DEV, 7)
    assert _uncached() - c0 <= 1  # the final read of `seq`: a cat chain of this length
    torch.testing.assert_close(cache, ref[0])
    torch.testing.assert_close(seq, ref[1])
    assert reads == pytest.approx(ref[2], rel=1e-6)


def test_read_sync_walks_only_the_new_piece_of_a_growing_cat():
    """A sequence grown by cat and left pending over data: each read sync walks the moves above
    the last cut, not the whole chain (the walk grew with the sequence), and the sequence's value
    is unchanged."""
    from lazyxla._src import read_sync
    from lazyxla._src.tensor import state

    walked: list[int] = []
    orig = read_sync._move_graph

    def counting(v):
        order = orig(v)
        walked.append(len(order))
        return order

    def loop(dev: str, n: int) -> torch.Tensor:
        seq = torch.zeros(1, 1, device=dev)
        x = torch.ones(4, device=dev)
        for _ in range(n):
            x = torch.sin(x) + seq[:, -1]
            seq = torch.cat([seq, x[:1].view(1, 1)], dim=1)
            float(x.sum())
        return seq

    ref = loop("cpu", 40)
    read_sync._move_graph = counting
    try:
        seq = loop(DEV, 40)
        assert state(seq).is_pending  # still a chain of cats, not run
        per_read = walked[-10:]
    finally:
        read_sync._move_graph = orig
    assert max(per_read) <= 4, per_read  # was about twice the chain's length
    torch.testing.assert_close(seq.cpu(), ref)


def test_read_sync_all_can_be_turned_off():
    from lazyxla._src.config import FLAGS

    FLAGS.set("read_syncs_all", False)
    try:
        a = torch.ones(3, device=DEV) * 2
        b = a + 1
        assert b.sum().item() == 9.0
        from lazyxla._src.tensor import state

        assert state(a).is_pending  # torch_xla's policy: only what the read needs ran
    finally:
        FLAGS.set("read_syncs_all", True)
    c = torch.ones(3, device=DEV) * 2
    d = c + 1
    assert d.sum().item() == 9.0
    from lazyxla._src.tensor import state

    assert not state(c).is_pending
