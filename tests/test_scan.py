"""scan and scan_layers (Note [Loop nodes], Note [Scan autograd]): values and gradients against the
eager Python loop on CPU, pytrees, compile and trace counts, and errors for bad input."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from functorch.compile import min_cut_rematerialization_partition
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map
from util import DEV, assert_same, to_cpu

import lazyxla
from lazyxla._src.ir import post_order
from lazyxla._src.scan import _BODY_CACHE, _scan_impl_pytree
from lazyxla._src.tensor import read, state
from lazyxla.debug import metrics
from lazyxla.experimental import scan as scan_module
from lazyxla.experimental.scan import scan
from lazyxla.experimental.scan_layers import scan_layers
from lazyxla.models import DecoderBlock, DecoderConfig, rotary_tables

F64 = torch.float64


def loop_scan(fn, init, xs):
    """The reference: the Python loop `scan` stands for, run eagerly."""
    carry, ys = init, []
    n = len(tree_leaves(xs)[0])
    for i in range(n):
        carry, y = fn(carry, tree_map(lambda v: v[i], xs))
        ys.append(y)
    if not ys or ys[0] is None:
        return carry, None if not ys else ys[0]

    def stack(*vs):
        return None if vs[0] is None else torch.stack(vs)

    return carry, tree_map(stack, *ys)


def _leafs(tree, requires_grad=True, device="cpu"):
    return tree_map(
        lambda v: (
            v.detach().clone().to(device).requires_grad_(requires_grad and v.is_floating_point())
        ),
        tree,
    )


def _total(tree) -> torch.Tensor:
    return sum((v * (i + 1)).sum() for i, v in enumerate(tree_leaves(tree)) if v is not None)


def check_scan(fn, init, xs, *, grad=True, **kw):
    """scan on lazyxla equals the eager loop on CPU, values and gradients of init and xs."""
    ci, cx = _leafs(init, grad), _leafs(xs, grad)
    li, lx = _leafs(init, grad, DEV), _leafs(xs, grad, DEV)
    ec, ey = loop_scan(fn, ci, cx)
    lc, ly = scan(fn, li, lx, **kw)
    assert_same(lc, ec)
    assert_same(ly, ey)
    if grad:
        _total((ec, ey)).backward()
        _total((lc, ly)).backward()
        lazyxla.sync()
        assert_same(tree_map(lambda v: v.grad, li), tree_map(lambda v: v.grad, ci))
        assert_same(tree_map(lambda v: v.grad, lx), tree_map(lambda v: v.grad, cx))
    return lc, ly


@pytest.fixture(autouse=True)
def _clean():
    scan_module._SCAN_COMPUTATION_CACHE.clear()
    _BODY_CACHE.clear()
    yield


# --- values and gradients -------------------------------------------------------------------------


def test_cumsum_values_and_grads():
    def fn(c, x):
        c = c + x
        return c, c * 2

    check_scan(fn, torch.zeros(3, dtype=F64), torch.randn(5, 3, dtype=F64))


@pytest.mark.parametrize("pure", [False, True])
def test_nonlinear_body_grads(pure):
    def fn(c, x):
        h = torch.tanh(c @ x["w"] + x["b"])
        return h, {"h": h.sum(-1), "s": torch.sin(x["b"])}

    init = torch.randn(2, 4, dtype=F64)
    xs = {"w": torch.randn(6, 4, 4, dtype=F64), "b": torch.randn(6, 4, dtype=F64)}
    check_scan(fn, init, xs, is_fn_pure=pure)


def test_pytree_carry_and_outputs_with_none_and_unit():
    def fn(c, x):
        a, b = c["a"], c["b"]
        return {"a": a * x[0], "b": b + x[1].sum()}, (None, a.sum())

    init = {"a": torch.ones(2, dtype=F64), "b": torch.zeros(3, dtype=F64)}
    xs = (torch.randn(4, 2, dtype=F64), torch.randn(4, 5, dtype=F64))
    check_scan(fn, init, xs)

    def fn_unit(c, x):
        return torch.cos(c) + x, ()

    _, ys = check_scan(fn_unit, torch.ones(2, dtype=F64), torch.randn(3, 2, dtype=F64))
    assert ys == ()


@pytest.mark.parametrize("init_grad,xs_grad", [(True, False), (False, True)])
def test_gradness(init_grad, xs_grad):
    def fn(c, x):
        c = c * x
        return c, c + x

    ci = torch.tensor([1.0, 1.5], dtype=F64, requires_grad=init_grad)
    cx = torch.randn(3, 2, dtype=F64, requires_grad=xs_grad)
    li = ci.detach().to(DEV).requires_grad_(init_grad)
    lx = cx.detach().to(DEV).requires_grad_(xs_grad)
    ec, ey = loop_scan(fn, ci, cx)
    lc, ly = scan(fn, li, lx)
    (ec.sum() + ey.sum()).backward()
    (lc.sum() + ly.sum()).backward()
    for lazy, eager in ((li, ci), (lx, cx)):
        assert (lazy.grad is None) == (eager.grad is None)
        if eager.grad is not None:
            assert_same(lazy.grad, eager.grad)


def test_mixed_dtypes_keep_their_dtypes():
    def fn(c, x):
        return torch.sin(c), (torch.sin(x[0]), torch.sin(x[1]))

    init = torch.tensor([0.0, 0.5], dtype=torch.float16)
    xs = (torch.randn(3, 2).to(torch.bfloat16), torch.randn(3, 2, dtype=F64))
    lc, (y0, y1) = check_scan(fn, init, xs)
    assert (lc.dtype, y0.dtype, y1.dtype) == (torch.float16, torch.bfloat16, F64)


def test_int_carry_and_reverse():
    def fn(c, x):
        return c + 1, x * c

    init = torch.tensor(0)
    xs = torch.arange(5.0, dtype=F64)
    with torch.no_grad():
        lc, ly = _scan_impl_pytree(fn, init.to(DEV), xs.to(DEV), reverse=True)
    # reverse: the carry meets the slices from the last to the first; ys keep their positions
    assert lc.cpu().item() == 5
    assert_same(ly, xs * torch.tensor([4, 3, 2, 1, 0], dtype=F64))


def test_min_cut_partition_recomputes_and_matches():
    def fn(c, x):
        for _ in range(3):
            c = torch.sin(c)
        return c, torch.sin(x) * c

    init, xs = torch.randn(4, dtype=F64), torch.randn(6, 4, dtype=F64)
    check_scan(fn, init, xs, partition_fn=min_cut_rematerialization_partition)

    def sines(partition_fn):
        i = init.to(DEV).requires_grad_()
        x = xs.to(DEV).requires_grad_()
        c, y = scan(fn, i, x, partition_fn=partition_fn)
        lazyxla.sync()
        (c.sum() + y.sum()).backward()
        hlo = lazyxla.debug.hlo_text([i.grad, x.grad])
        return len(re.findall(r" sine\(f64", hlo))

    assert sines(min_cut_rematerialization_partition) > 0  # the backward recomputes sin
    from functorch.compile import default_partition

    assert sines(default_partition) == 0  # the backward reads saved activations


def test_body_creating_tensors_and_closure_in_no_grad():
    w = torch.randn(3, 3, dtype=F64)
    lw = w.to(DEV)

    def make(weight):
        def fn(c, x):
            b = torch.tensor([1.0, 2.0, 3.0], dtype=F64, device=weight.device)
            return c @ weight + b + x, c.sum() * 0.5

        return fn

    init, xs = torch.randn(3, dtype=F64), torch.randn(4, 3, dtype=F64)
    with torch.no_grad():
        ec, ey = loop_scan(make(w), init, xs)
        lc, ly = scan(make(lw), init.to(DEV), xs.to(DEV))
    assert_same(lc, ec)
    assert_same(ly, ey)


def test_gradients_reach_tensors_the_body_closes_over():
    """Note [Tensors a scan body closes over]: a weight, a module's parameters, a frozen tensor and
    an index tensor used from the enclosing scope; gradients as the eager loop's."""
    torch.manual_seed(0)
    w, frozen = torch.randn(4, dtype=F64), torch.randn(4, dtype=F64)
    lin = nn.Linear(4, 4).double()
    idx = torch.tensor([3, 2, 1, 0])

    def make(w, frozen, lin, idx):
        def fn(c, x):
            h = torch.tanh(lin(c * w + x) + frozen)
            return h[..., idx], h.sum(-1)

        return fn

    lw, lfrozen, llin = w.to(DEV).requires_grad_(), frozen.to(DEV), copy.deepcopy(lin).to(DEV)
    w.requires_grad_()
    init, xs = torch.randn(2, 4, dtype=F64), torch.randn(5, 2, 4, dtype=F64)
    ci, cx = _leafs(init), _leafs(xs)
    li, lx = _leafs(init, device=DEV), _leafs(xs, device=DEV)
    counter = lazyxla._src.random_state.get_state()
    lc, ly = scan(make(lw, lfrozen, llin, idx.to(DEV)), li, lx)
    assert lazyxla._src.random_state.get_state() == counter  # the probe run draws nothing
    ec, ey = loop_scan(make(w, frozen, lin, idx), ci, cx)
    _total((ec, ey)).backward()
    _total((lc, ly)).backward()
    lazyxla.sync()
    assert_same((lc, ly), (ec, ey))
    assert_same((li.grad, lx.grad, lw.grad), (ci.grad, cx.grad, w.grad))
    assert_same([p.grad for p in llin.parameters()], [p.grad for p in lin.parameters()])
    assert lfrozen.grad is None and not lfrozen.requires_grad


def test_grad_mode_body_writing_a_closed_over_tensor_is_refused_and_writes_nothing():
    outside = torch.zeros(2, device=DEV)
    lazyxla.sync()

    def fn(c, x):
        outside.add_(1.0)
        return c + x, c + outside

    init = torch.zeros(2, device=DEV, requires_grad=True)
    with pytest.raises(AssertionError, match="writes in place to a tensor it closes over"):
        scan(fn, init, torch.ones(3, 2, device=DEV))
    assert torch.equal(outside.cpu(), torch.zeros(2))


def test_random_ops_differ_per_iteration_and_per_call_without_recompiling():
    def fn(c, x):
        return c + x, c + torch.rand(8, device=DEV)

    init, xs = torch.zeros(8, device=DEV), torch.zeros(3, 8, device=DEV)
    lazyxla.sync()
    _, ys1 = scan(fn, init, xs, is_fn_pure=True)
    lazyxla.sync()
    metrics.clear_all()
    _, ys2 = scan(fn, init, xs, is_fn_pure=True)
    lazyxla.sync()
    a, b = ys1.cpu(), ys2.cpu()
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[1], a[2])
    assert not torch.equal(a, b)
    assert (metrics.counter_value("UncachedCompile") or 0) == 0


def test_one_node_in_the_ir_and_a_while_in_the_hlo():
    def fn(c, x):
        return c * x + 1, c

    c, ys = scan(fn, torch.ones(4, device=DEV), torch.randn(10, 4, device=DEV))
    nodes = post_order([read(state(c))[0], read(state(ys))[0]])
    assert [n.op for n in nodes if n.op.startswith("xla::scan")] == ["xla::scan"]
    assert not any(n.op == "aten::mul" for n in nodes)  # the body is inside the node
    assert "while(" in lazyxla.debug.hlo_text([c, ys])


# --- caching and compile counts -------------------------------------------------------------------


def test_second_call_traces_nothing_and_compiles_nothing():
    def fn(c, x):
        return torch.tanh(c + x), c.sum()

    def run(seed):
        torch.manual_seed(seed)
        i = torch.randn(4).to(DEV).requires_grad_()
        x = torch.randn(5, 4).to(DEV).requires_grad_()
        c, y = scan(fn, i, x, is_fn_pure=True)
        (c.sum() + y.sum()).backward()
        lazyxla.sync()
        return i.grad.cpu(), x.grad.cpu()

    run(0)
    metrics.clear_all()
    g1 = run(1)
    assert (metrics.counter_value("ScanAOTTrace") or 0) == 0
    assert (metrics.counter_value("ScanTraceBody") or 0) == 0
    assert (metrics.counter_value("UncachedCompile") or 0) == 0
    assert (metrics.counter_value("CachedCompile") or 0) >= 1
    assert not torch.equal(g1[1], run(2)[1])  # new values, same executable


def test_impure_fn_retraces_but_compiles_once():
    def fn(c, x):
        return c + x, c

    def run():
        i = torch.zeros(4, device=DEV, requires_grad=True)
        c, _ = scan(fn, i, torch.ones(3, 4, device=DEV))
        c.sum().backward()
        lazyxla.sync()

    run()
    metrics.clear_all()
    run()
    assert (metrics.counter_value("ScanTraceBody") or 0) == 2  # forward and backward bodies again
    assert (metrics.counter_value("UncachedCompile") or 0) == 0


# --- bad input ------------------------------------------------------------------------------------


def test_bad_input_errors():
    init, xs = torch.zeros(2, device=DEV), torch.zeros(3, 2, device=DEV)
    with pytest.raises(ValueError, match="must be callable"):
        scan(1000, init, xs)
    with pytest.raises(ValueError, match="same leading dimension"):
        scan(lambda c, x: (c, x), init, (xs, torch.zeros(4, 2, device=DEV)))
    with pytest.raises(ValueError, match="empty PyTree"):
        scan(lambda c, x: (c, x), init, ())
    with pytest.raises(ValueError, match="is on cpu"):
        scan(lambda c, x: (c, x), init, torch.zeros(3, 2))
    with pytest.raises(ValueError, match="0-dimensional"):
        scan(lambda c, x: (c, x), init, torch.tensor(1.0, device=DEV))


@pytest.mark.parametrize("grad", [False, True])
def test_carry_that_changes_shape_or_dtype_is_refused(grad):
    init = torch.zeros(2, device=DEV, requires_grad=grad)
    xs = torch.zeros(3, 2, device=DEV)
    with torch.set_grad_enabled(grad):
        with pytest.raises(ValueError, match=r"changed the shape of carry\[0\]: given f32\[2\]"):
            scan(lambda c, x: (torch.cat([c, x]), x), init, xs)
        with pytest.raises(ValueError, match=r"changed the dtype of carry\[0\].*returned f64\[2\]"):
            scan(lambda c, x: (c.double() + x, x), init, xs)
        with pytest.raises(ValueError, match="returned a carry with 2 tensors"):
            scan(lambda c, x: ((c, c), x), init, xs)


def test_sync_inside_the_body_is_refused_with_a_clear_error():
    def fn(c, x):
        if (c + x).sum().item() > 0:  # Python control flow on a traced value
            return c, x
        return c + 1, x

    with torch.no_grad(), pytest.raises(Exception, match="cannot sync|was read or synced"):
        scan(fn, torch.zeros(2, device=DEV), torch.zeros(3, 2, device=DEV))
        lazyxla.sync()


def test_no_grad_body_mutating_an_outside_tensor_is_refused():
    outside = torch.zeros(2, device=DEV)

    def fn(c, x):
        outside.add_(1.0)
        return c + x, c

    with torch.no_grad(), pytest.raises(RuntimeError, match="modified a tensor in place"):
        scan(fn, torch.zeros(2, device=DEV), torch.zeros(3, 2, device=DEV))


# --- scan_layers ----------------------------------------------------------------------------------


def _mlp_layers(n, width=8):
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(width, width), nn.Tanh()).double() for _ in range(n)]


def test_scan_layers_matches_sequential_and_grads_land_on_each_layer():
    cpu_layers = _mlp_layers(4)
    lazy_layers = [nn.Sequential(*[m for m in layer]).to(DEV) for layer in _mlp_layers(4)]
    x = torch.randn(3, 8, dtype=F64)
    expected = nn.Sequential(*cpu_layers)(x)
    got = scan_layers(lazy_layers, x.to(DEV), is_layer_pure=True)
    assert_same(got, expected)
    expected.square().sum().backward()
    got.square().sum().backward()
    for lc, ll in zip(cpu_layers, lazy_layers):
        for (name, pc), pl in zip(lc.named_parameters(), ll.parameters()):
            assert isinstance(pl, nn.Parameter) and pl.grad is not None, name
            assert_same(pl.grad, pc.grad)


def test_scan_layers_training_steps_compile_once_and_match_eager():
    cpu_layers = _mlp_layers(3)
    lazy_layers = [layer.to(DEV) for layer in _mlp_layers(3)]
    lp = [p for m in lazy_layers for p in m.parameters()]
    opt_c = torch.optim.SGD([p for m in cpu_layers for p in m.parameters()], lr=0.1)
    opt_l = torch.optim.SGD(lp, lr=0.1)
    xs = [torch.randn(2, 8, dtype=F64) for _ in range(3)]
    for step, x in enumerate(xs):
        if step == 1:
            metrics.clear_all()
        for layers, opt, inp, run in (
            (cpu_layers, opt_c, x, lambda ls, i: nn.Sequential(*ls)(i)),
            (lazy_layers, opt_l, x.to(DEV), lambda ls, i: scan_layers(ls, i, is_layer_pure=True)),
        ):
            opt.zero_grad()
            run(layers, inp).sum().backward()
            opt.step()
        lazyxla.sync()
    assert (metrics.counter_value("UncachedCompile") or 0) == 0
    assert (metrics.counter_value("ScanTraceBody") or 0) == 0
    for pc, pl in zip((p for m in cpu_layers for p in m.parameters()), lp):
        assert_same(pl, pc)


def test_scan_layers_grads_are_not_views_of_one_stacked_gradient():
    """Note [Per-layer gradients are not views]: with `.grad` kept between steps, each layer's
    in-place updates touch only its own gradient (no select_scatter of the stacked one)."""
    cpu_layers = _mlp_layers(4)
    lazy_layers = [layer.to(DEV) for layer in _mlp_layers(4)]
    lp = [p for m in lazy_layers for p in m.parameters()]
    opt_c = torch.optim.SGD([p for m in cpu_layers for p in m.parameters()], lr=0.1, momentum=0.9)
    opt_l = torch.optim.SGD(lp, lr=0.1, momentum=0.9)
    for step in range(3):
        x = torch.randn(2, 8, dtype=F64)
        for layers, opt, inp, run in (
            (cpu_layers, opt_c, x, lambda ls, i: nn.Sequential(*ls)(i)),
            (lazy_layers, opt_l, x.to(DEV), lambda ls, i: scan_layers(ls, i, is_layer_pure=True)),
        ):
            opt.zero_grad(set_to_none=False)
            run(layers, inp).square().sum().backward()
            if step == 2 and layers is lazy_layers:
                assert all(state(p.grad).base is None for p in lp)
                assert "select_scatter" not in lazyxla.debug.ir_text([p.grad for p in lp])
            opt.step()
        lazyxla.sync()
    for pc, pl in zip((p for m in cpu_layers for p in m.parameters()), lp):
        assert_same(pl, pc)
        assert_same(pl.grad, pc.grad)


def test_scan_layers_decoder_blocks_with_min_cut():
    cfg = DecoderConfig(dim=32, n_heads=4, n_kv_heads=2, max_seq_len=8)

    class Block(nn.Module):
        """A decoder block whose mask and rotary tables travel as its own buffers."""

        def __init__(self):
            super().__init__()
            self.block = DecoderBlock(cfg)
            self.register_buffer("mask", torch.ones(8, 8, dtype=torch.bool).triu(1))
            cos, sin = rotary_tables(cfg.head_dim, 8, cfg.rope_theta)
            self.register_buffer("cos", cos)
            self.register_buffer("sin", sin)

        def forward(self, x):
            return self.block(x, self.mask, (self.cos, self.sin))

    torch.manual_seed(0)
    cpu = [Block().double() for _ in range(2)]
    lazy = [Block().double() for _ in range(2)]
    for a, b in zip(lazy, cpu):
        a.load_state_dict(b.state_dict())
        a.to(DEV)
    x = torch.randn(2, 8, 32, dtype=F64)
    expected = nn.Sequential(*cpu)(x)
    got = scan_layers(lazy, x.to(DEV), partition_fn=min_cut_rematerialization_partition)
    assert_same(got, expected)
    expected.sum().backward()
    got.sum().backward()
    for a, b in zip(lazy, cpu):
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert_same(pa.grad, pb.grad)


def test_scan_layers_refuses_layers_of_different_structure():
    with pytest.raises(ValueError, match="mismatched keys"):
        scan_layers(
            [nn.Linear(4, 4).to(DEV), nn.Sequential(nn.Linear(4, 4)).to(DEV)],
            torch.zeros(4, device=DEV),
        )
    with pytest.raises(ValueError, match="Shape mismatch for 'weight' in layer 1"):
        scan_layers([nn.Linear(4, 4).to(DEV), nn.Linear(5, 4).to(DEV)], torch.zeros(4, device=DEV))
    x = torch.zeros(4, device=DEV)
    assert scan_layers([], x) is x


def test_cpu_reference_helpers_are_sane():
    c, ys = loop_scan(lambda c, x: (c + x, c), torch.zeros(2), torch.ones(3, 2))
    assert to_cpu(c).tolist() == [3.0, 3.0] and ys.shape == (3, 2)
