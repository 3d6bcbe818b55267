"""NN ops that training touches (softmax, losses, embedding, norms, conv, pooling): fwd + bwd."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from util import DEV, assert_same, check, leaf, to_cpu, to_lazy

import lazyxla
import lazyxla.debug.metrics as met


def rnd(*shape, seed=0, grad=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).requires_grad_(grad)


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax_log_softmax(dim):
    x = rnd(3, 5, 4)
    check(lambda v: F.softmax(v, dim), x)
    check(lambda v: F.log_softmax(v, dim), x)


def test_softmax_bf16_and_dtype_arg():
    check(lambda v: F.softmax(v, -1), rnd(3, 6, dtype=torch.bfloat16))
    check(lambda v: F.log_softmax(v, -1, dtype=torch.float32), rnd(3, 6, dtype=torch.bfloat16))


TARGET = torch.tensor([1, 0, 4, 4, 2, 3])


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"reduction": "sum"},
        {"reduction": "none"},
        {"ignore_index": 4},
        {"ignore_index": 4, "reduction": "sum"},
        {"weight": torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0])},
        {"weight": torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0]), "ignore_index": 1},
    ],
    ids=["mean", "sum", "none", "ignore", "ignore_sum", "weight", "weight_ignore"],
)
def test_nll_loss(kw):
    check(lambda x, t: F.nll_loss(F.log_softmax(x, -1), t, **kw), rnd(6, 5), TARGET)


def test_nll_loss_float_target_reads_class_indices_as_torch_xla(monkeypatch):
    """Note [Float class targets]: under the torch_xla alias a float target (eager refuses it) is
    truncated to class indices, forward and backward; the reference is eager with the int64
    target. Without the alias, eager's error."""
    from lazyxla._src import compat

    x = rnd(6, 5)
    logp = F.log_softmax(x.detach(), -1)
    for bad in (torch.zeros(6), torch.zeros(6, dtype=torch.int32)):
        with pytest.raises(RuntimeError) as eager_err:
            F.nll_loss(logp, bad)
        with pytest.raises(RuntimeError) as lazy_err:
            F.nll_loss(logp.to(DEV), bad.to(DEV))
        assert str(lazy_err.value) == str(eager_err.value)
    byte = torch.tensor([0, 1, 4, 3, 2, 0], dtype=torch.uint8)  # eager takes Byte targets
    assert_same(F.nll_loss(logp.to(DEV), byte.to(DEV)), F.nll_loss(logp, byte))
    monkeypatch.setattr(compat, "is_installed", lambda: True)
    ft = torch.tensor([0.0, 1.7, 4.0, 3.2, 2.0, 0.9])
    xl = x.detach().to(DEV).requires_grad_()
    got = F.nll_loss(F.log_softmax(xl, -1), ft.to(DEV))
    got.backward()
    xe = x.detach().requires_grad_()
    want = F.nll_loss(F.log_softmax(xe, -1), ft.long())
    want.backward()
    assert_same(got, want)
    assert_same(xl.grad, xe.grad)
    img = rnd(2, 3, 4, 4)
    t2 = torch.randint(0, 3, (2, 4, 4)).float()
    assert_same(
        F.nll_loss(F.log_softmax(img.to(DEV), 1), t2.to(DEV)),
        F.nll_loss(F.log_softmax(img, 1), t2.long()),
    )


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"ignore_index": 4},
        {"label_smoothing": 0.1},
        {"label_smoothing": 0.2, "ignore_index": 4},
        {"label_smoothing": 0.1, "reduction": "sum"},
        {"weight": torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0]), "label_smoothing": 0.1},
        {"reduction": "none", "ignore_index": 0},
    ],
    ids=["plain", "ignore", "smooth", "smooth_ignore", "smooth_sum", "weight_smooth", "none"],
)
def test_cross_entropy(kw):
    check(lambda x, t: F.cross_entropy(x, t, **kw), rnd(6, 5), TARGET)


def test_cross_entropy_all_ignored_and_spatial():
    t = torch.full((6,), -100)
    check(lambda x, tt: F.cross_entropy(x, tt), rnd(6, 5), t)
    t2 = torch.tensor([[[0, 2], [1, 1]], [[2, 0], [-100, 1]]])
    check(lambda x, tt: F.cross_entropy(x, tt), rnd(2, 3, 2, 2), t2)


def test_cross_entropy_probability_targets():
    p = torch.softmax(rnd(6, 5, seed=1, grad=False), -1)
    check(lambda x, tt: F.cross_entropy(x, tt, label_smoothing=0.05), rnd(6, 5), p)


def test_bf16_logits_cross_entropy():
    check(lambda x, t: F.cross_entropy(x.float(), t), rnd(6, 5, dtype=torch.bfloat16), TARGET)


@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 0, 3])
def test_embedding(padding_idx, scale_grad_by_freq):
    """(scale_grad_by_freq divides each row's gradient by its index's count in the batch: index 3
    occurs three times here)"""
    idx = torch.tensor([[0, 3, 3, 1], [2, 0, 5, 3]])
    check(
        lambda w, i: F.embedding(
            i, w, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq
        ),
        rnd(6, 4),
        idx,
    )


def test_embedding_module_grad_accumulates_repeated_indices():
    emb = torch.nn.Embedding(5, 3, padding_idx=1)
    idx = torch.tensor([1, 1, 2, 2, 2, 4])
    lz = torch.nn.Embedding(5, 3, padding_idx=1).to("jax:0")
    lz.load_state_dict({k: v.clone() for k, v in emb.state_dict().items()})  # see to_lazy
    emb(idx).pow(2).sum().backward()
    lz(idx.to("jax:0")).pow(2).sum().backward()
    assert_same(lz.weight.grad, emb.weight.grad)


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(affine):
    x = rnd(2, 3, 8)
    if affine:
        w, b = rnd(8, seed=1), rnd(8, seed=2)
        check(lambda v, ww, bb: F.layer_norm(v, (8,), ww, bb, 1e-5), x, w, b)
        check(lambda v, ww: F.layer_norm(v, (3, 8), ww.expand(3, 8), None), x, w)
    else:
        check(lambda v: F.layer_norm(v, (8,)), x)


def test_layer_norm_bf16():
    x = rnd(4, 16, dtype=torch.bfloat16)
    w = rnd(16, seed=1, dtype=torch.bfloat16)
    check(lambda v, ww: F.layer_norm(v, (16,), ww), x, w, grad=False)


def test_layer_norm_bf16_backward():
    """Eager CPU saves bf16 mean/rstd for a bf16 layer_norm (meta says float32): lazyxla follows
    CPU, so the backward sees the same rounded statistics."""
    x = rnd(4, 16, dtype=torch.bfloat16)
    w = rnd(16, seed=1, dtype=torch.bfloat16)
    check(lambda v, ww: F.layer_norm(v, (16,), ww), x, w)


@pytest.mark.parametrize("eps", [None, 1e-6])
def test_rms_norm(eps):
    x = rnd(2, 3, 8)
    torch.manual_seed(0)
    m = torch.nn.RMSNorm(8, eps=eps)
    with torch.no_grad():
        m.weight.mul_(rnd(8, seed=1, grad=False))
    ml = torch.nn.RMSNorm(8, eps=eps).to("jax:0")
    ml.load_state_dict({k: v.clone() for k, v in m.state_dict().items()})  # see to_lazy
    xc, xl = leaf(x), to_lazy(leaf(x))
    yc, yl = m(xc), ml(xl)
    assert_same(yl, yc)
    g = rnd(2, 3, 8, seed=5, grad=False)
    yc.backward(g)
    yl.backward(g.to("jax:0"))
    assert_same(xl.grad, xc.grad)
    assert_same(ml.weight.grad, m.weight.grad)


def test_rms_norm_functional_no_weight():
    check(lambda v: F.rms_norm(v, (4, 8)), rnd(2, 4, 8))


CONVS = {
    "basic": dict(),
    "stride2": dict(stride=2),
    "pad1": dict(padding=1),
    "pad_same": dict(padding="same"),
    "dilation2": dict(dilation=2, padding=2),
    "stride_pad_asym": dict(stride=(2, 1), padding=(1, 0)),
    "groups2": dict(groups=2),
    "depthwise": dict(groups=4, padding=1),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_conv2d(name):
    kw = CONVS[name]
    groups = kw.get("groups", 1)
    cout = 4 if groups != 4 else 8
    x = rnd(2, 4, 7, 6)
    w = rnd(cout, 4 // groups, 3, 3, seed=1)
    b = rnd(cout, seed=2)
    check(lambda v, ww, bb: F.conv2d(v, ww, bb, **kw), x, w, b)


def test_conv2d_no_bias_and_conv1d():
    check(
        lambda v, ww: F.conv2d(v, ww, stride=2, padding=1), rnd(1, 3, 5, 5), rnd(2, 3, 3, 3, seed=1)
    )
    check(lambda v, ww: F.conv1d(v, ww, padding=1), rnd(2, 3, 8), rnd(4, 3, 3, seed=1))


def test_conv_transpose2d():
    check(
        lambda v, ww: F.conv_transpose2d(v, ww, stride=2, padding=1, output_padding=1),
        rnd(1, 4, 4, 4),
        rnd(4, 2, 3, 3, seed=1),
    )


POOLS = {
    "max_k2": lambda x: F.max_pool2d(x, 2),
    "max_k3s2p1": lambda x: F.max_pool2d(x, 3, stride=2, padding=1),
    "max_ceil": lambda x: F.max_pool2d(x, 2, ceil_mode=True),
    "max_dilation": lambda x: F.max_pool2d(x, 2, dilation=2),
    "max_indices": lambda x: F.max_pool2d(x, 3, 2, return_indices=True),
    "avg_k2": lambda x: F.avg_pool2d(x, 2),
    "avg_k3s2p1": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1),
    "avg_no_pad_count": lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
    "avg_ceil": lambda x: F.avg_pool2d(x, 2, ceil_mode=True),
    "avg_divisor": lambda x: F.avg_pool2d(x, 2, divisor_override=3),
    "adaptive_avg_1": lambda x: F.adaptive_avg_pool2d(x, 1),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pool2d(name):
    g = torch.Generator().manual_seed(0)
    x = (torch.randperm(2 * 3 * 7 * 7, generator=g).float() / 100).reshape(2, 3, 7, 7)
    check(POOLS[name], x.requires_grad_())


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "transposed"])
def test_max_unpool2d_keeps_eager_layout(layout):
    """Eager's CPU kernel allocates the unpooled output in the input's suggested memory format:
    a channels_last input unpools to channels_last (PyTorch's meta kernel says contiguous)."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randperm(2 * 3 * 8 * 8, generator=g).float() / 100).reshape(2, 3, 8, 8)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.transpose(2, 3)

    def unpool(x):
        y, i = F.max_pool2d(x, 2, return_indices=True)
        return F.max_unpool2d(y, i, 2)

    out_l, out_c = check(unpool, x.requires_grad_())
    assert out_l.stride() == out_c.stride()


@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_module(train):
    torch.manual_seed(0)
    m = torch.nn.BatchNorm2d(3, momentum=0.2)
    with torch.no_grad():
        m.weight.copy_(rnd(3, seed=1, grad=False))
        m.bias.copy_(rnd(3, seed=2, grad=False))
        m.running_mean.copy_(rnd(3, seed=3, grad=False))
        m.running_var.copy_(rnd(3, seed=4, grad=False).abs() + 0.5)
    ml = torch.nn.BatchNorm2d(3, momentum=0.2).to("jax:0")
    ml.load_state_dict({k: v.clone() for k, v in m.state_dict().items()})  # see to_lazy
    m.train(train)
    ml.train(train)
    for step in range(2):
        x = rnd(4, 3, 5, 5, seed=10 + step)
        xc, xl = leaf(x), to_lazy(leaf(x))
        yc, yl = m(xc), ml(xl)
        assert_same(yl, yc)
        g = rnd(4, 3, 5, 5, seed=20 + step, grad=False)
        yc.backward(g)
        yl.backward(g.to("jax:0"))
        assert_same(xl.grad, xc.grad)
    assert_same(ml.weight.grad, m.weight.grad)
    assert_same(ml.bias.grad, m.bias.grad)
    sd_l, sd_c = to_cpu(ml.state_dict()), m.state_dict()
    for k in sd_c:
        assert_same(sd_l[k], sd_c[k], exact=k == "num_batches_tracked")


def test_batch_norm_functional_no_affine():
    x = rnd(4, 3, 5)
    rm, rv = torch.zeros(3), torch.ones(3)
    rml, rvl = to_lazy(rm), to_lazy(rv)
    yc = F.batch_norm(x, rm, rv, training=True, momentum=0.1)
    yl = F.batch_norm(to_lazy(x), rml, rvl, training=True, momentum=0.1)
    assert_same(yl, yc)
    assert_same((rml, rvl), (rm, rv))
    check(lambda v: F.batch_norm(v, None, None, training=True), x)


def test_dropout_p0_and_eval_exact():
    x = rnd(4, 8)
    check(lambda v: F.dropout(v, 0.0, training=True), x, exact=True)
    check(lambda v: F.dropout(v, 0.5, training=False), x, exact=True)


def test_mse_and_misc_losses():
    a, b = rnd(3, 4), rnd(3, 4, seed=1)
    check(lambda x, y: F.mse_loss(x, y), a, b)
    check(lambda x, y: F.mse_loss(x, y, reduction="sum"), a, b)
    check(lambda x, y: F.l1_loss(x, y), a, b)
    check(lambda x, y: F.smooth_l1_loss(x, y), a, b)
    y01 = torch.rand(3, 4, generator=torch.Generator().manual_seed(2))
    check(lambda x, y: F.binary_cross_entropy_with_logits(x, y), a, y01)


def test_scaled_dot_product_attention():
    q, k, v = rnd(2, 2, 4, 8), rnd(2, 2, 4, 8, seed=1), rnd(2, 2, 4, 8, seed=2)
    check(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample(mode, padding):
    """Grid points reach 20% past the border, so every padding rule is exercised; align_corners
    alternates over the cases (the OpInfo sweep runs the rest)."""
    align_corners = (mode == "nearest") == (padding == "zeros")
    x = rnd(2, 3, 6, 7)
    g = torch.rand(2, 4, 5, 2, generator=torch.Generator().manual_seed(1)) * 2.4 - 1.2
    g.requires_grad_()
    check(
        lambda v, gg: F.grid_sample(v, gg, mode, padding, align_corners),
        x,
        g,
        rtol=1e-5,
        atol=1e-4,  # bicubic's grid gradient sums 16 taps of magnitude ~10
    )


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("size", [(7, 5), (30, 40)])
def test_interpolate_antialias(mode, size):
    """Antialiased resize (torchvision's default for tensors): down- and upsampling, fwd + bwd."""
    check(lambda v: F.interpolate(v, size=size, mode=mode, antialias=True), rnd(2, 3, 17, 13))


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("mode", ["linear", "bilinear", "bicubic", "trilinear"])
def test_float64_interpolate_indexes_in_float64(mode, align_corners):
    """Eager computes the source index and weights in double for float64 images: in float32 a
    scale of 1/1.7 put ~15 % of the outputs ~1e-6 (relative) off, 10^9 float64 ulps."""
    nd = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}[mode]
    x = torch.randn(2, 3, *([5] * nd), dtype=torch.float64)
    for kw in (dict(scale_factor=1.7), dict(size=(7,) * nd)):
        f = lambda v: F.interpolate(v, mode=mode, align_corners=align_corners, **kw)  # noqa: E731
        assert_same(f(to_lazy(x)), f(x), rtol=1e-12, atol=1e-12)


def _passes_reference(x, size, **kw):
    """A uint8 resize as eager's fixed-point kernel defines it (Note [Resampling uint8]): the
    last dim then the other, each pass in float64, rounded half up and clamped to 0..255 (eager's
    own uint8 result depends on the CPU: its generic, non-AVX2 kernel truncates the weights)."""

    def rounded(y):
        return torch.floor(y + 0.5).clamp(0, 255)

    y = rounded(F.interpolate(x.double(), size=(x.shape[2], size[1]), **kw))
    return rounded(F.interpolate(y, size=size, **kw)).to(torch.uint8)


@pytest.mark.parametrize("antialias", [False, True], ids=["plain", "antialias"])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("size", [(13, 17), (70, 45)])
def test_interpolate_uint8_images(mode, size, antialias):
    """uint8 resizes were computed with the weights cast to uint8 (0): each output was a source
    pixel's neighbour, 98 % of a 270x270 -> 130x130 resize wrong by up to 255."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (2, 3, 40, 31), dtype=torch.uint8, generator=g)
    kw = dict(mode=mode, antialias=antialias, align_corners=False)
    out = F.interpolate(x.to(DEV), size=size, **kw).cpu()
    ref = _passes_reference(x, size, **kw)
    assert out.dtype == torch.uint8 and out.shape == ref.shape
    diff = (out.int() - ref.int()).abs()
    # (float32 weights against float64: a sum near .5 can round the other way)
    assert diff.max() <= 1 and (diff > 0).float().mean() < 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.5])
def test_embedding_max_norm_renorms_in_the_graph(dtype, norm_type):
    """nn.Embedding(max_norm=...) renorms the rows it looks up, in place, each once, as eager's
    kernel (it ran through the CPU fallback: a sync and a round trip of the table per call).
    A bf16 norm of another order than 1 or 2 is a reduction of powers whose bf16 rounding is
    eager's own: there the renormed rows may differ by one bf16 ulp."""
    import lazyxla.debug.metrics as met

    exact = dtype != torch.bfloat16 or norm_type in (1.0, 2.0)
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=2**-7, atol=0)

    torch.manual_seed(0)
    weight = (torch.randn(10, 6) * 2).to(dtype)
    idx = torch.tensor([[1, 4, 1], [9, 0, 4]])
    outs = []
    met.clear_all()
    for d in ("cpu", DEV):
        w = weight.clone().to(d)
        out = torch.nn.functional.embedding(idx.to(d), w, max_norm=1.5, norm_type=norm_type)
        outs.append((out.cpu(), w.cpu()))
    torch.testing.assert_close(outs[1][0], outs[0][0], **tol)
    torch.testing.assert_close(outs[1][1], outs[0][1], **tol)
    assert not torch.equal(outs[0][1], weight)  # some rows were renormed
    assert met.counter_value("aten::embedding_renorm_") is None


@pytest.mark.parametrize("dim", [0, -1, 2])
def test_weight_norm_is_lowered_like_eager(dim):
    """nn.utils.parametrizations.weight_norm (torch._weight_norm's fused interface, forward and
    backward: Note [Weight norm]) on a Conv1d, as wav2vec2's positional convolution uses it:
    output and the gradients of the direction and magnitude within float32 rounding of the
    float64 result, and nothing on the CPU fallback."""
    from torch.nn.utils.parametrizations import weight_norm

    import lazyxla.debug.metrics as met

    torch.manual_seed(0)
    conv = weight_norm(torch.nn.Conv1d(4, 6, 3), dim=dim)
    x = torch.randn(2, 4, 9)
    before = {k: met.counter_value(k) for k in met.counter_names() if k.startswith("aten::")}
    results = {}
    for name, (m, inp) in {
        "f64": (copy.deepcopy(conv).double(), x.double()),
        "lazy": (copy.deepcopy(conv).to(DEV), x.to(DEV)),
    }.items():
        out = m(inp)
        out.backward(
            torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape).to(inp.device)
        )
        p = m.parametrizations.weight
        results[name] = [out.detach().cpu().double()] + [
            t.grad.cpu().double() for t in (p.original0, p.original1)
        ]
    after = {k: met.counter_value(k) for k in met.counter_names() if k.startswith("aten::")}
    assert after == before
    for got, want in zip(results["lazy"], results["f64"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# Note [Embedding bags]: (indices, offsets) with an empty bag (offsets 3, 3) and repeated rows.
BAG_IDX = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 4])
BAG_OFFSETS = torch.tensor([0, 3, 3, 7])
BAGS = {
    "sum": dict(mode="sum"),
    "mean": dict(mode="mean"),
    "max": dict(mode="max"),
    "sum_padding": dict(mode="sum", padding_idx=4),
    "mean_padding": dict(mode="mean", padding_idx=4),
    "max_padding": dict(mode="max", padding_idx=4),
    # (the last offset is the end: eager's CPU max folds entries past it into the last bag)
    "sum_last_offset": dict(mode="sum", include_last_offset=True, offsets=[0, 3, 3, 7, 9]),
    "max_last_offset": dict(mode="max", include_last_offset=True, offsets=[0, 3, 3, 7, 9]),
}


@pytest.mark.parametrize("name", list(BAGS))
def test_embedding_bag_is_lowered_like_eager(name):
    """nn.EmbeddingBag ran through the CPU fallback forward and backward; lowered, each mode's
    output and weight gradient match eager's (max: ties to the first row), with no fallback."""
    kw = dict(BAGS[name])
    offsets = torch.tensor(kw.pop("offsets", BAG_OFFSETS.tolist()))
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(10, 5, generator=g)
    weight[2, 1] = weight[5, 1] = weight[1, 1]  # a tie in max mode
    met.clear_all()
    check(
        lambda w: F.embedding_bag(BAG_IDX.to(w.device), w, offsets.to(w.device), **kw),
        weight.requires_grad_(),
    )
    assert not met.cpu_fallback_ops()


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_scale_grad_by_freq_is_the_documented_one(mode):
    """Each row's gradient divided by its index's count in the batch (pytorch/pytorch#190063:
    eager's CPU kernel divides some rows by another index's count). The reference is the same
    bags built from `F.embedding(scale_grad_by_freq=True)` in float64."""
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(10, 5, generator=g, dtype=torch.float64)
    bag_of = torch.tensor([0, 0, 0, 2, 2, 2, 2, 3, 3])  # BAG_IDX's bags under BAG_OFFSETS
    sizes = torch.bincount(bag_of, minlength=4).clamp(min=1).double()

    ref_w = weight.clone().requires_grad_()
    rows = F.embedding(BAG_IDX, ref_w, scale_grad_by_freq=True)
    ref = torch.zeros(4, 5, dtype=torch.float64).index_add(0, bag_of, rows)
    if mode == "mean":
        ref = ref / sizes[:, None]
    cot = torch.randn(4, 5, generator=g, dtype=torch.float64)
    ref.backward(cot)

    w = weight.float().to(DEV).requires_grad_()
    out = F.embedding_bag(
        BAG_IDX.to(DEV), w, BAG_OFFSETS.to(DEV), mode=mode, scale_grad_by_freq=True
    )
    out.backward(cot.float().to(DEV))
    torch.testing.assert_close(out.detach().cpu().double(), ref.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w.grad.cpu().double(), ref_w.grad, rtol=1e-6, atol=1e-6)


def test_embedding_bag_per_sample_weights_and_2d_input():
    """Weighted sums (both gradients), and a 2-d input of fixed-size bags."""
    g = torch.Generator().manual_seed(1)
    check(
        lambda w, psw: F.embedding_bag(
            BAG_IDX.to(w.device), w, BAG_OFFSETS.to(w.device), per_sample_weights=psw, mode="sum"
        ),
        torch.randn(10, 5, generator=g).requires_grad_(),
        torch.rand(9, generator=g).requires_grad_(),
    )
    check(
        lambda w: F.embedding_bag(BAG_IDX[:8].view(4, 2).to(w.device), w, mode="max"),
        torch.randn(10, 5, generator=g).requires_grad_(),
    )


def test_embedding_bag_new_offsets_reuse_the_graph():
    """Bags are found from the offsets inside the graph: new offsets and indices of the same
    sizes are the same program."""
    bag = torch.nn.EmbeddingBag(10, 4, mode="mean").to(DEV)
    compiles = []
    for offsets in ([0, 3, 3, 7], [0, 1, 5, 8], [0, 2, 2, 2]):
        bag.zero_grad(set_to_none=True)
        met.clear_all()
        out = bag(BAG_IDX.to(DEV), torch.tensor(offsets).to(DEV))
        out.sum().backward()
        lazyxla.sync()
        compiles.append(met.counter_value("UncachedCompile") or 0)
    assert compiles[0] >= 1 and compiles[1:] == [0, 0], compiles
