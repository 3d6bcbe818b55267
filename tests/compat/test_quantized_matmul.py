"""torch_xla.experimental.xla_quantized_matmul (Note [Quantized matmul]): the lazyxla kernel of
`torch.ops.xla.quantized_matmul` against the eager reference and against the dequantized float
matmul, per-channel and blockwise, symmetric and asymmetric, with and without activation
quantization; the mixed-type dot in the HLO; XlaQuantizedLinear eagerly, lazily and under
torch.compile; one compile for new data; errors for bad weights."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import lazyxla
from lazyxla._src import debug
from lazyxla.debug import metrics
from lazyxla.experimental.xla_quantized_matmul import XlaQuantizedLinear, quantized_matmul

DEV = lazyxla.device()
qmm = torch.ops.xla.quantized_matmul


def _per_channel(out_dim, in_dim, dtype=torch.float32, asymmetric=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-128, 128, (out_dim, in_dim), dtype=torch.int8, generator=g)
    scale = (torch.rand(out_dim, generator=g) * 0.02 + 0.001).to(dtype)
    zp = (torch.randn(out_dim, generator=g) * 0.1).to(dtype) if asymmetric else None
    return w, scale, zp


def _blockwise(in_dim, out_dim, block, asymmetric=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-128, 128, (in_dim // block, block, out_dim), dtype=torch.int8, generator=g)
    scale = torch.rand(in_dim // block, out_dim, generator=g) * 0.02 + 0.001
    zp = torch.randn(in_dim // block, out_dim, generator=g) * 0.1 if asymmetric else None
    return w, scale, zp


def _lazy(*ts):
    return [None if t is None else t.to(DEV) for t in ts]


@pytest.mark.parametrize("asymmetric", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_channel_weight_only_matches_eager_and_dequantized(dtype, asymmetric):
    w, scale, zp = _per_channel(8, 16, dtype, asymmetric)
    x = torch.randn(2, 3, 16).to(dtype)
    ref = qmm(x, w, scale, zp)
    # The reference is the dequantized matmul: W[o, i] = w[o, i] * scale[o] - zp[o].
    w_dq = w.double() * scale.double()[:, None]
    if zp is not None:
        w_dq = w_dq - zp.double()[:, None]
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref.double(), x.double() @ w_dq.T, **tol)
    out = qmm(*_lazy(x, w, scale, zp))
    assert out.dtype == ref.dtype and out.shape == (2, 3, 8)
    torch.testing.assert_close(out.cpu(), ref, **tol)


@pytest.mark.parametrize("asymmetric", [False, True])
def test_per_channel_activation_quantization_matches_eager(asymmetric):
    w, scale, zp = _per_channel(8, 16, asymmetric=asymmetric, seed=1)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    ref = qmm(x, w, scale, zp, quantize_activation=True)
    out = qmm(*_lazy(x, w, scale, zp), quantize_activation=True)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-4)
    # int8 activations lose little: close to the weight-only result, relative to its magnitude.
    weight_only = qmm(x, w, scale, zp)
    torch.testing.assert_close(ref, weight_only, rtol=0, atol=0.05 * weight_only.abs().max())


def test_activation_that_rounds_to_128_wraps_as_in_eager():
    # bf16 x / (max / 127) can round to 128: eager's int8 cast wraps it to -128.
    x = torch.tensor([[-0.6484, 0.1885, 0.3867, -0.3379, -0.1904]], dtype=torch.bfloat16)
    w, scale, _ = _per_channel(4, 5, torch.bfloat16, seed=2)
    ref = qmm(x, w, scale, quantize_activation=True)
    out = qmm(*_lazy(x, w, scale), quantize_activation=True)
    torch.testing.assert_close(out.cpu(), ref)


@pytest.mark.parametrize("asymmetric", [False, True])
def test_blockwise_matches_eager_and_dequantized(asymmetric):
    w, scale, zp = _blockwise(12, 8, 4, asymmetric)
    x = torch.randn(3, 12)
    ref = qmm(x, w, scale, zp, block_size=4)
    w_dq = w.double() * scale.double()[:, None, :]
    if zp is not None:
        w_dq = w_dq - zp.double()[:, None, :]
    torch.testing.assert_close(ref.double(), x.double() @ w_dq.reshape(12, 8), rtol=1e-5, atol=1e-5)
    out = qmm(*_lazy(x, w, scale, zp), block_size=4)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)


def test_hlo_has_the_mixed_type_dot():
    w, scale, _ = _per_channel(8, 5, torch.bfloat16)
    x = torch.randn(3, 5, dtype=torch.bfloat16)
    out = qmm(*_lazy(x, w, scale))
    assert re.search(r"bf16\[3,8\].* dot\(bf16\[3,5\].*, s8\[8,5\]", debug.hlo_text([out]))
    out = qmm(*_lazy(x, w, scale), quantize_activation=True)
    assert re.search(r"s32\[3,8\].* dot\(s8\[3,5\].*, s8\[8,5\]", debug.hlo_text([out]))


def test_int4_weight_is_an_s4_dot_and_warns_on_cpu():
    w = torch.randint(-8, 8, (4, 2), dtype=torch.int8)
    scale = torch.randn(4).to(torch.bfloat16)
    x = torch.ones(3, 2, dtype=torch.bfloat16)
    with pytest.warns(UserWarning, match="no int4 dot"):
        out = qmm(*_lazy(x, w, scale), int4_weight=True)
    assert re.search(r"bf16.* dot\(bf16.*, s4\[4,2\]", debug.hlo_text([out]))
    del out  # (it cannot run on CPU: a later sync would try)
    # Blockwise int4 needs no s4 dot: it runs on CPU, equal to eager.
    wb, sb, _ = _blockwise(6, 8, 2)
    wb = wb.clamp(-8, 7)
    xb = torch.rand(3, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = qmm(*_lazy(xb, wb, sb), block_size=2, int4_weight=True)
    torch.testing.assert_close(got.cpu(), qmm(xb, wb, sb, block_size=2, int4_weight=True))


def test_module_eager_lazy_and_compiled():
    torch.manual_seed(0)
    w, scale, zp = _per_channel(8, 6, asymmetric=True, seed=3)
    q = XlaQuantizedLinear(6, 8, is_symmetric=False)
    q.load_quantized_weight(w, scale, zp)
    x = torch.randn(5, 6)
    with torch.no_grad():
        ref = q(x)
        q = q.to(DEV)
        assert q.weight.device.type == DEV.type and q.zero_point.device.type == DEV.type
        torch.testing.assert_close(q(x.to(DEV)).cpu(), ref, rtol=1e-5, atol=1e-5)
        compiled = torch.compile(q, backend="lazyxla")
        torch.testing.assert_close(compiled(x.to(DEV)).cpu(), ref, rtol=1e-5, atol=1e-5)


def test_new_data_compiles_once():
    w, scale, _ = _per_channel(8, 16)
    lw, ls = _lazy(w, scale)
    qmm(torch.randn(2, 16).to(DEV), lw, ls).cpu()
    metrics.clear_all()
    a = qmm(torch.randn(2, 16).to(DEV), lw, ls).cpu()
    b = qmm(torch.randn(2, 16).to(DEV), lw, ls).cpu()
    assert not torch.equal(a, b)
    assert (metrics.counter_value("UncachedCompile") or 0) == 0


def test_bad_weights_are_refused_with_torch_xla_messages():
    x = torch.randn(2, 6).to(DEV)
    with pytest.raises(AssertionError, match="Weight dtype is expected to be torch.int8"):
        qmm(x, torch.ones(8, 6).to(DEV), torch.ones(8).to(DEV))
    with pytest.raises(AssertionError, match=r"Weight shape is expected to be \[output_dim"):
        qmm(x, torch.ones(8, 5, dtype=torch.int8).to(DEV), torch.ones(8).to(DEV))
    with pytest.raises(AssertionError, match="does not support activation quantization"):
        w, s, _ = _blockwise(6, 8, 2)
        qmm(x, *_lazy(w, s), block_size=2, quantize_activation=True)
    q = XlaQuantizedLinear(6, 8, block_size=4)
    with pytest.raises(AssertionError, match="divisible by block_size"):
        q.load_quantized_weight(torch.ones(1, 4, 8, dtype=torch.int8), torch.ones(1, 8))
    assert quantized_matmul is not None
