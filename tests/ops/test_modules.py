"""PyTorch's ModuleInfo database (`torch.testing._internal.common_modules.module_db`: every
torch.nn module with PyTorch's own sample constructors and inputs) on lazyxla: the first two
samples of each module, forward and the gradients of its parameters and inputs, measured against
float64 eager CPU and no farther from it than eager float32 is (Note [Float64 reference] in
test_models.py). A sample eager itself rejects must be rejected by lazyxla with the same exception
type. This is how nn.LSTM and nn.GRU were found failing (Note [Fused RNN cells])."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing._internal.common_modules import module_db

import lazyxla

dev = lazyxla.device()
F32_EPS = torch.finfo(torch.float32).eps
SAMPLES = 2

# Known, stated here rather than skipped: lazy modules (LazyLinear, LazyConv*) keep their
# parameters uninitialized until the first forward, and `Module.to` of such a parameter to a
# device whose tensors are not shallow-copy compatible with the CPU's replaces it with a plain
# Parameter (as for torch_xla's device): the module can no longer infer its sizes.
LAZY = "uninitialized parameters cannot move to lazyxla before the first forward"


def _move(v, device, dtype):
    if isinstance(v, torch.Tensor):
        out = v.detach().clone()
        if out.is_floating_point():
            out = out.to(dtype)
        out = out.to(device)
        return out.requires_grad_(v.requires_grad)
    if isinstance(v, (list, tuple)):
        return type(v)(_move(x, device, dtype) for x in v)
    if isinstance(v, dict):
        return {k: _move(x, device, dtype) for k, x in v.items()}
    return v


def _tensors(v) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    if isinstance(v, dict):
        return [t for x in v.values() for t in _tensors(x)]
    return []


def _run(module, sample, device, dtype):
    """Outputs and gradients (parameters, then inputs) as float64 CPU tensors."""
    m = copy.deepcopy(module).to(dtype).to(device)
    args = _move(sample.forward_input.args, device, dtype)
    kwargs = _move(sample.forward_input.kwargs, device, dtype)
    outs = [o for o in _tensors(m(*args, **kwargs)) if o.is_floating_point()]
    diff = [o for o in outs if o.requires_grad]
    if diff:
        weights = [torch.linspace(-1, 1, o.numel(), dtype=o.dtype) for o in diff]
        loss = sum((o * w.to(device).reshape(o.shape)).sum() for o, w in zip(diff, weights))
        loss.backward()
    leaves = list(m.parameters()) + [t for t in _tensors((args, kwargs)) if t.requires_grad]
    grads = [t.grad for t in leaves if t.grad is not None]
    return [o.detach().cpu().double() for o in outs], [g.cpu().double() for g in grads]


def _cases():
    for info in module_db:
        name = info.module_cls.__name__
        marks = [pytest.mark.xfail(reason=LAZY, strict=True)] if name.startswith("Lazy") else []
        for k in range(SAMPLES):
            yield pytest.param(info, k, id=f"{name}-{k}", marks=marks)


@pytest.mark.parametrize("info,k", list(_cases()))
def test_module_matches_eager(info, k):
    samples = info.module_inputs_func(
        info, device="cpu", dtype=torch.float64, requires_grad=True, training=True
    )
    samples = [s for s in samples if s.forward_input is not None]
    if k >= len(samples):
        pytest.skip(f"{info.module_cls.__name__} has {len(samples)} sample(s)")
    sample = samples[k]
    torch.manual_seed(0)
    module = info.module_cls(*sample.constructor_input.args, **sample.constructor_input.kwargs)
    try:
        ref_out, ref_grads = _run(module, sample, "cpu", torch.float64)
        eager_out, eager_grads = _run(module, sample, "cpu", torch.float32)
    except Exception as err:  # eager rejects the sample: so must lazyxla
        with pytest.raises(type(err)):
            _run(module, sample, dev, torch.float32)
        return
    lazy_out, lazy_grads = _run(module, sample, dev, torch.float32)
    assert len(lazy_out) == len(ref_out) and len(lazy_grads) == len(ref_grads)
    for lazy, eager, ref in zip(
        lazy_out + lazy_grads, eager_out + eager_grads, ref_out + ref_grads
    ):
        assert lazy.shape == ref.shape
        if ref.numel() == 0:
            continue
        finite = torch.isfinite(ref)  # where float64 is finite, float32 overflows as eager's does
        assert torch.equal(torch.isfinite(lazy)[finite], torch.isfinite(eager)[finite])
        finite &= torch.isfinite(eager)
        ref, eager, lazy = ref[finite], eager[finite], lazy[finite]
        if ref.numel() == 0:
            continue
        eager_err = (eager - ref).abs().max().item()
        lazy_err = (lazy - ref).abs().max().item()
        scale = ref.abs().max().item()
        assert lazy_err <= 4 * eager_err + 64 * F32_EPS * max(scale, 1.0), (lazy_err, eager_err)
