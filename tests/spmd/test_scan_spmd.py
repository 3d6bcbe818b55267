"""scan and scan_layers under SPMD: shardings inside the body kept, gradients sharded like their
inputs, values equal to eager (pytorch/xla's test/scan/test_scan_spmd.py, on 8 virtual devices)."""

import copy
import re

import numpy as np
import torch
from torch import nn

import lazyxla
import lazyxla.distributed.spmd as xs
from lazyxla._src.debug import hlo_text
from lazyxla._src.xlac import _get_xla_sharding_spec, _get_xla_tensor_debug_info
from lazyxla.distributed.spmd.xla_sharding import apply_xla_patch_to_nn_linear
from lazyxla.experimental.scan import scan
from lazyxla.experimental.scan_layers import scan_layers

dev = lazyxla.device()


def _cumsum_sin(carry, x):
    new = torch.sin(carry + x)
    return new, new


def test_scan_keeps_input_shardings_and_matches_eager():
    mesh = xs.get_1d_mesh("model")
    torch.manual_seed(0)
    init_c = torch.randn(64, dtype=torch.float64)
    xs_c = torch.randn(5, 64, dtype=torch.float64)
    init = init_c.to(dev).requires_grad_()
    xs.mark_sharding(init, mesh, ("model",))
    seq = xs_c.to(dev).requires_grad_()
    xs.mark_sharding(seq, mesh, (None, "model"))
    final, ys = scan(_cumsum_sin, init, seq)
    (final.sum() + ys.sum()).backward()
    lazyxla.sync()

    ref_init, ref_xs = init_c.clone().requires_grad_(), xs_c.clone().requires_grad_()
    carry, ref_ys = ref_init, []
    for i in range(5):
        carry, y = _cumsum_sin(carry, ref_xs[i])
        ref_ys.append(y)
    (carry.sum() + torch.stack(ref_ys).sum()).backward()
    torch.testing.assert_close(final.cpu(), carry, rtol=0, atol=1e-12)
    torch.testing.assert_close(ys.cpu(), torch.stack(ref_ys), rtol=0, atol=1e-12)
    torch.testing.assert_close(init.grad.cpu(), ref_init.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(seq.grad.cpu(), ref_xs.grad, rtol=0, atol=1e-12)
    for t in (init, final):
        assert _get_xla_sharding_spec(t).startswith("{devices=[8]0,")
        assert "OpSharding: {devices=[8]0," in _get_xla_tensor_debug_info(t)
    for t in (seq, ys):
        assert _get_xla_sharding_spec(t).startswith("{devices=[1,8]0,")
    # The gradients are sharded like the inputs they belong to (torch_xla's shard-alike backward).
    assert _get_xla_sharding_spec(init.grad).startswith("{devices=[8]0,")
    assert _get_xla_sharding_spec(seq.grad).startswith("{devices=[1,8]0,")


class _MLPBlock(nn.Module):
    def __init__(self, mesh=None):
        super().__init__()
        self.up_proj = nn.Linear(32, 64, bias=False)
        self.down_proj = nn.Linear(64, 32, bias=False)
        self.mesh = mesh

    def mark(self, h):
        if self.mesh is None:
            return h
        return xs.mark_sharding_with_gradients(h, self.mesh, ("fsdp", None, "tensor"))

    def forward(self, h):
        h = self.mark(self.up_proj(self.mark(h)))
        return self.mark(self.down_proj(self.mark(torch.sin(h))))


def test_scan_layers_2d_sharding_inside_body_matches_eager():
    mesh = xs.Mesh(np.arange(8), (2, 4), ("fsdp", "tensor"))
    torch.manual_seed(0)
    ref = nn.Sequential(*[_MLPBlock() for _ in range(3)]).double()
    x = torch.randn(4, 6, 32, dtype=torch.float64)
    ref(x).sum().backward()

    model = copy.deepcopy(ref).to(dev)
    model.zero_grad(set_to_none=True)
    for layer in model:
        layer.mesh = mesh
    model = apply_xla_patch_to_nn_linear(model)
    for name, p in model.named_parameters():
        xs.mark_sharding(p, mesh, ("tensor", "fsdp") if "up_proj" in name else ("fsdp", "tensor"))
    xd = xs.mark_sharding_with_gradients(x.to(dev), mesh, ("fsdp", None, "tensor"))
    out = scan_layers(model, xd)
    out.sum().backward()
    lazyxla.sync()
    torch.testing.assert_close(out.cpu(), ref(x), rtol=0, atol=1e-12)
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), p_ref.grad, rtol=0, atol=1e-12)
        spec = _get_xla_sharding_spec(p.grad)
        # 2-D sharded like the weight, not replicated over one axis (test_scan_2d_sharding)
        assert "last_tile_dim_replicate" not in spec, (name, spec)
        assert spec.startswith("{devices=[4,2]" if "up_proj" in name else "{devices=[2,4]"), spec


def test_scan_layers_patched_linear_keeps_batch_dims():
    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Linear(32, 32) for _ in range(3)])
    x = torch.randn(3, 4, 5, 32)
    model = copy.deepcopy(layers).to(dev)
    y = scan_layers(model, x.to(dev))
    assert re.search(r"%dot\.\d+ = f32\[60,32\]", hlo_text([y]))
    patched = apply_xla_patch_to_nn_linear(model)
    y = scan_layers(patched, x.to(dev))
    assert re.search(r"%dot\.\d+ = f32\[3,4,5,32\]", hlo_text([y]))
    # bf16: the same program run eagerly (einsum then bias, each rounded) is bit-equal.
    ref = apply_xla_patch_to_nn_linear(copy.deepcopy(layers).bfloat16())
    out = scan_layers(patched.bfloat16(), x.bfloat16().to(dev))
    assert torch.equal(out.cpu(), ref(x.bfloat16()))
