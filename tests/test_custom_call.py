"""torch_xla's `stablehlo_custom_call` (Note [Custom calls]) and `xla_marker` (Note [Pattern
markers]) on lazyxla."""

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla._src.debug import stablehlo_text
from lazyxla.experimental.mark_pattern_utils import StableHLOCompositeBuilder
from lazyxla.experimental.stablehlo_custom_call import stablehlo_custom_call
from lazyxla.experimental.xla_marker import serialize_composite_attr

dev = lazyxla.device()


def test_custom_call_to_an_xla_target_runs():
    x = torch.arange(6.0).to(dev)
    y = stablehlo_custom_call(
        [x],
        "annotate_device_placement",
        [x.shape],
        [x.dtype],
        has_side_effect=True,
        frontend_attributes={"_xla_buffer_placement": "device"},
    )
    text = stablehlo_text([y * 2])
    assert "stablehlo.custom_call @annotate_device_placement" in text
    assert "has_side_effect = true" in text
    assert '_xla_buffer_placement = "device"' in text
    assert torch.equal((y * 2).cpu(), torch.arange(6.0) * 2)


def test_custom_call_emits_what_was_asked_and_unknown_targets_fail_at_compile():
    x = torch.ones(3).to(dev)
    a, b = stablehlo_custom_call(
        [x, x], "my_target", [(2,), (3, 1)], [torch.int32, torch.float32], backend_config="cfg",
        api_version=2,
    )  # fmt: skip
    assert (a.shape, a.dtype, b.shape, b.dtype) == ((2,), torch.int32, (3, 1), torch.float32)
    text = stablehlo_text([a, b])
    assert "stablehlo.custom_call @my_target(%arg0, %arg0) {api_version = 2 : i32, " in text
    assert 'backend_config = "cfg"' in text
    with pytest.raises(Exception, match="No registered implementation for .*my_target"):
        a.cpu()


def test_custom_call_bad_input():
    x = torch.ones(3).to(dev)
    with pytest.raises(ValueError, match="one dtype per output shape"):
        stablehlo_custom_call([x], "t", [(3,)], [])
    with pytest.raises(ValueError, match="argument 0 is not a tensor on the lazyxla device"):
        stablehlo_custom_call([torch.ones(3)], "t", [(3,)], [torch.float32])
    with pytest.raises(ValueError, match="api_version 4"):
        stablehlo_custom_call([x], "t", [(3,)], [torch.float32], backend_config="c", api_version=4)


def test_markers_are_identities_with_gradients_and_survive_export():
    def f(q, k, v):
        b = StableHLOCompositeBuilder("test.sdpa", {"scale": 0.25, "dims": [1, 2]})
        q, k, v = b.mark_inputs(q, k, v)
        return b.mark_outputs(F.scaled_dot_product_attention(q, k, v, scale=0.25))

    torch.manual_seed(0)
    ins = [torch.randn(1, 2, 8, 4, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    ref = F.scaled_dot_product_attention(*ins, scale=0.25)
    ref.sum().backward()
    lz = [t.detach().to(dev).requires_grad_() for t in ins]
    out = f(*lz)
    out.sum().backward()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(lz, ins):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-12, atol=1e-12)

    class M(torch.nn.Module):
        def forward(self, x):
            x = torch.ops.xla.mark_tensor(x + 1, "test.p", 0, "0", True)
            return torch.ops.xla.mark_tensor(x * 2, "test.p", 0, "0", False)

    ep = torch.export.export(M(), (torch.randn(3),))
    assert "torch.ops.xla.mark_tensor.default" in ep.graph_module.code


def test_marker_attributes_are_checked():
    assert serialize_composite_attr({"a": 1, "b": [1.0, 2.0]}) == (("a", 1), ("b", [1.0, 2.0]))
    with pytest.raises(ValueError, match="Composite attr value must be"):
        serialize_composite_attr({"a": [1, 2.0]})
    with pytest.raises(ValueError, match="must be a torch tensor"):
        StableHLOCompositeBuilder("p").mark_inputs(3)
