"""Views and mutation: each case runs on eager CPU and on lazyxla with the same inputs; exact."""

from __future__ import annotations

import math

import pytest
import torch
from util import DEV, assert_same, leaf, to_cpu, to_lazy

import lazyxla
from lazyxla._src.tensor import state
from lazyxla.debug import metrics


def _x(*shape: int) -> torch.Tensor:
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape) - 5


def _run(fn, *inputs):
    """fn mutates its inputs and returns tensors; compare the returns and the inputs afterwards."""
    cpu = [x.clone() for x in inputs]
    lz = [to_lazy(x) for x in inputs]
    out_c = fn(*cpu)
    out_l = fn(*lz)
    assert_same(out_l, out_c, exact=True)
    assert_same(lz, cpu, exact=True)
    # and eager's layouts: strides, offsets, and which results share a storage
    for a, b in zip([*lz, *out_l], [*cpu, *out_c]):
        assert (a.shape, a.stride(), a.storage_offset()) == (
            b.shape,
            b.stride(),
            b.storage_offset(),
        )
    roots_l = [t.untyped_storage().data_ptr() for t in [*lz, *out_l]]
    roots_c = [t.untyped_storage().data_ptr() for t in [*cpu, *out_c]]
    assert [roots_l.index(r) for r in roots_l] == [roots_c.index(r) for r in roots_c]


def _select_add(x):
    x[0].add_(1)
    return (x,)


def _t_mul(x):
    x.t().mul_(2)
    return (x,)


def _flat_slice_zero(x):
    x.view(-1)[3:5].zero_()
    return (x,)


def _flat_view_zero(x):
    a = x.view(-1)
    a.zero_()
    return x, a


def _masked_fill_slice(x):
    s = x[1:, ::2]
    s.masked_fill_(s > 3, -7.0)
    return x, s


def _setitem_column(x):
    x[:, 1] = 42.0
    return (x,)


def _setitem_column_tensor(x):
    x[:, 1] = torch.tensor([1.0, 2.0, 3.0], device=x.device)
    return (x,)


def _index_put(x):
    idx = torch.tensor([2, 0], device=x.device)
    x[idx] = torch.tensor([-1.0, -2.0, -3.0, -4.0], device=x.device)
    return (x,)


def _index_put_accumulate(x):
    idx = torch.tensor([1, 1, 0], device=x.device)
    x.index_put_((idx,), torch.ones(3, 4, device=x.device), accumulate=True)
    return (x,)


def _two_views(x):
    a = x[1]
    b = x[:, 2]
    a.fill_(9.0)  # b shares element x[1, 2]
    return x, a, b


def _view_of_view(x):
    a = x[1:]
    b = a[:, 1:3]
    c = b.t()[1]
    c[1:].mul_(-1)
    return x, a, b, c


def _unsqueeze_write(x):
    x.unsqueeze(0).unsqueeze(-1).add_(3)
    return (x,)


def _squeeze_write(x):
    y = x.view(3, 1, 4)
    y.squeeze(1)[2].sub_(10)
    return x, y


def _permute_write(x):
    y = x.view(3, 2, 2).permute(2, 0, 1)
    y[1].mul_(5)
    return x, y


def _transpose_write(x):
    y = x.transpose(0, 1)
    y[0:2].add_(100)
    return x, y


def _narrow_write(x):
    x.narrow(1, 1, 2).div_(2)
    return (x,)


def _select_write_neg(x):
    x.select(1, -1).copy_(torch.full((3,), 0.5, device=x.device))
    return (x,)


def _diagonal_write(x):
    x[:, :3].diagonal().fill_(-1)
    x.diagonal(offset=1).add_(10)
    return (x,)


def _base_write_then_old_view(x):
    v = x[1]
    w = x.t()
    x.mul_(3)
    x[0, 0] = 1000.0
    return v, w, v + 1


def _view_then_base_reassign(x):
    v = x.view(-1)[::2]
    x.copy_(torch.ones_like(x))
    x[2].add_(1)
    return v, x


def _unflatten_write_chain(x):
    y = x.reshape(2, 6)[1].view(2, 3).t()
    y[0].zero_()
    return x, y


def _inplace_chain(x):
    x.add_(1).mul_(2).clamp_(max=10)
    return (x,)


def _out_variant(x):
    torch.add(x[0], x[1], out=x[2])
    return (x,)


def _detach_alias(x):
    x.detach().add_(1)
    x.data[0].mul_(-1)
    return (x,)


def _clone_independent(x):
    c = x.clone()
    c.add_(5)
    v = c[0]
    v.zero_()
    return x, c


def _transpose_inplace_alias(x):
    # transpose_ changes the tensor's layout, not its storage: aliases still see each other
    flat = x.view(-1)
    x.transpose_(0, 1)
    flat.mul_(2)
    x[0].add_(100)
    return x, flat


def _t_inplace_of_view(x):
    y = x[1:]
    y.t_()
    y.sub_(1)
    return x, y


def _unsqueeze_squeeze_inplace(x):
    y = x[:, 1:]
    y.unsqueeze_(1)
    y[2].mul_(3)
    y.squeeze_(1)
    y[0].add_(7)
    return x, y


def _swapdims_inplace(x):
    y = x.view(3, 2, 2)
    y.swapdims_(0, 2)
    y[1].neg_()
    y.swapaxes_(1, 0)
    y[0].add_(0.5)
    return x, y


def _set_source_alias(x):
    # set_ makes the tensor share the source's storage, shape, strides and offset
    y = torch.zeros(2, device=x.device)
    y.set_(x[1:].t())
    y.add_(1)
    x[0].mul_(2)
    return x, y


def _resize_shrink_alias(x):
    flat = x.view(-1)
    x.resize_(2, 5)  # a view of its own storage, still aliasing `flat`
    x.add_(1)
    flat[:3].neg_()
    return x, flat


def _resize_transposed(x):
    # the storage is read in storage order, not the transposed tensor's logical order
    y = x.t()
    y.resize_(2, 4)
    y.mul_(3)
    return x, y


def _resize_view_offset(x):
    v = x[1]  # offset 4 in x's storage
    v.resize_(2, 3)  # reaches into the next row
    v.sub_(7)
    return x, v


CASES = [
    _select_add,
    _t_mul,
    _flat_slice_zero,
    _flat_view_zero,
    _masked_fill_slice,
    _setitem_column,
    _setitem_column_tensor,
    _index_put,
    _index_put_accumulate,
    _two_views,
    _view_of_view,
    _unsqueeze_write,
    _squeeze_write,
    _permute_write,
    _transpose_write,
    _narrow_write,
    _select_write_neg,
    _diagonal_write,
    _base_write_then_old_view,
    _view_then_base_reassign,
    _unflatten_write_chain,
    _inplace_chain,
    _out_variant,
    _detach_alias,
    _clone_independent,
    _transpose_inplace_alias,
    _t_inplace_of_view,
    _unsqueeze_squeeze_inplace,
    _swapdims_inplace,
    _set_source_alias,
    _resize_shrink_alias,
    _resize_transposed,
    _resize_view_offset,
]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__.lstrip("_") for f in CASES])
def test_view_mutation(fn):
    _run(fn, _x(3, 4))


def test_view_mutation_after_sync():
    """A view created before a sync still aliases its base after the sync."""

    def fn(x):
        v = x[:, 1:3]
        if x.device.type == DEV.type:
            lazyxla.sync()
        v.mul_(2)
        if x.device.type == DEV.type:
            lazyxla.sync()
        x[0].add_(1)
        return x, v

    _run(fn, _x(3, 4))


def test_copy_from_cpu_into_slice():
    src = torch.tensor([[7.0, 8.0], [9.0, 10.0], [11.0, 12.0]])

    def fn(x):
        x[:, 1:3].copy_(src)  # src stays on the CPU for both
        x[0, :2] = src[1]
        return (x,)

    _run(fn, _x(3, 4))


@pytest.mark.parametrize("shape", [(3, 4), (256, 256)], ids=["small", "large"])
def test_upload_does_not_alias_host(shape):
    """`.to(device)` copies: mutating the CPU tensor afterwards must not change the device value
    (the device buffer itself: a small upload's reads are served from a host copy)."""
    import numpy as np

    x = torch.zeros(shape)
    y = x.to(DEV)
    x.add_(1)
    assert_same(y, torch.zeros(shape), exact=True)
    assert not np.asarray(state(y).value[0].data).any()


def test_detach_is_not_a_copy_but_clone_is():
    x = to_lazy(_x(2, 3))
    d = x.detach()
    c = x.clone()
    d.add_(1)
    assert_same(x, _x(2, 3) + 1, exact=True)
    assert_same(c, _x(2, 3), exact=True)


# --- autograd ------------------------------------------------------------------------------------


def test_grad_accumulates_over_two_backwards():
    w0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    inp = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    results = []
    for dev in ("cpu", DEV):
        p = leaf(w0).to(dev).detach().requires_grad_() if dev != "cpu" else leaf(w0)
        x = inp.to(dev) if dev != "cpu" else inp
        (x @ p).tanh().sum().backward()
        g1 = to_cpu(p.grad).clone()
        (x @ p).pow(2).mean().backward()
        results.append((g1, p.grad))
    (g1_l, g_l), (g1_c, g_c) = results[1], results[0]
    # float32 matmul/tanh: XLA's reduction order differs, default float32 tolerance
    assert_same(g1_l, g1_c)
    assert_same(g_l, g_c)
    assert g_l.device.type == DEV.type


def test_inplace_on_nonleaf_view_backward():
    x0 = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))

    def run(x):
        y = x * 2
        y[0].mul_(3)
        y[:, 1].add_(y[:, 2])
        y.t()[3].sin_()
        loss = (y * y).sum()
        loss.backward()
        return y, loss, x.grad

    xc = leaf(x0)
    xl = to_lazy(xc)
    assert_same(run(xl), run(xc))


def test_inplace_on_leaf_data_then_backward():
    """The optimizer pattern: in-place update through `.data` between two backward passes."""
    w0 = torch.randn(4, generator=torch.Generator().manual_seed(0))

    def run(w):
        for _ in range(2):
            loss = (w * w).sum()
            loss.backward()
            w.data.sub_(0.1 * w.grad)
            w.grad.zero_()
        return w

    assert_same(run(to_lazy(leaf(w0))), run(leaf(w0)))


def test_view_of_leaf_requires_grad_backward():
    x0 = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(3))

    def run(x):
        v = x.permute(2, 0, 1)[1:3].reshape(2, 6)
        (v.exp() * torch.arange(6.0, device=x.device)).sum().backward()
        return x.grad

    assert_same(run(to_lazy(leaf(x0))), run(leaf(x0)))


def test_neg_view_holds_negated_values():
    """`torch._neg_view` (the negation bit, like `conj()`'s conjugation bit) gives the negated
    values on lazyxla, to read, to write through and to differentiate (it read x, not -x)."""

    def prog(x):
        n = torch._neg_view(x * 1)
        out = [n * 1, n.clone(), n[1:] + 0.5]
        y = x.detach().clone()
        torch._neg_view(y).add_(1.5)  # written back negated: y - 1.5
        out.append(y)
        (n * torch.arange(4.0, device=x.device)).sum().backward()
        return [o.resolve_neg() for o in out] + [x.grad]

    x = torch.tensor([1.0, -2.0, 3.0, 0.5])
    ref = prog(leaf(x))
    got = prog(leaf(x.to(DEV)))
    assert_same(got, ref, exact=True)


def test_as_strided_scatter_of_a_strided_input_addresses_its_storage():
    """as_strided_scatter inverts `self.as_strided(size, stride, offset)`, whose offset and strides
    address self's storage: src lands only where the view meets self's elements, and the result
    has self's layout (it wrote self's logical elements, as if self were contiguous)."""

    def cases(dev):
        big = torch.tensor([5.0, 7.0, 8.0, 6.0, 1.0, 2.0], device=dev)
        x, y, head = big[1::2], big.reshape(2, 3).t(), big[:3]
        calls = [
            (x, (), (), 0),
            (x, (1,), (1,), 1),
            (x, (2,), (2,), None),
            (x, (3,), (1,), 2),
            (y, (2,), (3,), 1),
            (head, (2,), (1,), 2),  # contiguous, but its storage goes on past its end
            (big, (2,), (2,), 1),
        ]
        out = []
        for t, size, stride, offset in calls:
            src = torch.arange(10.0, 10.0 + math.prod(size), device=dev).reshape(size)
            r = torch.as_strided_scatter(t, src, size, stride, offset)
            out.append((r.cpu().tolist(), r.stride(), r.storage_offset()))
        return out

    assert cases(DEV) == cases("cpu")
    with pytest.raises(RuntimeError, match="out of bounds for storage"):  # eager's error
        torch.as_strided_scatter(
            torch.zeros(4, device=DEV), torch.ones(2, device=DEV), (2,), (1,), 3
        )


def test_resize_past_the_storage_keeps_its_elements():
    """Growing past the storage: the old elements in storage order, then zeros (eager's are
    uninitialized, so only the old ones are compared)."""
    for dev in ("cpu", DEV):
        x = _x(3, 4).to(dev).t()
        x.resize_(5, 4)
        got = x.cpu().reshape(-1)[:12]
        assert torch.equal(got, _x(3, 4).reshape(-1)), dev
    y = _x(2, 2).to(DEV)
    y.resize_(3, 3)
    assert torch.equal(y.cpu().reshape(-1)[4:], torch.zeros(5))


def test_set_errors_and_empty_as_eager():
    x = to_lazy(_x(2, 3))
    with pytest.raises(RuntimeError, match="Could not set tensor of type long int to a tensor"):
        x.set_(to_lazy(torch.arange(3)))
    with pytest.raises(RuntimeError, match='to a storage on different device "cpu"'):
        x.set_(_x(2, 3))
    x.set_()
    assert x.shape == (0,) and x.untyped_storage().nbytes() == 0
    assert not [k for k in metrics.counter_names() if k.startswith("aten::set_")]


@pytest.mark.parametrize(
    "call",
    [lambda t: t.t_(), lambda t: t.transpose_(0, 5), lambda t: t.squeeze_(7)],
    ids=["t_", "transpose_", "squeeze_"],
)
def test_inplace_metadata_errors_are_eagers(call):
    """An in-place metadata op's error is eager's, naming the in-place op (`t_()`, not `t()`),
    and the tensor keeps its shape."""
    with pytest.raises(Exception) as want:
        call(_x(2, 2, 2))
    x = to_lazy(_x(2, 2, 2))
    with pytest.raises(Exception) as got:
        call(x)
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)
    assert x.shape == (2, 2, 2) and torch.equal(x.cpu(), _x(2, 2, 2))
