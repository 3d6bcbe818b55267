"""Memory-efficient attention: F.scaled_dot_product_attention and torch_xla's flash_attention on
lazyxla, against eager (float64 references), with XLA's memory analysis of the compiled graphs.
See Note [Blockwise attention]."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla._src import attention, sharding
from lazyxla.experimental.custom_kernel import flash_attention

dev = lazyxla.device()
# float32 against a float64 reference: a few ulps of the largest value, accumulated over Sk.
TOL = dict(rtol=1e-5, atol=2e-5)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 16 keys, so small sequences take several blocks (and a padded last one)."""
    monkeypatch.setattr(attention, "BLOCK_K", 16)


def _lazy(ts):
    return [t.detach().to(dev).requires_grad_(t.requires_grad) for t in ts]


def _assert_matches(out, grads, ref, ref_grads):
    """Lazy output and gradients against the float64 reference's, within float32 rounding."""
    torch.testing.assert_close(out.cpu().double(), ref.detach(), **TOL)
    for got, exp in zip(grads, ref_grads):
        torch.testing.assert_close(got.cpu().double(), exp.double(), **TOL)


def _sdpa_case(q, k, v, mask=None, **kw):
    """sdpa on lazyxla vs float64 eager: output and gradients of q, k, v (and a float mask)."""
    ins = [t for t in (q, k, v, mask) if t is not None]
    want = [i for i, t in enumerate(ins) if t.dtype != torch.bool]
    leaves = [t.detach().double().requires_grad_() if t.dtype != torch.bool else t for t in ins]
    ref = F.scaled_dot_product_attention(*leaves[:3], attn_mask=(leaves + [None])[3], **kw)
    g = torch.randn(ref.shape, dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, [leaves[i] for i in want], g)
    lz = _lazy(ins)
    for i in want:
        lz[i].requires_grad_()
    out = F.scaled_dot_product_attention(*lz[:3], attn_mask=(lz + [None])[3], **kw)
    grads = torch.autograd.grad(out, [lz[i] for i in want], g.float().to(dev))
    _assert_matches(out, grads, ref, ref_grads)


CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "scale": dict(scale=0.3),
    "bool_mask": dict(mask="bool"),
    "float_mask_grad": dict(mask="float"),
    "gqa_causal": dict(hk=2, enable_gqa=True, is_causal=True),
    "cross_lengths": dict(sq=19, sk=45),
    "fully_masked_rows": dict(mask="rows"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sdpa_matches_eager(name, small_blocks):
    torch.manual_seed(0)
    c = dict(CASES[name])
    sq, sk, hk = c.pop("sq", 37), c.pop("sk", 37), c.pop("hk", 4)
    q = torch.randn(2, 4, sq, 8)
    k, v = torch.randn(2, hk, sk, 8), torch.randn(2, hk, sk, 8)
    mask = c.pop("mask", None)
    if mask == "bool":
        mask = torch.rand(sq, sk) > 0.4
    elif mask == "float":
        mask = torch.randn(2, 1, sq, sk)
    elif mask == "rows":
        mask = torch.rand(2, 1, sq, sk) > 0.5
        mask[:, :, 3] = False  # eager's math path gives 0 for a row with nothing to attend to
    for t in (q, k, v):
        t.requires_grad_()
    met.clear_all()
    _sdpa_case(q, k, v, mask, **c)
    assert met.counter_value("xla::flash_attention_fwd") == 1
    assert met.counter_value("xla::flash_attention_bwd") == 1
    assert not met.counter_value("xla::_softmax")


def test_sdpa_3d_and_one_block():
    torch.manual_seed(1)
    q, k, v = (torch.randn(3, 20, 16, requires_grad=True) for _ in range(3))
    _sdpa_case(q, k, v)


def test_sdpa_bf16_close_to_eager():
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 2, 40, 16, dtype=torch.bfloat16) for _ in range(3))
    out = F.scaled_dot_product_attention(*_lazy([q, k, v]), is_causal=True)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert out.dtype == torch.bfloat16
    # one bf16 rounding of the output (eager's own bf16 kernel is no closer)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-2, atol=1e-2)


def test_sdpa_compiles_once_for_new_values():
    met.clear_all()
    for _ in range(2):
        q = torch.randn(1, 2, 24, 8, device=dev)
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        lazyxla.sync()
    assert met.counter_value("UncachedCompile") == 1
    assert met.counter_value("CachedCompile") == 1
    assert out.shape == (1, 2, 24, 8)


def test_sdpa_dropout_keeps_the_math_path():
    q = torch.randn(1, 2, 8, 4, device=dev)
    met.clear_all()
    out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert not met.counter_value("xla::flash_attention_fwd")
    assert torch.isfinite(out.cpu()).all()


@pytest.mark.parametrize("mask_rank", [2, 4])
def test_sdpa_math_path_bool_masks_are_eagers(mask_rank):
    """Calls the blockwise kernel does not take run PyTorch's math kernel, which adds its mask:
    a bool mask must arrive converted (False to -inf), as PyTorch's composite converts it.
    Unconverted, True and False were added as 1 and 0 (Falcon's multi-query attention: one key
    head for four query heads without enable_gqa, logits 0.16 off eager's). A fully masked row
    gives 0, as eager's; the gradients of q, k and v match too."""
    torch.manual_seed(3)
    q = torch.randn(2, 4, 12, 8, requires_grad=True)
    k, v = (torch.randn(2, 1, 12, 8, requires_grad=True) for _ in range(2))
    mask = torch.tril(torch.ones(12, 12, dtype=torch.bool))
    mask[5] = False
    if mask_rank == 4:  # (batch-expanded, as transformers' masks are)
        mask = mask[None, None].expand(2, 1, 12, 12)
    assert not attention.use_blockwise_sdpa(q, k, v, mask, 0.0, False)
    _sdpa_case(q, k, v, mask)


def test_sdpa_dropout_bool_mask_attends_only_where_true():
    """With dropout (the math path) a bool mask that lets each query see one key gives that key's
    value, scaled by 1 / (1 - p), or 0 where dropped: nothing of the masked keys leaks in."""
    torch.manual_seed(4)
    q, k = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    v = torch.randn(1, 2, 6, 4)
    one = torch.eye(6, dtype=torch.bool).roll(1, dims=1)  # query i sees key i + 1 only
    out = F.scaled_dot_product_attention(*_lazy([q, k, v]), attn_mask=one.to(dev), dropout_p=0.5)
    out = out.cpu()
    seen = v[:, :, one.nonzero()[:, 1]] * 2.0  # (1, 2, 6, 4): the one key's value, kept
    kept = (out != 0).all(-1, keepdim=True)
    assert torch.equal(out, torch.where(kept, seen, torch.zeros(())))
    assert kept.any() and not kept.all()


def test_sdpa_errors_are_eagers():
    q = torch.randn(1, 2, 8, 4, device=dev)
    m = torch.ones(8, 8, dtype=torch.bool, device=dev)
    with pytest.raises(RuntimeError, match="attn_mask should not be set when is_causal"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=m, is_causal=True)


def _temp_bytes(fn, s):
    """Compiled temp bytes of a training step's attention (forward + backward) at sequence s."""
    q = torch.randn(1, 2, s, 32, device=dev, requires_grad=True)
    lazyxla.sync()
    fn(q, q, q).sum().backward()
    m = lazyxla.debug.memory_analysis([q.grad])
    lazyxla.sync()
    return m.temp_bytes


def _naive(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / 8.0, -1) @ v


def test_flash_temp_memory_linear_naive_quadratic(monkeypatch):
    """XLA's memory analysis (deterministic for a given XLA): doubling the sequence doubles
    flash attention's temp bytes and quadruples naive attention's. Blocks of 64 keys keep the
    sizes small here; bench/large_models.py has the table at 512..4096 with the default block."""
    monkeypatch.setattr(attention, "BLOCK_K", 64)
    flash = [_temp_bytes(F.scaled_dot_product_attention, s) for s in (256, 512, 1024)]
    naive = [_temp_bytes(_naive, s) for s in (256, 512, 1024)]
    for a, b in zip(flash, flash[1:]):
        assert 1.6 < b / a < 2.4, flash
    for a, b in zip(naive, naive[1:]):
        assert b / a > 3.2, naive
    assert flash[-1] * 4 < naive[-1]


# --- torch_xla's flash_attention ------------------------------------------------------------------


def _ref(q, k, v, causal=False, qs=None, kvs=None, sm=1.0, ab=None):
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-2, -1)) * sm
    if ab is not None:
        s = s + ab.double()
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    if qs is not None:
        s = s.masked_fill(qs[:, None, :, None] != kvs[:, None, None, :], -math.inf)
    return torch.softmax(s, -1) @ v


FA_CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "sm_scale": dict(sm=0.25),
    "ab": dict(ab=True),
    "segment_ids": dict(seg=True),
    "gqa_causal_segments": dict(hk=1, causal=True, seg=True),
}


@pytest.mark.parametrize("name", list(FA_CASES))
def test_flash_attention_matches_reference(name, small_blocks):
    torch.manual_seed(3)
    c = FA_CASES[name]
    s = 40
    q = torch.randn(2, 2, s, 8, requires_grad=True)
    k, v = (torch.randn(2, c.get("hk", 2), s, 8, requires_grad=True) for _ in range(2))
    ab = torch.randn(2, 2, s, s, requires_grad=True) if c.get("ab") else None
    seg = torch.tensor([[0] * 15 + [1] * 25, [0] * 40]) if c.get("seg") else None
    causal, sm = c.get("causal", False), c.get("sm", 1.0)
    ref = _ref(q, k, v, causal, seg, seg, sm, ab)
    ins = [q, k, v] + ([ab] if ab is not None else [])
    g = torch.randn(ref.shape, dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, ins, g)
    lz = _lazy(ins)
    lseg = None if seg is None else seg.to(dev)
    out = flash_attention(
        lz[0], lz[1], lz[2], causal, lseg, lseg, sm, ab=lz[3] if ab is not None else None
    )
    grads = torch.autograd.grad(out, lz, g.float().to(dev))
    _assert_matches(out, grads, ref, ref_grads)


def test_flash_attention_on_cpu_tensors_is_the_reference():
    q, k, v = (torch.randn(1, 2, 12, 4) for _ in range(3))
    torch.testing.assert_close(
        flash_attention(q, k, v, True).double(), _ref(q, k, v, True), rtol=1e-6, atol=1e-6
    )


def test_flash_attention_clear_errors(monkeypatch):
    monkeypatch.setattr(sharding, "_global_mesh", None)  # an earlier test may have set one
    q = torch.randn(1, 2, 8, 4, device=dev)
    with pytest.raises(ValueError, match=r"q must be \[batch, heads, seq, head_dim\]"):
        flash_attention(q[0], q, q)
    with pytest.raises(ValueError, match="both q_segment_ids and kv_segment_ids"):
        flash_attention(q, q, q, False, torch.zeros(1, 8, device=dev))
    with pytest.raises(ValueError, match="kv heads must divide q heads"):
        flash_attention(q, torch.randn(1, 3, 8, 4, device=dev), q)
    with pytest.raises(ValueError, match="needs a mesh"):
        flash_attention(q, q, q, partition_spec=(0, None, None, None))


@pytest.fixture
def spmd():
    sharding.use_spmd()
    yield
    sharding._leave_spmd_for_tests()


def test_flash_attention_partition_spec_runs_per_shard(spmd):
    import lazyxla.distributed.spmd as xs

    mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
    spec = ("data", "model", None, None)
    torch.manual_seed(4)
    q, k, v = (torch.randn(4, 4, 32, 8, requires_grad=True) for _ in range(3))
    ref = _ref(q, k, v, True, sm=0.5)
    ref_grads = torch.autograd.grad(ref.sum(), [q, k, v])
    lz = _lazy([q, k, v])
    for t in lz:
        xs.mark_sharding(t, mesh, spec)
    out = flash_attention(*lz, causal=True, sm_scale=0.5, partition_spec=spec, mesh=mesh)
    assert "sdy.manual_computation" in lazyxla.debug.stablehlo_text([out])
    grads = torch.autograd.grad(out.sum(), lz)
    _assert_matches(out, grads, ref, ref_grads)


def test_sdpa_under_torch_compile():
    f = torch.compile(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), backend="lazyxla"
    )
    a = torch.randn(2, 2, 40, 8)
    out = f(*_lazy([a, a, a]))
    ref = F.scaled_dot_product_attention(a.double(), a.double(), a.double(), is_causal=True)
    torch.testing.assert_close(out.cpu().double(), ref, **TOL)


@pytest.mark.parametrize("name", ["gqa_causal_segments", "ab"])
def test_double_backward_matches_reference(name):
    """create_graph=True (a gradient penalty): the second derivative through flash_attention and
    sdpa equals float64 eager math attention (the backward is recomputed differentiably)."""
    torch.manual_seed(5)
    c = FA_CASES[name]
    s = 12
    q = torch.randn(2, 2, s, 8, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(2, c.get("hk", 2), s, 8, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    ab = torch.randn(2, 2, s, s, dtype=torch.float64, requires_grad=True) if c.get("ab") else None
    seg = torch.tensor([[0] * 5 + [1] * 7, [0] * 12]) if c.get("seg") else None
    causal = c.get("causal", False)
    ins = [q, k, v] + ([ab] if ab is not None else [])

    def penalty(ins, out):
        first = torch.autograd.grad(out.sin().sum(), ins, create_graph=True)
        return sum((gr * (i + 1)).pow(2).sum() for i, gr in enumerate(first))

    ref_grads = torch.autograd.grad(penalty(ins, _ref(q, k, v, causal, seg, seg, 0.5, ab)), ins)
    lz = _lazy(ins)
    lseg = None if seg is None else seg.to(dev)
    out = flash_attention(*lz[:3], causal, lseg, lseg, 0.5, ab=lz[3] if ab is not None else None)
    grads = torch.autograd.grad(penalty(lz, out), lz)
    for got, exp in zip(grads, ref_grads):
        torch.testing.assert_close(got.cpu(), exp, rtol=1e-9, atol=1e-9)
    # F.scaled_dot_product_attention takes the same kernel.
    if ab is None and seg is None:
        lz = _lazy(ins)
        out = F.scaled_dot_product_attention(*lz, is_causal=causal, scale=0.5, enable_gqa=True)
        for got, exp in zip(torch.autograd.grad(penalty(lz, out), lz), ref_grads):
            torch.testing.assert_close(got.cpu(), exp, rtol=1e-9, atol=1e-9)


def test_double_backward_with_partition_spec_is_refused():
    sharding.use_spmd()
    try:
        import lazyxla.distributed.spmd as xs

        mesh = xs.Mesh(np.arange(8), (8,), ("data",))
        q = torch.randn(8, 2, 8, 4, device=dev, requires_grad=True)
        out = flash_attention(q, q, q, partition_spec=("data", None, None, None), mesh=mesh)
        with pytest.raises(NotImplementedError, match="double backward"):
            torch.autograd.grad(out.sum(), q, create_graph=True)
        (g,) = torch.autograd.grad(out.sum(), q)  # a first-order backward still works
        assert g.shape == q.shape
    finally:
        sharding._leave_spmd_for_tests()


def _encoder(batch_first: bool, norm: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=batch_first)
    return torch.nn.TransformerEncoder(
        layer, 2, norm=torch.nn.LayerNorm(8) if norm else None, enable_nested_tensor=True
    ).eval()


FASTPATH = {
    # (eager CPU takes the nested-tensor path: padded positions come back zero, before the norm)
    "encoder_padding_mask": lambda m, x, pad: m(x, src_key_padding_mask=pad),
    "encoder_float_padding_mask": lambda m, x, pad: m(
        x, src_key_padding_mask=torch.zeros(pad.shape, device=x.device).masked_fill(pad, -1e9)
    ),
    "encoder_causal_and_padding": lambda m, x, pad: m(
        x,
        mask=torch.nn.Transformer.generate_square_subsequent_mask(5, device=x.device),
        src_key_padding_mask=pad,
        is_causal=True,
    ),
    # (not left-aligned: eager's encoder takes its standard path, padded positions are computed)
    "encoder_right_aligned_mask": lambda m, x, pad: m(x, src_key_padding_mask=pad.flip(-1)),
    "encoder_no_mask": lambda m, x, pad: m(x),
    "layer_padding_mask": lambda m, x, pad: m.layers[0](x, src_key_padding_mask=pad),
    "mha_padding_mask": lambda m, x, pad: m.layers[0].self_attn(x, x, x, key_padding_mask=pad),
    "mha_by_keyword": lambda m, x, pad: m.layers[0].self_attn(
        query=x, key=x, value=x, key_padding_mask=pad
    ),
    "layer_by_keyword": lambda m, x, pad: m.layers[0](src=x, src_key_padding_mask=pad),
}


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("name", list(FASTPATH))
def test_transformer_inference_fast_path_as_eager(name, norm, batch_first):
    """Note [Transformer fast path]: in inference, PyTorch's MultiheadAttention and
    TransformerEncoder(Layer) take fused kernels and nested tensors on the CPU and on any
    PrivateUse1 device; on lazyxla they run lowered ops, with eager's values (padded positions
    included) and no CPU fallback. With a padding mask the encoder failed on lazyxla."""
    model = _encoder(batch_first, norm)
    lazy_model = _encoder(batch_first, norm).to(lazyxla.device())
    x = torch.randn(2, 5, 8) if batch_first else torch.randn(5, 2, 8)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    met.clear_all()
    with torch.no_grad():
        want = FASTPATH[name](model, x, pad)
        got = FASTPATH[name](lazy_model, x.to(lazyxla.device()), pad.to(lazyxla.device()))
    for w, g in zip(
        want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)
    ):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)
    assert not met.cpu_fallback_ops()


def test_transformer_fast_path_patch_is_transparent_to_dynamo():
    """The replaced forwards are inlined by torch.compile (they live outside lazyxla._src, which
    dynamo skips once the lazyxla backend is registered): a CPU encoder compiles as one graph
    with no break, as it does without lazyxla."""
    from lazyxla._src import dynamo  # noqa: F401  (registers the skip rules)

    model = _encoder(batch_first=True, norm=True)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    torch._dynamo.reset()
    with torch.no_grad():
        info = torch._dynamo.explain(lambda x: model(x, src_key_padding_mask=pad))(
            torch.randn(2, 5, 8)
        )
    assert info.graph_count == 1 and not info.break_reasons, info.break_reasons
