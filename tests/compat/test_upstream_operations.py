"""Fixes and torch_xla APIs that pytorch/xla's test/test_operations.py exposed: eager's sign/sgn,
empty min/max, torch_xla's flip/arange/min/max errors, sparse embedding_bag gradients, xp.Trace's
scope check, the clip_grad_norm_ patch, torch_xla.utils.utils' nested walks, _XLAC entries and
repeat_with_fixed_output_size; each against eager PyTorch or torch_xla's documented behaviour."""

import math

import pytest
import torch
import torch.nn.functional as F

import lazyxla
import lazyxla.compat
import lazyxla.debug.metrics as met
import lazyxla.debug.profiler as xp
from lazyxla._src import xlac as xlac_src
from lazyxla._src.tensor import state
from lazyxla.core import xla_model as xm
from lazyxla.experimental.custom_kernel import repeat_with_fixed_output_size
from lazyxla.utils import utils as xu

dev = lazyxla.device()
inf, nan = math.inf, math.nan


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal values, NaNs in the same places, and the same sign of zero."""
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    if not want.is_complex() and want.is_floating_point():
        assert torch.equal(torch.signbit(got), torch.signbit(want))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("op", [torch.sign, torch.sgn])
def test_sign_of_nan_and_signed_zero_is_eager(op, dtype):
    x = torch.tensor([nan, -0.0, 0.0, -inf, inf, -2.5, 3.0], dtype=dtype)
    _same(op(x.to(dev)).cpu(), op(x))


def test_sign_of_integers_and_bools_is_eager():
    for x in (torch.tensor([-3, 0, 5]), torch.tensor([0, 7], dtype=torch.uint8)):
        assert torch.equal(torch.sign(x.to(dev)).cpu(), torch.sign(x))
    b = torch.tensor([True, False])
    assert torch.equal(torch.sgn(b.to(dev)).cpu(), torch.sgn(b))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_sgn_of_infinities_and_zero_is_eager(dtype):
    x = torch.tensor(
        [complex(inf, 0), complex(-inf, 0), complex(inf, inf), complex(nan, 0), 0j, 3 + 4j],
        dtype=dtype,
    )
    torch.testing.assert_close(x.to(dev).sgn().cpu(), x.sgn(), equal_nan=True)


def test_min_max_of_an_empty_tensor_raise():
    a = torch.rand(2, 0, 4)
    la = a.to(dev)
    for fn in (torch.max, torch.min):
        with pytest.raises(RuntimeError) as eager:
            fn(a)
        with pytest.raises(RuntimeError) as lazy:
            fn(la)
        assert str(lazy.value) == str(eager.value)  # eager's message, at record time
        with pytest.raises(RuntimeError, match="Expected reduction dim 1 to have non-zero size"):
            fn(la, dim=1)  # eager raises IndexError; torch_xla a RuntimeError
    torch.testing.assert_close(torch.max(la, dim=2).values.cpu(), torch.max(a, dim=2).values)


def test_flip_and_arange_raise_torch_xla_errors():
    data = torch.arange(8, device=dev).view(2, 2, 2)
    with pytest.raises(RuntimeError, match=r"range of \[-3, 2\], but got 3"):
        data.flip(3)
    with pytest.raises(RuntimeError, match="at most once"):
        data.flip(0, 1, 1)
    for start, end in ((-5, nan), (nan, 5), (0, inf)):
        with pytest.raises(RuntimeError, match="unsupported range"):
            torch.arange(start, end, device=dev)
    assert torch.equal(torch.arange(2.0, 5.0, device=dev).cpu(), torch.arange(2.0, 5.0))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_sparse_embedding_bag_gradient_comes_back_dense(mode):
    w = torch.randn(10, 3, dtype=torch.float64, requires_grad=True)
    idx, off = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4])
    F.embedding_bag(idx, w, offsets=off, mode=mode, sparse=mode != "max").sum().backward()
    wl = w.detach().to(dev).requires_grad_()
    out = F.embedding_bag(idx.to(dev), wl, offsets=off.to(dev), mode=mode, sparse=mode != "max")
    out.sum().backward()
    assert wl.grad.layout == torch.strided
    want = w.grad.to_dense() if w.grad.is_sparse else w.grad
    torch.testing.assert_close(wl.grad.cpu(), want)


def test_a_step_inside_an_open_trace_is_torch_xla_error_after_running():
    lazyxla.sync()
    t = torch.ones(3, device=dev) * 2
    with pytest.raises(RuntimeError, match="Expecting scope to be empty but it is conv1.1"):
        with xp.Trace("conv1"):
            lazyxla.sync()
    assert not state(t).is_pending  # the step ran before the error
    torch.testing.assert_close(t.cpu(), torch.full((3,), 2.0))

    @xp.trace_me("conv2")
    def step():
        xm.mark_step()

    with pytest.raises(RuntimeError, match="but it is conv2"):
        step()
    with xp.Trace("outer"):
        lazyxla.sync(reset_scope=False)  # allowed, as in torch_xla
    with xp.StepTrace("train", step_num=1):
        torch.ones(2, device=dev).sum()
    lazyxla.sync()  # no scope left open


def test_clip_grad_norm_patch_under_the_alias():
    lazyxla.compat.install()
    try:
        x = torch.rand(10, 10).to(dev)
        result = torch.nn.utils.clip_grad_norm_(x, 1.0)  # no gradient: a lazy zero
        assert result.device == dev and result.item() == 0.0
        torch.manual_seed(0)
        ref = torch.nn.Linear(4, 3)
        lazy = torch.nn.Linear(4, 3).to(dev)
        lazy.load_state_dict(ref.state_dict())
        inp = torch.randn(5, 4)
        (ref(inp) * 10).sum().backward()
        (lazy(inp.to(dev)) * 10).sum().backward()
        want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        got = torch.nn.utils.clip_grad_norm_(lazy.parameters(), 0.5)
        torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close(lazy.weight.grad.cpu(), ref.weight.grad)
    finally:
        lazyxla.compat.uninstall()
    assert not hasattr(torch.nn.utils.clip_grad_norm_, "_orig")


def test_nested_walks_visit_in_torch_xla_order():
    shared = [1.5, "s"]
    data = {"k": (2, shared), 3: shared, "set": {4}}
    seen, rewritten = [], []
    xu.for_each_instance(data, lambda v: isinstance(v, (int, float, str)), seen.append)
    out = xu.for_each_instance_rewrite(
        data, lambda v: isinstance(v, (int, float, str)), lambda v: rewritten.append(v) or v
    )
    assert seen == rewritten == ["k", 2, 1.5, "s", 3, "set", 4]  # keys before values, once each
    assert out["k"] == [2, [1.5, "s"]] and out["k"][1] is out[3]  # tuples become lists; shared

    class Node:
        def __init__(self):
            self.me = self
            self.v = 1

    n = xu.for_each_instance_rewrite(Node(), lambda v: v == 1, lambda v: 2)
    assert n.v == 2 and n.me is n  # cycles map to the one copy


class _Pair(xu.DataWrapper):
    def __init__(self, a, b, tag):
        self.a, self.b, self.tag = a, b, tag

    def get_tensors(self):
        return [self.a, self.b]

    def from_tensors(self, tensors):
        return (tensors[0], tensors[1], self.tag)


def test_data_wrappers_and_the_tensor_arena():
    a, b = torch.randn(2), torch.randn(3)
    moved = xm.send_cpu_data_to_device(_Pair(a, b, "t"), dev)
    assert moved[2] == "t" and moved[0].device == dev
    torch.testing.assert_close(moved[1].cpu(), b)
    calls = []

    def convert(ts):
        calls.append(len(ts))
        return [t.to(dev) for t in ts]

    arena = xm.ToXlaTensorArena(convert, lambda v: type(v) is torch.Tensor)
    out = arena.transform({a: [b, (a,)], "x": {b}})
    assert calls == [2]  # one call for every selected tensor, each once
    key = next(k for k in out if isinstance(k, torch.Tensor))
    assert key.device == dev and out[key][0].device == dev and out[key][1][0] is key


def test_xlac_entries():
    xlac = xlac_src._make_xlac()
    cpu = [torch.randn(2, 2, requires_grad=True), torch.arange(3)]
    got = xlac._xla_tensors_from_aten(cpu, [str(dev)] * 2)
    assert [t.device for t in got] == [dev, dev] and got[0].requires_grad
    torch.testing.assert_close(got[1].cpu(), cpu[1])
    x = torch.tensor([0, 1, 2, 0, 3, 4], device=dev)
    size = xlac._get_xla_tensor_dimension_size(torch.nonzero(x), 0)
    assert size.dtype == torch.int32 and size.item() == 4
    assert xlac._get_xla_tensor_shape_type(torch.ones(2, dtype=torch.float16, device=dev)) == "f16"
    assert xlac._get_xla_tensor_shape_type(torch.ones(2, dtype=torch.bool, device=dev)) == "pred"
    assert xlac._unsafe_buffer_pointer(torch.arange(5, device=dev)) > 0
    revs = xlac._get_git_revs()
    assert revs["xla"] and "torch" in revs


@pytest.mark.parametrize(
    "repeats,total",
    [([0, 5, 2, 0, 4, 9, 6, 7, 8, 0], 100), ([3, 6, 2, 14, 27, 47, 8, 28], 135), ([1] * 10, 4)],
)
def test_repeat_with_fixed_output_size(repeats, total):
    n = len(repeats)
    inp, rep = torch.randn(n), torch.tensor(repeats)
    base = torch.repeat_interleave(inp, rep)[:total]
    want = torch.cat([base, inp[-1].repeat(total - base.numel())])
    met.clear_all()
    got = repeat_with_fixed_output_size(inp.to(dev), rep.to(dev), total)
    torch.testing.assert_close(got.cpu(), want)
    assert not [n for n in met.counter_names() if n.startswith("aten::")]  # no CPU fallback
    with pytest.raises(ValueError, match="1-D"):
        repeat_with_fixed_output_size(inp.to(dev).view(1, -1), rep.to(dev), total)


@pytest.mark.parametrize("device", ["cpu", dev])
def test_check_view_sharing(device):
    a = torch.rand(16, device=device)
    b, c = a[:10], a[6:]
    with pytest.raises(RuntimeError, match="is sharing a view with"):
        xm.check_view_sharing([b, c])

    class Nested:
        def __init__(self, x, y):
            self.x, self.y = x, y

    with pytest.raises(RuntimeError, match="is sharing a view with"):
        xm.check_view_sharing({"n": Nested(b, c)})
    xm.check_view_sharing([a, a, torch.rand(3, device=device), b.clone()])  # no shared storage


def test_replace_xla_tensor_keeps_the_object_and_takes_the_value():
    xlac = xlac_src._make_xlac()
    p = torch.nn.Parameter(torch.randn(5, device=dev))
    ident = id(p)
    xlac._replace_xla_tensor(p, torch.full((2,), 3.0, device=dev))
    assert id(p) == ident and isinstance(p, torch.nn.Parameter) and p.requires_grad
    torch.testing.assert_close(p.detach().cpu(), torch.full((2,), 3.0))
    (p * 2).sum().backward()
    torch.testing.assert_close(p.grad.cpu(), torch.full((2,), 2.0))
    with pytest.raises(TypeError, match="two lazyxla tensors"):
        xlac._replace_xla_tensor(torch.ones(2), torch.ones(2, device=dev))
