"""`F.linear` and `torch.matmul` on lazy tensors recorded as one op each way (Note [Products kept
whole]): values, gradients, layouts and double backward against eager; the decomposition kept
wherever eager rounds differently or something between autograd and lazyxla must see it."""

import re

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from util import to_cpu

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla._src.debug import hlo_text

dev = lazyxla.device()


def _ops() -> dict[str, int]:
    return {k: met.counter_value(k) for k in met.counter_names() if k.startswith("xla::")}


def _ints(*shape, dtype=torch.float32):
    """Small integers: their products and sums are exact in any float dtype, so a comparison
    with eager can be exact whatever order either side accumulates in (any CPU)."""
    return torch.randint(-2, 3, shape).to(dtype)


def _loss(out):
    """A loss whose gradient is fixed small integers (exact in every dtype)."""
    c = torch.randint(-2, 3, out.shape, generator=torch.Generator().manual_seed(0))
    return (out.double() * c.to(out.device, torch.float64)).sum()


def _run(x, w, b, grads=(True, True, True), make=lambda t: t):
    """linear + a loss + backward on CPU and on lazyxla; returns both (output, grads) and the
    ops lazyxla recorded for the lazy call."""
    leaves, lazy = [], []
    for t, g in zip((x, w, b), grads):
        # the same leaves on both sides: `make` (a transposed view, say) applied before
        # requires_grad, so each gradient is the view's, laid out by AccumulateGrad
        leaves.append(None if t is None else make(t.detach().clone()).requires_grad_(g))
        lazy.append(None if t is None else make(t.detach().to(dev)).requires_grad_(g))
    cpu = leaves
    ref = F.linear(*cpu)
    _loss(ref).backward()
    met.clear_counters()
    out = F.linear(*lazy)
    _loss(out).backward()
    ops = _ops()
    lazyxla.sync()
    return out, lazy, ref, leaves, ops


CASES = {
    "2d, bias": ((5, 16), (8, 16), True),
    "2d": ((5, 16), (8, 16), False),
    "3d, bias": ((3, 5, 16), (8, 16), True),
    "4d": ((2, 3, 5, 16), (8, 16), False),
    "4d, bias": ((2, 3, 5, 16), (8, 16), True),
}


@pytest.mark.parametrize("case", CASES)
def test_one_op_each_way_with_eager_values_gradients_and_layouts(case):
    sx, sw, bias = CASES[case]
    torch.manual_seed(0)
    x, w = torch.randn(sx, dtype=torch.float64), torch.randn(sw, dtype=torch.float64)
    b = torch.randn(sw[0], dtype=torch.float64) if bias else None
    out, lazy, ref, leaves, ops = _run(x, w, b)
    assert ops.get("xla::linear") == 1 and ops.get("xla::linear_backward") == 1
    assert "xla::mm" not in ops and "xla::t" not in ops and "xla::addmm" not in ops
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-12, atol=1e-12)
    assert out.stride() == ref.stride() and out.requires_grad and out.grad_fn is not None
    # (eager's N-d output with a bias is a view of its private 2-D addmm result: no alias a
    # program can reach, so lazyxla's plain tensor is not told apart by anything but _is_view)
    assert not out._is_view()
    for lz, cpu in zip(lazy, leaves):
        if cpu is not None:
            torch.testing.assert_close(lz.grad.cpu(), cpu.grad, rtol=1e-12, atol=1e-12)
            assert lz.grad.stride() == cpu.grad.stride()


@pytest.mark.parametrize("grads", [(True, False, False), (False, True, True), (False, True, False)])
def test_only_the_gradients_asked_for(grads):
    torch.manual_seed(1)
    x, w, b = (torch.randn(s, dtype=torch.float64) for s in ((3, 4, 16), (8, 16), (8,)))
    out, lazy, ref, leaves, ops = _run(x, w, b, grads)
    assert ops.get("xla::linear_backward") == 1
    for lz, cpu in zip(lazy, leaves):
        assert (lz.grad is None) == (cpu.grad is None)
        if cpu.grad is not None:
            torch.testing.assert_close(lz.grad.cpu(), cpu.grad)


def test_transposed_operands_and_a_strided_input_without_bias():
    torch.manual_seed(2)
    x, w = torch.randn(16, 5, 3, dtype=torch.float64), torch.randn(16, 8, dtype=torch.float64)
    # x.transpose(0, 2) is [3, 5, 16] non-contiguous; w.t() is [8, 16] transposed
    out, lazy, ref, leaves, ops = _run(
        x,
        w,
        None,
        make=lambda t: t.transpose(0, 2) if t.dim() == 3 else t.t(),
    )
    assert ops.get("xla::linear") == 1
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-12, atol=1e-12)
    for lz, cpu in zip(lazy[:2], leaves[:2]):
        assert not lz.is_contiguous()
        torch.testing.assert_close(lz.grad.cpu(), cpu.grad, rtol=1e-12, atol=1e-12)
        assert lz.grad.stride() == cpu.grad.stride()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_equals_eager(dtype):
    torch.manual_seed(3)
    x, w, b = _ints(4, 6, 32, dtype=dtype), _ints(8, 32, dtype=dtype), _ints(8, dtype=dtype)
    out, lazy, ref, leaves, ops = _run(x, w, b)
    assert ops.get("xla::linear") == 1 and ops.get("xla::linear_backward") == 1
    assert out.dtype == dtype and torch.equal(out.cpu(), ref)
    for lz, cpu in zip(lazy, leaves):
        assert lz.grad.dtype == dtype and torch.equal(lz.grad.cpu(), cpu.grad)


def test_eager_paths_that_round_twice_or_differ_keep_the_decomposition():
    torch.manual_seed(4)
    # a bias beside a non-contiguous N-d input: eager computes matmul, then add_ (two roundings)
    x = _ints(8, 3, 16, dtype=torch.bfloat16).transpose(0, 1)
    w, b = _ints(4, 16, dtype=torch.bfloat16), _ints(4, dtype=torch.bfloat16)
    out, lazy, ref, leaves, ops = _run(x, w, b)
    assert "xla::linear" not in ops and "xla::linear_backward" not in ops
    assert torch.equal(out.cpu(), ref)
    # a 1-D input, a bias to broadcast, integers
    for args in (
        (torch.randn(16, dtype=torch.float64), torch.randn(4, 16, dtype=torch.float64), None),
        tuple(torch.randn(s, dtype=torch.float64) for s in ((3, 16), (4, 16), (3, 4))),
        (torch.arange(12).reshape(3, 4), torch.arange(8).reshape(2, 4), None),
    ):
        met.clear_counters()
        got = F.linear(*(None if a is None else a.to(dev) for a in args))
        assert "xla::linear" not in _ops()
        torch.testing.assert_close(got.cpu(), F.linear(*args))


PRODUCTS = {
    "linear": F.linear,
    "mm": lambda a, b: torch.mm(a, b.t()),
    "matmul": lambda a, b: a @ b.t(),
    "batched matmul": lambda a, b: a[None] @ b.t()[None],
    "addmm": lambda a, b: torch.addmm(b[0], a, b.t()),
    "bmm": lambda a, b: torch.bmm(a[None], b.t()[None]),
    "mv": lambda a, b: torch.mv(a, b[0]),
    "dot": lambda a, b: torch.dot(a[0], b[0]),
}


@pytest.mark.parametrize("name", PRODUCTS)
def test_products_of_two_dtypes_raise_eagers_error(name):
    # the meta kernels of mm and friends accept them: lazyxla used to return a float32 result
    f, x, w = PRODUCTS[name], torch.randn(3, 4), torch.randn(2, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError) as cpu_err:
        f(x, w)
    with pytest.raises(RuntimeError) as lazy_err:
        f(x.to(dev), w.to(dev))
    assert str(lazy_err.value) == str(cpu_err.value)


def test_double_backward_equals_eager():
    torch.manual_seed(5)
    x, w, b = (torch.randn(s, dtype=torch.float64) for s in ((3, 4, 16), (8, 16), (8,)))
    results = []
    for d in ("cpu", dev):
        xs, ws, bs = (t.detach().to(d).requires_grad_() for t in (x, w, b))
        y = F.linear(xs, ws, bs).tanh().sum()
        gx, gw = torch.autograd.grad(y, (xs, ws), create_graph=True)
        (gx.pow(2).sum() + gw.pow(2).sum()).backward()  # a gradient penalty
        results.append([t.detach().cpu() for t in (gx, gw, xs.grad, ws.grad, bs.grad)])
    for lz, cpu in zip(results[1], results[0]):
        torch.testing.assert_close(lz, cpu, rtol=1e-10, atol=1e-10)


def test_no_grad_and_inference_mode_record_one_op_and_no_autograd_node():
    torch.manual_seed(6)
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(2, 5, 16)
    ref = lin(x)
    lazy_lin = torch.nn.Linear(16, 8).to(dev)
    lazy_lin.load_state_dict(lin.state_dict())
    xd = x.to(dev)
    for ctx in (torch.no_grad, torch.inference_mode):
        met.clear_counters()
        with ctx():
            out = lazy_lin(xd)
        assert _ops() == {"xla::linear": 1} and out.grad_fn is None
        torch.testing.assert_close(out.cpu(), ref.detach())


def test_a_saved_input_written_in_place_fails_backward_as_in_eager():
    for d in ("cpu", dev):
        x = torch.randn(3, 16, device=d)
        w = torch.randn(8, 16, device=d, requires_grad=True)
        y = F.linear(x, w)
        x.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


class _Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_a_dispatch_mode_sees_eagers_decomposition():
    seen = {}
    for d in ("cpu", dev, dev):  # (the second lazy call reuses every cached spec)
        x, w = torch.randn(2, 3, 16, device=d), torch.randn(8, 16, device=d, requires_grad=True)
        with _Seen() as mode:
            F.linear(x, w).sum().backward()
        seen[d] = mode.ops
    assert torch.ops.aten.mm.default in seen["cpu"] and seen[dev] == seen["cpu"]


def test_functorch_transforms_and_forward_ad_equal_eager():
    torch.manual_seed(7)
    x, w, b = (torch.randn(s, dtype=torch.float64) for s in ((3, 16), (8, 16), (8,)))
    tx = torch.randn(3, 16, dtype=torch.float64)

    def f(x, w, b):
        return F.linear(x, w, b).sin().sum()

    got, ref = [], []
    for d, out in (("cpu", ref), (dev, got)):
        args = [t.to(d) for t in (x, w, b)]
        out.append(torch.func.grad(f, argnums=(0, 1, 2))(*args))
        out.append(torch.func.vmap(lambda r: F.linear(r, args[1], args[2]))(args[0]))
        out.append(torch.func.jvp(lambda x: F.linear(x, args[1], args[2]), (args[0],), (tx.to(d),)))
        with fwAD.dual_level():  # (torch.func decomposes linear first; plain forward AD does not)
            dual = F.linear(fwAD.make_dual(args[0], tx.to(d)), args[1], args[2])
            out.append(fwAD.unpack_dual(dual).tangent)
    for g, r in zip(got, ref):
        torch.testing.assert_close(to_cpu(g), r, rtol=1e-12, atol=1e-12)


def test_one_dot_keeping_the_batch_dims():
    x = torch.randn(3, 4, 5, 16, device=dev)
    w = torch.randn(8, 16, device=dev)
    assert re.search(r"dot\.\d+ = f32\[3,4,5,8\]", hlo_text([F.linear(x, w)]))


def test_training_matches_eager_with_one_compile_and_trace_once_still_does():
    torch.manual_seed(8)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    lazy = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    lazy.load_state_dict(model.state_dict())
    lazy.to(dev)
    compiled = torch.compile(lazy, backend="lazyxla")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, lazy)]
    compiles = []
    for step in range(4):
        x = torch.randn(6, 16)
        c0 = met.counter_value("UncachedCompile") or 0
        for m, opt, d in ((model, opts[0], "cpu"), (compiled if step == 3 else lazy, opts[1], dev)):
            opt.zero_grad()
            m(x.to(d)).pow(2).mean().backward()
            opt.step()
        lazyxla.sync()
        compiles.append((met.counter_value("UncachedCompile") or 0) - c0)
        for p, q in zip(lazy.parameters(), model.parameters()):
            torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    assert compiles[1:3] == [0, 0]  # same program, new data


@pytest.mark.parametrize("how", ["save_on_cpu", "reentrant", "non-reentrant"])
def test_checkpointing_and_saved_tensor_hooks_see_eagers_ops(how):
    # they decide per saved tensor (mm's operands), and XLA's scheduler needs the decomposed
    # backward to free a checkpointed region's activations (tests/test_checkpointing.py)
    torch.manual_seed(9)
    lin = torch.nn.Linear(16, 8, dtype=torch.float64)
    x = torch.randn(3, 4, 16, dtype=torch.float64)
    grads = []
    for d in ("cpu", dev):
        m = torch.nn.Linear(16, 8, dtype=torch.float64).to(d)
        m.load_state_dict(lin.state_dict())
        xs = x.detach().to(d).requires_grad_()
        met.clear_counters()
        if how == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu():
                y = m(xs)
        else:
            y = torch.utils.checkpoint.checkpoint(m, xs, use_reentrant=how == "reentrant")
        y.sin().sum().backward()
        grads.append([t.cpu() for t in (xs.grad, m.weight.grad, m.bias.grad)])
    assert "xla::linear_backward" not in _ops() and "xla::mm" in _ops()
    for lz, cpu in zip(grads[1], grads[0]):
        torch.testing.assert_close(lz, cpu, rtol=1e-12, atol=1e-12)


MATMULS = {
    "3d": ((3, 5, 16), (3, 16, 8), None),
    "4d, a transposed operand": ((2, 3, 5, 16), (2, 3, 8, 16), "b^T"),
    "4d, both transposed": ((2, 3, 16, 5), (2, 3, 8, 16), "both"),
}


def _operands(sa, sb, how, dtype, device):
    torch.manual_seed(10)
    if dtype == torch.float64:
        a, b = torch.randn(sa, dtype=dtype), torch.randn(sb, dtype=dtype)
    else:
        a, b = _ints(*sa, dtype=dtype), _ints(*sb, dtype=dtype)
    a, b = a.to(device).requires_grad_(), b.to(device).requires_grad_()
    if how in ("b^T", "both"):
        b_used = b.transpose(-1, -2)
    else:
        b_used = b
    a_used = a.transpose(-1, -2) if how == "both" else a
    return (a, b), (a_used, b_used)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("case", MATMULS)
def test_matmul_one_op_each_way_with_eager_values_gradients_and_layouts(case, dtype):
    sa, sb, how = MATMULS[case]
    results = []
    for d in ("cpu", dev):
        leaves, (a, b) = _operands(sa, sb, how, dtype, d)
        met.clear_counters()
        out = a @ b
        _loss(out).backward()
        if d == dev:
            ops = _ops()
            assert ops.get("xla::matmul") == 1 and ops.get("xla::matmul_backward") == 1
            assert not {"xla::bmm", "xla::mm", "xla::clone", "xla::_unsafe_view"} & set(ops)
        results.append((out, *(t.grad for t in leaves)))
    tol = {"rtol": 0, "atol": 0} if dtype == torch.bfloat16 else {"rtol": 1e-12, "atol": 1e-12}
    for lz, cpu in zip(results[1], results[0]):
        torch.testing.assert_close(lz.cpu(), cpu.detach(), **tol)
        assert lz.stride() == cpu.stride() and lz.dtype == cpu.dtype
        assert lz._is_view() == cpu._is_view()


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((2, 3, 5, 16), (3, 16, 8)),  # a broadcast batch dim
        ((2, 1, 5, 16), (2, 3, 16, 8)),
        ((3, 5, 16), (16, 8)),  # N-d beside 2-D: eager folds or not by layout and requires_grad
        ((16,), (16, 8)),
        ((3, 5, 16), (16,)),
        ((5, 16), (16,)),
        ((5, 16), (16, 8)),  # one mm already: torch_xla's IR and counters (tests/test_core.py)
    ],
)
def test_matmul_shapes_eager_computes_otherwise_keep_the_decomposition(sa, sb):
    torch.manual_seed(11)
    a, b = torch.randn(sa, dtype=torch.float64), torch.randn(sb, dtype=torch.float64)
    la, lb = a.to(dev).requires_grad_(), b.to(dev).requires_grad_()
    a.requires_grad_(), b.requires_grad_()
    (a @ b).sin().sum().backward()
    met.clear_counters()
    out = la @ lb
    out.sin().sum().backward()
    assert "xla::matmul" not in _ops() and "xla::matmul_backward" not in _ops()
    torch.testing.assert_close(out.cpu(), (a @ b).detach())
    torch.testing.assert_close(la.grad.cpu(), a.grad)
    torch.testing.assert_close(lb.grad.cpu(), b.grad)


def test_matmul_double_backward_only_needed_grads_and_modes():
    torch.manual_seed(12)
    a, b = torch.randn(2, 4, 6, dtype=torch.float64), torch.randn(2, 6, 3, dtype=torch.float64)
    results, seen = [], []
    for d in ("cpu", dev):
        la, lb = a.detach().to(d).requires_grad_(), b.to(d)  # b needs no gradient
        (ga,) = torch.autograd.grad((la @ lb).tanh().sum(), la, create_graph=True)
        ga.pow(2).sum().backward()
        results.append((ga.detach().cpu(), la.grad.cpu()))
        for _ in range(2):  # (the second lazy call reuses every cached spec)
            with _Seen() as mode:
                la.detach() @ lb
        seen.append(mode.ops)
    for lz, cpu in zip(results[1], results[0]):
        torch.testing.assert_close(lz, cpu, rtol=1e-12, atol=1e-12)
    assert seen[1] == seen[0] and torch.ops.aten.bmm.default in seen[0]
