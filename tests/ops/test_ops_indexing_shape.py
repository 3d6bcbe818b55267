"""Views/reshapes, indexing (gather/scatter/index_put/masking) and cat/stack/split: vs eager CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from util import DEV, check


def rnd(*shape, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).requires_grad_(grad)


def idx(*vals):
    return torch.tensor(vals)


SHAPE = {
    "view": lambda x: x.view(4, 6) * 2,
    "view_infer": lambda x: x.view(-1, 3).exp(),
    "reshape_noncontig": lambda x: x.transpose(0, 2).reshape(-1, 2),
    "flatten": lambda x: x.flatten(1),
    "unflatten": lambda x: x.unflatten(2, (2, 2)),
    "permute": lambda x: x.permute(2, 0, 1) * torch.arange(4.0, device=x.device)[:, None, None],
    "transpose": lambda x: x.transpose(-1, -2).contiguous(),
    "t_mm": lambda x: x[0].t() @ x[1],
    "unsqueeze_squeeze": lambda x: x.unsqueeze(1).unsqueeze(-1).squeeze(-1).squeeze(),
    "expand": lambda x: x[:, :1].expand(2, 5, 4) * 1.0,
    "expand_as_broadcast": lambda x: x.sum(0, keepdim=True).expand_as(x) * x,
    "repeat": lambda x: x.repeat(2, 1, 3),
    "flip": lambda x: x.flip(0, 2),
    "roll": lambda x: x.roll(2, 1),
    "slice_step": lambda x: x[:, ::2, 1:],
    "slice_neg": lambda x: x[..., -3:-1],
    "narrow": lambda x: x.narrow(2, 1, 2),
    "select": lambda x: x[1, :, 2],
    "diagonal": lambda x: x.diagonal(0, 1, 2),
    "diag_offset": lambda x: x[0].diagonal(1),
    "tril": lambda x: x.tril(),
    "triu": lambda x: x.triu(1),
    "pad": lambda x: torch.nn.functional.pad(x, (1, 2, 0, 1)),
    "pad_value": lambda x: torch.nn.functional.pad(x, (2, 0), value=-1.5),
    "unbind": lambda x: x.unbind(1),
    "movedim": lambda x: x.movedim(0, -1),
    "unfold": lambda x: x.unfold(1, 2, 1),
    "as_strided": lambda x: x.contiguous().as_strided((2, 2), (3, 1), 1),
}


@pytest.mark.parametrize("name", list(SHAPE))
def test_shape_ops(name):
    check(SHAPE[name], rnd(2, 3, 4))


CATS = {
    "cat0": lambda a, b: torch.cat([a, b], 0),
    "cat_neg": lambda a, b: torch.cat([a, b, a], -1),
    "cat_empty": lambda a, b: torch.cat([a, torch.empty(0, device=a.device), b]),
    "stack": lambda a, b: torch.stack([a, b]),
    "stack_last": lambda a, b: torch.stack([a, b], -1),
    "split": lambda a, b: torch.split(torch.cat([a, b], 1), 3, dim=1),
    "split_sizes": lambda a, b: torch.split(a, [1, 2, 1], dim=1),
    "chunk": lambda a, b: a.chunk(2, dim=1),
    "chunk_uneven": lambda a, b: torch.cat([a, b], 1).chunk(3, dim=1),
    "tensor_split": lambda a, b: torch.tensor_split(a, 3, dim=1),
    "hstack": lambda a, b: torch.hstack([a, b]),
}


@pytest.mark.parametrize("name", list(CATS))
def test_cat_stack_split(name):
    check(CATS[name], rnd(3, 4, seed=1), rnd(3, 4, seed=2))


def test_cat_mixed_dtypes():
    a = torch.arange(6).reshape(2, 3)
    b = torch.rand(2, 3)
    out_l, out_c = check(lambda x, y: torch.cat([x, y]), a, b, grad=False)
    assert out_l.dtype == torch.float32


INDEXING = {
    "index_1d": lambda x: x[idx(2, 0, 2)],
    "index_neg": lambda x: x[idx(-1, 0)],
    "index_2d": lambda x: x[idx(0, 2), idx(1, 3)],
    "index_middle": lambda x: x[:, idx(3, 1, 1)],
    "index_broadcast": lambda x: x[idx(0, 1)[:, None], idx(2, 3, 0)[None, :]],
    "index_none_ellipsis": lambda x: x[None, ..., idx(1, 2)],
    "index_select": lambda x: x.index_select(1, idx(3, 0, 3)),
    "index_select_0": lambda x: torch.index_select(x, 0, idx(1)),
    "gather": lambda x: x.gather(1, idx([0, 3], [1, 1], [2, 0])),
    "gather_dim0": lambda x: torch.gather(x, 0, idx([2, 0, 1, 2])),
    "take_along_dim": lambda x: torch.take_along_dim(x, x.argsort(1), 1),
    "masked_fill": lambda x: x.masked_fill(x > 0.3, -1.0),
    "masked_fill_broadcast": lambda x: x.masked_fill(idx(True, False, True, False), 2.0),
    "masked_fill_tensor": lambda x: x.masked_fill(x < 0, torch.tensor(0.5)),
    "masked_fill_neg_inf": lambda x: x.masked_fill(x < -0.5, float("-inf")).softmax(-1),
    "where": lambda x: torch.where(x > 0, x, x * 0.1),
    "where_scalar": lambda x: torch.where(x > 0, x, 0.0),
    "where_broadcast": lambda x: torch.where(idx(True, False, True, True), x, x.exp()),
    "clamp_index": lambda x: x[x.detach().argmax(1).clamp(max=2)],
}


@pytest.mark.parametrize("name", list(INDEXING))
def test_indexing(name):
    check(INDEXING[name], rnd(3, 4))


def _put(x, i, v, accumulate=False):
    return x.index_put((i,), v, accumulate=accumulate)


SCATTERS = {
    "index_put": lambda x, v: _put(x, idx(2, 0), v[:2]),
    "index_put_acc_dup": lambda x, v: _put(x, idx(1, 1, 0), v[:3], accumulate=True),
    "index_put_2d": lambda x, v: x.index_put((idx(0, 2), idx(1, 3)), v[0, :2]),
    "index_put_scalar_broadcast": lambda x, v: x.index_put((idx(1),), v[0, 0]),
    "scatter": lambda x, v: x.scatter(1, idx([0, 2], [3, 1], [1, 0]), v[:, :2]),
    "scatter_value": lambda x, v: x.scatter(1, idx([0], [3], [1]), 5.0),
    "scatter_add": lambda x, v: x.scatter_add(1, idx([0, 0], [3, 1], [1, 1]), v[:, :2]),
    "scatter_add_dim0": lambda x, v: x.scatter_add(0, idx([0, 1, 0, 0], [0, 1, 2, 2]), v[:2]),
    "scatter_reduce_sum": lambda x, v: x.scatter_reduce(
        1, idx([0, 0], [3, 1], [1, 1]), v[:, :2], "sum"
    ),
    "scatter_reduce_amax": lambda x, v: x.scatter_reduce(
        1, idx([0, 2], [3, 1], [1, 0]), v[:, :2], "amax", include_self=False
    ),
    "index_add": lambda x, v: x.index_add(0, idx(2, 0, 2), v[:3], alpha=2.0),
    "index_copy": lambda x, v: x.index_copy(1, idx(3, 0), v[:, :2]),
    "index_fill": lambda x, v: x.index_fill(1, idx(0, 2), -3.0),
    "masked_scatter_free": lambda x, v: torch.where(x > v, x, v),
}


@pytest.mark.parametrize("name", list(SCATTERS))
def test_scatter_family(name):
    check(SCATTERS[name], rnd(3, 4, seed=1), rnd(3, 4, seed=2))


# Many contributions to each of a few rows, in bf16/fp16: eager CPU adds (and multiplies) them in
# float32 and rounds once for scatter_add, scatter_reduce, scatter_(reduce=) and index_add along
# the first or last dim of a 2+-d tensor with alpha 1; index_add otherwise, index_put(accumulate=
# True) and index_reduce add in the tensor's dtype, one contribution at a time (Note [Scatter
# accumulation] in lazyxla/_src/ops/indexing.py).
_ROWS = torch.randint(0, 3, (3000,), generator=torch.Generator().manual_seed(7))
_ROWS2 = _ROWS[:, None].expand(3000, 2).contiguous()
LOW_PRECISION_ACCUMULATIONS = {
    "scatter_add": lambda x, v: x.scatter_add(0, _ROWS2.to(x.device), v),
    "index_add": lambda x, v: x.index_add(0, _ROWS.to(x.device), v),
    "index_add_alpha": lambda x, v: x.index_add(0, _ROWS.to(x.device), v, alpha=0.75),
    "index_add_1d": lambda x, v: x[:, 0].index_add(0, _ROWS.to(x.device), v[:, 0]),
    "index_add_middle_dim": lambda x, v: x.t()[..., None].index_add(
        1, _ROWS.to(x.device), v.t()[..., None]
    ),
    "scatter_reduce_sum": lambda x, v: x.scatter_reduce(0, _ROWS2.to(x.device), v, "sum"),
    "scatter_reduce_sum_no_self": lambda x, v: x.scatter_reduce(
        0, _ROWS2.to(x.device), v, "sum", include_self=False
    ),
    "scatter_reduce_prod": lambda x, v: x.scatter_reduce(
        0, _ROWS2.to(x.device), 1 + v / 512, "prod"
    ),
    "scatter_reduce_mean": lambda x, v: x.scatter_reduce(0, _ROWS2.to(x.device), v, "mean"),
    "scatter_reduce_mean_no_self": lambda x, v: x.scatter_reduce(
        0, _ROWS2.to(x.device), v, "mean", include_self=False
    ),
    "scatter__reduce_add": lambda x, v: x.clone().scatter_(0, _ROWS2.to(x.device), v, reduce="add"),
    "scatter__reduce_multiply": lambda x, v: x.clone().scatter_(
        0, _ROWS2.to(x.device), 1 + v / 512, reduce="multiply"
    ),
    "index_put_accumulate": lambda x, v: x.index_put((_ROWS.to(x.device),), v, accumulate=True),
    "index_reduce_mean": lambda x, v: x.index_reduce(0, _ROWS.to(x.device), v, "mean"),
    "index_reduce_prod": lambda x, v: x.index_reduce(0, _ROWS.to(x.device), 1 + v / 512, "prod"),
    "gather_backward": None,
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", list(LOW_PRECISION_ACCUMULATIONS))
def test_low_precision_scatter_accumulates_like_eager(name, dtype):
    """Before, lazyxla added every contribution in bf16 (60 ulps from eager's float32 sum over
    1000 contributions a row) and counted a mean's contributions in bf16, where 256 + 1 = 256."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, 2, generator=g).to(dtype)
    v = (torch.randn(3000, 2, generator=g) + 0.5).to(dtype)
    if name == "gather_backward":  # its gradient is a scatter_add of 1000 rows into each row

        def fn(x, v):
            x = x.detach().requires_grad_()
            x.gather(0, _ROWS2.to(x.device)).backward(v)
            return x.grad

    else:
        fn = LOW_PRECISION_ACCUMULATIONS[name]
    eager = fn(x, v)
    lazy = fn(x.to(DEV), v.to(DEV)).cpu()
    assert lazy.dtype == eager.dtype
    # Both sum in float32 (in another order) and round once, or both add in the dtype in index
    # order: at most one ulp apart, where a float32 sum lands next to a rounding boundary.
    ulp = torch.finfo(dtype).eps * eager.double().abs()
    assert ((lazy.double() - eager.double()).abs() <= ulp).all(), (lazy, eager)


def _assign_slice(x, v):
    y = x * 1
    y[:, 1:3] = v[:, :2]
    y[0] = 7.0
    y[1:, -1] += v[1:, 0]
    return y


def _assign_index(x, v):
    y = x.clone()
    y[idx(2, 0)] = v[:2]
    y[idx(1), idx(1)] = -1.0
    y[:, idx(0, 3)] *= 2
    return y


def _assign_mask(x, v):
    y = x.clone()
    y[y > 0.5] = 0.0  # bool mask with a scalar: index_put with a mask (data-dependent shape)
    return y


@pytest.mark.parametrize("fn", [_assign_slice, _assign_index, _assign_mask])
def test_assignment(fn):
    check(fn, rnd(3, 4, seed=1), rnd(3, 4, seed=2))


def test_bool_mask_read_falls_back():
    """x[mask] has a data-dependent shape: correct result (through the CPU fallback if need be)."""
    x = rnd(3, 4, grad=False)
    check(lambda v: v[v > 0], x, grad=False, exact=True)


def test_int_index_on_lazy_device():
    x = rnd(3, 4)
    i = idx(2, 0, 1)
    check(lambda v, j: v[j.to(v.device)] * 2 if v.device == DEV else v[j] * 2, x, i)


def test_gather_with_an_empty_index_of_another_rank():
    """Eager gathers nothing from an empty index without checking its rank against the input's;
    lazyxla raised torch_xla's rank error (found by a complex64 OpInfo sweep)."""
    x = torch.randn(5)
    for shape in [(2, 0), (0,)]:
        i = torch.zeros(shape, dtype=torch.int64)
        out = torch.gather(x.to(DEV), 0, i.to(DEV)).cpu()
        assert out.shape == torch.gather(x, 0, i).shape


SLICE_GRADS = {
    "step_remainder": lambda x: x[:, 1:6:3],
    "end_past_size": lambda x: x[..., 2:100],
    "negative_bounds": lambda x: x[-2:, -5:-1],
    "empty": lambda x: x[:, 4:4],
    "select_negative": lambda x: x[:, -1],
    "select_first_dim": lambda x: x[0],
    "narrow_last": lambda x: x.narrow(-1, 3, 4),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name", list(SLICE_GRADS))
def test_slice_and_select_gradients_are_one_op(name, dtype):
    """Note [Slice and select backward]: a slice's or a select's gradient is one recorded op
    (not zeros, a view and copy_), equal to eager's, the signs of zero included; and
    differentiable again (double backward)."""
    from lazyxla.debug import metrics as met

    fn = SLICE_GRADS[name]
    x = torch.arange(-20.0, 28.0).reshape(6, 8).to(dtype) / 4
    g = torch.Generator().manual_seed(0)
    cot = torch.randn(fn(x).shape, generator=g).to(dtype)
    cot[..., :1] = -0.0
    met.clear_counters()
    grads = []
    for dev in ("cpu", DEV):
        xs, cs = x.to(dev).requires_grad_(), cot.to(dev).requires_grad_()
        (gx,) = torch.autograd.grad(fn(xs), xs, cs, create_graph=True)
        (gc,) = torch.autograd.grad((gx * x.to(dev)).sum(), cs)  # through the backward op
        grads.append((gx.detach().cpu(), gc.cpu()))
    (g_eager, gc_eager), (g_lazy, gc_lazy) = grads
    assert torch.equal(g_lazy, g_eager) and torch.equal(g_lazy.signbit(), g_eager.signbit())
    assert torch.equal(gc_lazy, gc_eager)
    ops = {k for k in met.counter_names() if k.startswith("xla::")}
    assert ops & {"xla::slice_backward", "xla::select_backward"}
    assert not ops & {"xla::zeros", "xla::copy_", "xla::new_zeros"}, ops


SOURCE_OF_ANOTHER_DTYPE = {
    "index_add": lambda t, i, v: t.index_add(0, i, v),
    "index_add_": lambda t, i, v: t.index_add_(0, i, v, alpha=2),
    "index_copy": lambda t, i, v: t.index_copy(0, i, v),
    "put": lambda t, i, v: t.put(i, v, accumulate=True),
    "put_": lambda t, i, v: t.put_(i, v),
}


@pytest.mark.parametrize("name", list(SOURCE_OF_ANOTHER_DTYPE))
def test_a_source_of_another_dtype_raises_eagers_error(name):
    """Eager's kernels refuse it (their meta kernels do not check): lazyxla computed with a cast."""
    op = SOURCE_OF_ANOTHER_DTYPE[name]
    t, i, v = torch.zeros(6), torch.tensor([0, 2, 3, 5]), torch.ones(4, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError) as eager:
        op(t, i, v)
    with pytest.raises(RuntimeError) as lazy:
        op(t.to(DEV), i.to(DEV), v.to(DEV))
    assert str(lazy.value) == str(eager.value)
    check(op, t, i, torch.arange(4.0), grad=False)  # the same dtype runs


UNIT_VALUES = [0, 1, 0.0, 1.0, True, False]
PUT_A_CPU_VALUE = {
    "setitem mask": lambda t, m, i, v: t.__setitem__(m, v),
    "setitem index": lambda t, m, i, v: t.__setitem__(i, v.to(t.dtype)),
    "index_put_ mask": lambda t, m, i, v: t.index_put_((m,), v),
    "index_put_ index": lambda t, m, i, v: t.index_put_((i,), v.to(t.dtype)),
    "index_put_ accumulate": lambda t, m, i, v: t.index_put_((i,), v.to(t.dtype), True),
}


@pytest.mark.parametrize("name", list(PUT_A_CPU_VALUE))
def test_a_cpu_0d_value_of_0_or_1_is_put_as_eager_puts_it(name):
    """A 0-d CPU tensor of 0 or 1 reaches the graph as a number baked into the node (as torch_xla
    bakes them), not an input: index_put's lowering failed on it (`x[mask] = torch.tensor(0)`)."""
    op = PUT_A_CPU_VALUE[name]
    for value in UNIT_VALUES:
        for dtype in (None, torch.float64):
            v = torch.tensor(value, dtype=dtype)
            t = torch.arange(6.0).reshape(2, 3)
            m, i = t > 2, torch.tensor([1, 0])
            want = t.clone()
            op(want, m, i, v)
            got = t.to(DEV)
            op(got, m.to(DEV), i.to(DEV), v)
            assert torch.equal(got.cpu(), want), (value, dtype)


# (t: a lazy tensor, u: a 0-d CPU tensor of 0 or 1; ops whose lowering failed on it)
UNIT_IN_A_TENSOR_SLOT = {
    "gather index": lambda t, u: t[0, 0].gather(0, u.long() * 0),
    "igamma": lambda t, u: torch.igamma(t.abs() + 0.5, u.float()),
    "igammac": lambda t, u: torch.igammac(u.float() + 0.5, t.abs()),
    "xlog1py": lambda t, u: torch.special.xlog1py(t, u.float()),
    "zeta": lambda t, u: torch.special.zeta(t.abs() + 1.5, u.float() + 1),
    "select_scatter": lambda t, u: torch.select_scatter(t[0], u.float(), 0, 1),
    "as_strided_scatter": lambda t, u: torch.as_strided_scatter(t, u.float(), (), (), 4),
    "scatter_add": lambda t, u: t[0, 0].scatter_add(0, u.long() * 0, u.float()),
    "put": lambda t, u: t.put(u.long(), u.float()),
    "complex": lambda t, u: torch.complex(t, u.float()),
    "dropout backward": lambda t, u: torch.ops.aten.native_dropout_backward(t, u.bool(), 2.0),
    "igamma_": lambda t, u: (t.abs() + 0.5).igamma_(u.float()),
    "put_": lambda t, u: t.put_(u.long(), u.float()),
    "gather out=": lambda t, u: torch.gather(t[0, 0], 0, u.long() * 0, out=t[1, 0]),
}


@pytest.mark.parametrize("name", list(UNIT_IN_A_TENSOR_SLOT))
def test_a_cpu_0d_unit_in_a_tensor_argument_computes_as_eager(name):
    """Note [Numbers in tensor slots]: the baked number reaches the rule as a 0-d array."""
    op = UNIT_IN_A_TENSOR_SLOT[name]
    t = torch.arange(6.0).reshape(2, 3) - 2.5
    for value in (0, 1):
        u = torch.tensor(value)
        want = op(t, u)
        got = op(t.to(DEV), u).cpu()
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, equal_nan=True)


# (w: a lazy (8, 4) float tensor, i: a 0-d integer index)
AN_INDEX_OF_ANOTHER_DTYPE = {
    "embedding": lambda w, i: F.embedding(i, w),
    "nll_loss": lambda w, i: F.nll_loss(w[0].log_softmax(0), i % 4),
    "cross_entropy": lambda w, i: F.cross_entropy(w[0], i % 4),
    "multi_margin_loss": lambda w, i: F.multi_margin_loss(w[0], i % 4),
    "index_select": lambda w, i: w.index_select(0, i),
    "index_select 1-d": lambda w, i: w[:, 0].index_select(0, i),
    "gather": lambda w, i: w[:, 0].gather(0, i),
    "take": lambda w, i: w.take(i),
    "index_fill": lambda w, i: w.index_fill(0, i, 2.0),
    "index_put_": lambda w, i: w.clone().index_put_((i,), torch.tensor(7.0)),
    "index_add": lambda w, i: w.index_add(0, i, w[:1]),
    "index_copy": lambda w, i: w.index_copy(0, i, w[:1] * 2),
    "index_reduce": lambda w, i: w.index_reduce(0, i, w[:1] * 2, "amax"),
}


@pytest.mark.parametrize("where", ["cpu", "lazy"])
@pytest.mark.parametrize("name", list(AN_INDEX_OF_ANOTHER_DTYPE))
def test_a_0d_index_is_read_as_an_integer(name, where):
    """Note [Index operands keep their dtype]: a 0-d CPU index (not 0 or 1, which are baked) was
    lifted at its promotion with the float operand and failed to lower; a 0-d index, CPU or lazy,
    selects as a 1-element one (index_select keeps the dim, gather of a 1-d tensor is 0-d)."""
    op = AN_INDEX_OF_ANOTHER_DTYPE[name]
    w = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    for dtype in (torch.int64, torch.int32):
        i = torch.tensor(5, dtype=dtype)
        try:
            want = op(w, i)
        except (RuntimeError, IndexError):  # (an int32 index where eager takes int64 only)
            assert dtype == torch.int32
            continue
        got = op(w.to(DEV), i if where == "cpu" else i.to(DEV)).cpu()
        assert got.dtype == want.dtype and got.shape == want.shape, (dtype, got.shape)
        torch.testing.assert_close(got, want)
