"""Copy versus alias: a lazy tensor aliases another exactly when the eager CPU tensor does.

Each case runs one program on eager CPU and on lazyxla and compares every returned tensor's value,
shape, strides and storage offset, and for every pair whether they alias (`_base`, storage
`data_ptr()` equality, shared version counters). Regression tests for issue 10, case 1-3 and 7.
"""

from __future__ import annotations

import pytest
import torch

import lazyxla

DEV = lazyxla.device()


def _layout(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.dtype, t.stride(), t.storage_offset(), t.is_contiguous())


def _aliasing(ts: list[torch.Tensor]) -> list[tuple]:
    """Per pair: same storage pointer, same data pointer; per tensor: which one is its base."""
    ptr = [t.untyped_storage().data_ptr() for t in ts]
    out = []
    for i, a in enumerate(ts):
        base = next((j for j, b in enumerate(ts) if a._base is b), None)
        out.append(("base", i, a._base is None, base))
        for j in range(i + 1, len(ts)):
            out.append(("pair", i, j, ptr[i] == ptr[j], a.data_ptr() == ts[j].data_ptr()))
    return out


def check(program, *inputs: torch.Tensor, grad: bool = False) -> None:
    """Run `program(*inputs)` (returns a list of tensors) eagerly and on lazyxla; compare all."""

    def run(device: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        xs = [x.detach().clone().to(device) for x in inputs]
        xs = [x.requires_grad_(grad and x.is_floating_point()) for x in xs]
        return xs, program(*xs)

    exs, eouts = run(torch.device("cpu"))
    lxs, louts = run(DEV)
    assert [_layout(t) for t in louts] == [_layout(t) for t in eouts]
    assert _aliasing(lxs + louts) == _aliasing(exs + eouts)
    for e, lz in zip(exs + eouts, lxs + louts):
        torch.testing.assert_close(lz.detach().cpu(), e.detach(), rtol=0, atol=0, equal_nan=True)
    if grad:
        sum(o.sum() for o in eouts if o.requires_grad).backward()
        sum(o.sum() for o in louts if o.requires_grad).backward()
        for e, lz in zip(exs, lxs):
            if e.grad is not None:
                torch.testing.assert_close(lz.grad.cpu(), e.grad, rtol=0, atol=0)


def _m() -> torch.Tensor:
    return torch.arange(12.0).reshape(3, 4)


def test_contiguous_of_transpose_is_a_copy():
    def prog(b):
        c = b.t().contiguous()
        c.zero_()
        return [c]

    check(prog, _m())


def test_contiguous_of_contiguous_is_self():
    check(lambda b: [b.contiguous(), b.view(4, 3).contiguous()], _m())


def test_reshape_and_flatten_copy_when_eager_does():
    def prog(b):
        t = b.t()
        r, f = t.reshape(-1), t.flatten()
        r.add_(1)
        f.mul_(2)
        v = b.reshape(2, 6)  # viewable: an alias
        v.sub_(1)
        return [t, r, f, v]

    check(prog, _m())


def test_transpose_contiguous_mul_keeps_gradients():
    """`q = x.transpose(0, 1).contiguous(); q.mul_(0.5)` used to halve x and its gradient."""

    def prog(x):
        q = x.transpose(0, 1).contiguous()
        q.mul_(0.5)
        return [q, x * 3]

    check(prog, _m(), grad=True)


def test_inplace_on_contiguous_copy_of_leaf_view():
    """`w.t().contiguous().mul_(2)` on a leaf raised "a view of a leaf Variable"."""
    check(lambda w: [w.t().contiguous().mul_(2)], _m(), grad=True)


def test_expand_contiguous_is_writable_and_expand_is_not():
    check(lambda x: [x.expand(3, 4).contiguous().add_(1)], torch.arange(4.0))
    x = torch.arange(4.0).to(DEV)
    with pytest.raises(RuntimeError, match="more than one element"):
        x.expand(3, 4).add_(1)
    # Expanding without broadcasting keeps distinct elements: writable, as in eager.
    check(lambda x: [x.expand(1, 4).add_(1)], torch.arange(4.0).reshape(1, 4))


def test_elementwise_output_keeps_input_layout():
    def prog(b):
        y = b.t() * 2  # eager keeps the transposed layout: y is not contiguous
        z = y.reshape(-1)  # so this copies
        z.zero_()
        return [y, z, y.clone(), torch.empty_like(y).zero_()]

    check(prog, _m())


def test_view_of_noncontiguous_raises_like_eager():
    b = _m()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        b.t().view(-1)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        b.to(DEV).t().view(-1)


def test_slices_and_selects_have_eager_offsets_and_pointers():
    def prog(b):
        return [b[1], b[:, 1::2], b[1:, 2], b.narrow(1, 1, 2), b.diagonal(), *b.unbind(1)]

    check(prog, _m())


def test_version_counter_is_shared_with_views_only():
    for dev in ("cpu", DEV):
        b = _m().to(dev)
        v, c = b.t(), b.t().contiguous()
        before = (v._version, c._version)
        b.add_(1)
        assert (v._version > before[0], c._version > before[1]) == (True, False), dev


def test_unfold_is_a_view():
    def prog(x):
        u = x.unfold(1, 2, 2)
        u.mul_(10)
        return [u]

    check(prog, _m())
    check(lambda x: [x.unfold(0, 2, 1)], _m())
    # Overlapping windows: eager's result depends on its memory order; lazyxla refuses.
    with pytest.raises(RuntimeError, match="more than one element"):
        _m().to(DEV).unfold(1, 2, 1).add_(1)


# Note [Overlapping writes] (writes.py): a fill of an overlapping view, then backward. Autograd
# (CopySlices) copies the fill's gradient, a tensor of zeros, into the same overlapping view of the
# gradient: eager's copy_ does not refuse a target whose overlap needs more than a zero stride to
# see, and a source of one value gives every alias the same value, so its result is defined.
_WINDOWS = {
    "unfold": lambda t: t.unfold(0, 4, 2),  # windows 0-3, 2-5, 4-7, 6-9: element 10 is not in one
    "unfold_step1": lambda t: t.unfold(0, 3, 1),
    "as_strided": lambda t: t.as_strided((3, 4), (3, 1), 1),
}
_FILLS = {
    "zero_": lambda w: w.zero_(),
    "fill_": lambda w: w.fill_(3.0),
    "fill_negative_zero": lambda w: w.fill_(-0.0),
    "copy_one_value": lambda w: w.copy_(torch.full((1, w.shape[1]), 2.5, device=w.device)),
}


def _fill_then_backward(device, window, fill):
    x = torch.linspace(-1, 1, 11).to(device).requires_grad_()
    t = x * 1
    fill(window(t))
    (t * torch.arange(11.0, device=device)).sum().backward()
    return t.detach().cpu(), x.grad.cpu()


@pytest.mark.parametrize("fill", list(_FILLS))
@pytest.mark.parametrize("window", list(_WINDOWS))
def test_fill_of_overlapping_view_then_backward(window, fill):
    eager = _fill_then_backward("cpu", _WINDOWS[window], _FILLS[fill])
    lazy = _fill_then_backward(DEV, _WINDOWS[window], _FILLS[fill])
    for e, lz in zip(eager, lazy):
        torch.testing.assert_close(lz, e, rtol=0, atol=0)
        assert torch.equal(lz.signbit(), e.signbit())


@pytest.mark.parametrize("window", list(_WINDOWS))
def test_negative_zero_fill_of_overlapping_view_over_zeros(window):
    """The write-back stores an alias whose bits changed: -0.0 over 0.0 is a change (`!=` says
    it is not, and the base kept +0.0)."""
    out = []
    for device in ("cpu", DEV):
        t = torch.zeros(11).to(device)
        _WINDOWS[window](t).fill_(-0.0)
        out.append(t.cpu())
    assert torch.equal(out[1].signbit(), out[0].signbit())


def test_fill_of_expanded_view_then_backward_raises_like_eager():
    """A zero stride is overlap eager's copy_ sees: the gradient's copy raises there too."""
    for device in ("cpu", DEV):
        x = torch.ones(4).to(device).requires_grad_()
        t = x * 1
        t.expand(3, 4).zero_()  # a store: allowed on an expanded view
        with pytest.raises(RuntimeError, match="more than one element"):
            t.sum().backward()


def test_copy_onto_the_same_view_is_a_no_op_even_when_it_overlaps():
    """Eager's `copy_` returns at once when the source views exactly the destination's elements
    (Copy.cpp), before its overlap checks; lazyxla raised the internal-overlap error for a stride-0
    view copied from its own transpose (the view fuzzer's program)."""

    def prog(x):
        t1 = x.as_strided((2,), (0,), 0)
        t1.copy_(t1.transpose(0, 0))
        w = x.reshape(-1)[1:3]
        w.copy_(x.reshape(-1)[1:3])
        return [t1, w]

    check(prog, torch.arange(1.0).reshape(()))
    check(prog, torch.arange(4.0))


def test_loop_order_dependent_copy_into_overlapping_view_raises():
    """A masked fill's gradient, or any source that can give two aliases of one location two
    values, leaves the location to eager's loop order: lazyxla refuses it rather than pick."""
    x = torch.arange(10.0).to(DEV).requires_grad_()
    t = x * 1
    t.unfold(0, 4, 2).masked_fill_(torch.tensor([True, False, True, False], device=DEV), 0)
    with pytest.raises(RuntimeError, match="loop order"):
        t.sum().backward()
    w = torch.arange(10.0).to(DEV).unfold(0, 4, 2)
    with pytest.raises(RuntimeError, match="loop order"):
        w.copy_(torch.arange(16.0).reshape(4, 4).to(DEV))


def test_a_partial_store_through_a_narrower_view_of_an_expand_raises():
    """Note [Overlapping writes]: a masked fill through an int16 view of an expanded int32 tensor
    (the view fuzzer's program) wrote garbage: the aliases fill different halves of one int32,
    and the merge back through the expand took one alias's whole element. It raises now; the same
    fills at the expand's own dtype match eager, and so does a fill that writes every element."""

    def program(device, narrow):
        t0 = torch.arange(8, dtype=torch.int32).reshape(2, 4).to(device, copy=True)
        t1 = t0.expand(3, -1, -1)
        t0.masked_fill_(torch.ones(4, dtype=torch.bool).to(device), -1)
        t3 = t1.view(torch.int16) if narrow else t1
        mask = torch.arange(t3.numel()).reshape(t3.shape) % 3 == 0
        t3.masked_fill_(mask.to(device), 0)
        return t0

    with pytest.raises(RuntimeError, match="narrower dtype"):
        program(DEV, narrow=True)
    assert torch.equal(program(DEV, narrow=False).cpu(), program("cpu", narrow=False))
    x = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    y = x.to(DEV)
    x.expand(3, -1, -1).view(torch.int16).fill_(7)
    y.expand(3, -1, -1).view(torch.int16).fill_(7)
    assert torch.equal(y.cpu(), x)
    # A narrower view below the expand merges at its own elements: not refused (the fuzzer's
    # next program: the imaginary part of a complex tensor, expanded and masked-filled)
    for narrow in (lambda c: c.imag, lambda c: c.view(torch.float32)):
        c = torch.arange(8.0).view(torch.complex64)
        c_dev = c.to(DEV)
        for t in (c, c_dev):
            v = narrow(t)
            mask = (torch.arange(3 * v.numel()).reshape(3, -1) % 2 == 0).to(t.device)
            v.expand(3, -1).masked_fill_(mask, -1.0)
        assert torch.equal(torch.view_as_real(c_dev.cpu()), torch.view_as_real(c))


def test_view_dtype_reinterprets_bits():
    f = torch.tensor([1.0, -2.0])
    lz = f.to(DEV)
    assert lz.view(torch.int32).cpu().tolist() == [1065353216, -1073741824]
    assert lz.view(torch.uint8).shape == (8,)
    for dtype in (torch.int32, torch.uint8, torch.int16, torch.bfloat16, torch.float16):
        check(lambda x, dt=dtype: [x.view(dt)], torch.randn(4, 6))
    check(lambda x: [x.view(torch.float64), x.view(torch.complex64)], torch.randn(3, 4))
    check(lambda x: [x.view(torch.float32)], torch.randint(-(2**31), 2**31 - 1, (2, 4)))
    check(lambda x: [x.view(torch.float32)], torch.randn(2, 3, dtype=torch.complex64))


def test_write_through_view_dtype_reaches_base():
    def prog(x):
        i = x.view(torch.int32)
        i.bitwise_xor_(-(2**31))  # flips every sign bit
        return [i]

    check(prog, torch.randn(3, 4))


@pytest.mark.parametrize(
    "chain",
    [
        (torch.int16, torch.uint8),  # two narrowings
        (torch.int16, torch.int8),
        (torch.uint8, torch.int16, torch.int32),  # two widenings after one narrowing
        (torch.int8, torch.float16, torch.int32),
        (torch.bfloat16, torch.uint8, torch.float32),
        (torch.complex64, torch.int16, torch.uint8),
    ],
    ids=lambda c: "-".join(str(d).removeprefix("torch.") for d in c),
)
def test_chained_views_between_widths_compile_and_keep_bits(chain):
    """Note [Bitcasts between widths]: XLA folded two width-changing bitcasts in a row into one
    its verifier rejects, so `x.view(torch.int16).view(torch.uint8)` failed to compile. Each view
    of the chain, read and written through (the view fuzzer's program: a write through the first
    view, then the next one), holds eager's bits."""

    def prog(x):
        outs, v = [], x
        for dt in chain:
            v = v.view(dt)
            outs.append(v)
        outs[0].view(torch.uint8).add_(3)  # a write through a view reaches every other one
        return outs + [x.view(torch.uint8), *(o.view(torch.uint8) for o in outs)]

    check(prog, torch.randn(3, 8))
    check(prog, torch.randn(2, 4, dtype=torch.float64))


def test_as_strided_reads_storage_order():
    def prog(x):
        y = x.t() * 1  # a base whose storage order is transposed
        return [y.as_strided((4,), (2,), 1), x.as_strided((2, 2), (1, 4), 3)]

    check(prog, _m())

    def writes(x):
        v = x.as_strided((3, 2), (4, 1), 1)
        v.zero_()
        return [v]

    check(writes, _m())


def test_as_strided_out_of_bounds_raises():
    for x in (_m(), _m().to(DEV)):
        with pytest.raises(RuntimeError, match="out of bounds for storage"):
            x.as_strided((4, 4), (4, 1))


def test_to_preserves_a_dense_layout():
    check(lambda x: [x.t().to(torch.float64), x.t().clone()], _m())
    x = _m().t()
    assert x.to(DEV).stride() == x.stride()
    assert x.to(DEV).cpu().stride() == x.stride()
    cl = torch.randn(2, 3, 4, 5).to(DEV).contiguous(memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last)


def test_distinct_tensors_have_distinct_storage_pointers():
    """transformers' tied-weight detection compares storage pointers."""
    lin = torch.nn.Linear(4, 4).to(DEV)
    a, b = lin.weight, lin.bias
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert a.untyped_storage().data_ptr() == a.detach().untyped_storage().data_ptr()


@pytest.mark.parametrize("spec", ["jax:5", "jax:99"])
def test_device_index_other_than_zero_raises(spec):
    with pytest.raises(RuntimeError, match="one device per process"):
        torch.ones(2).to(spec)
    with pytest.raises(RuntimeError, match="one device per process"):
        torch.zeros(2, device=spec)
    assert torch.ones(2).to("jax:0").device == DEV


def test_out_tensors_take_the_result_shape_as_in_eager():
    """An `out=` tensor of another shape is resized to the result's, as eager's resize_output
    does (silently when empty, with eager's deprecation warning otherwise): `out=torch.empty(0)`
    kept its shape and read back empty, and a mis-sized one failed to lower."""
    import warnings

    def run(dev):
        a = torch.tensor([1.5, -2.0, 3.0], device=dev)
        empty, sized = torch.empty(0, device=dev), torch.empty(5, device=dev)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.add(a, a, out=empty)
            torch.addmm(torch.zeros(3, 3, device=dev), a.view(3, 1), a.view(1, 3), out=sized)
        resized = [w for w in caught if "was resized" in str(w.message)]
        # two out= tensors: both come back (the kernel returned only the first: a TypeError)
        v, i = torch.empty(3, device=dev), torch.empty(3, dtype=torch.int64, device=dev)
        got = torch.max(a.view(3, 1), 1, out=(v, i))
        assert got[0] is v and got[1] is i
        return empty.cpu(), sized.cpu(), len(resized), v.cpu(), i.cpu()

    expected = run("cpu")
    actual = run(lazyxla.device())
    for e, a in zip(expected, actual):
        assert torch.equal(a, e) if isinstance(e, torch.Tensor) else a == e
    assert expected[2] == 1


# Inexact in float32 (a float64 out shows which dtype computed) and fractional (an int32 out
# shows the elements truncated first); for a float16 out, values whose sums and products are
# exact in float16, since eager's float16 `prod` rounds at every step in its vector lanes
# (ISA-dependent) where lazyxla rounds once.
_X = torch.tensor([1.5, 2.7, -3.9, 1000.25, -7.0, 0.3])
_X16 = torch.tensor([1.5, 2.0, -3.0, 4.0, -0.5, 0.25])
_OUT_DTYPE_OPS = {
    "sum": lambda x, o: torch.sum(x, 0, out=o),
    "sum.out": lambda x, o: torch.ops.aten.sum.out(x, out=o),
    "nansum": lambda x, o: torch.nansum(x, 0, out=o),
    "mean": lambda x, o: torch.mean(x, 0, out=o),
    "prod": lambda x, o: torch.prod(x, 0, out=o),
    "prod.out": lambda x, o: torch.ops.aten.prod.out(x, out=o),
    "cumsum": lambda x, o: torch.cumsum(x, 0, out=o),
    "cumprod": lambda x, o: torch.cumprod(x, 0, out=o),
    "amax": lambda x, o: torch.amax(x, 0, out=o),
    "vector_norm": lambda x, o: torch.linalg.vector_norm(x, 2, 0, out=o),
    "mm": lambda x, o: torch.mm(x.view(2, 3), x.view(3, 2), out=o),
    "add": lambda x, o: torch.add(x, 0.1, out=o),
}


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(_OUT_DTYPE_OPS))
def test_out_tensors_of_another_dtype_as_in_eager(name, dtype):
    """Note [Out= tensors of another dtype]: reductions and scans with a `dtype` argument compute
    in the out tensor's dtype (`sum(f32, out=int32_t)` sums the truncated elements; with a float64
    out, in float64), others refuse the mismatch. lazyxla computed in float32 and cast, or raised
    where eager computes."""
    fn = _OUT_DTYPE_OPS[name]

    x = _X16 if dtype == torch.float16 else _X

    def run(dev):
        out = torch.empty(0, dtype=dtype, device=dev)
        try:
            fn(x.to(dev), out)
        except (RuntimeError, NotImplementedError) as e:
            return e
        return out.cpu()

    expected, actual = run("cpu"), run(DEV)
    if isinstance(expected, Exception):
        assert isinstance(actual, type(expected)), actual
        assert str(actual).split("\n")[0] == str(expected).split("\n")[0]
    else:
        assert isinstance(actual, torch.Tensor), actual
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        # (float64 references: eager's own f32 sums round as XLA's may not, so compare values
        # at the out dtype's precision; the computation dtype shows as a large difference)
        tol = {torch.float16: 1e-3, torch.float64: 1e-15}.get(dtype, 0)
        torch.testing.assert_close(actual, expected, rtol=tol, atol=0)


def test_cpu_fallback_resizes_out_tensors():
    """An op without a lowering resizes its `out=` tensor as eager does (the host copy's storage
    was not resizable: "Trying to resize storage that is not resizable")."""
    import warnings

    def run(dev):
        o, p = torch.empty(3, device=dev), torch.empty(0, device=dev)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.arange(5, out=o)
            torch.linspace(0, 1, 4, out=p)
        return o.cpu(), p.cpu()

    for e, a in zip(run("cpu"), run(DEV)):
        assert torch.equal(a, e)


_T = torch.tensor([[1.5, -2.0, 0.25], [3.0, 0.0, -0.5]])
_OUT_OVERLOADS = {
    # out= overloads whose functional shares its argument names with another overload of other
    # types: each took the first by name (clamp.Tensor_out ran clamp's Scalar overload and
    # raised; lerp.Tensor_out ran lerp.Scalar)
    "clamp_tensor": lambda x, o: torch.clamp(x, x * 0 - 1, x * 0 + 1, out=o),
    "clamp_min_tensor": lambda x, o: torch.clamp_min(x, x * 0, out=o),
    "clamp_max_tensor": lambda x, o: torch.clamp_max(x, x * 0, out=o),
    "lerp_tensor": lambda x, o: torch.lerp(x, x * 2, x * 0 + 0.9, out=o),
    "masked_fill_tensor": lambda x, o: torch.ops.aten.masked_fill.Tensor_out(
        x, x > 0, torch.tensor(7.0), out=o
    ),
    "pow_tensor_scalar": lambda x, o: torch.ops.aten.pow.Tensor_Scalar_out(x, 3, out=o),
    "all_dims": lambda x, o: torch.ops.aten.all.dims_out(x, [0, 1], out=o),
    "kron": lambda x, o: torch.kron(x, x[:, :2], out=o),
}


@pytest.mark.parametrize("name", list(_OUT_OVERLOADS))
def test_out_overloads_run_their_own_functional(name):
    """`kron(out=)` wrote its product through an `_unsafe_view` of `out`, which in lazyxla is a
    new value: `out` kept its old contents. Each case matches eager's values and shape."""
    fn = _OUT_OVERLOADS[name]

    def run(dev):
        x = _T.to(dev)
        out = torch.empty(0, dtype=torch.bool if name == "all_dims" else x.dtype, device=dev)
        fn(x, out)
        return out.cpu()

    expected, actual = run("cpu"), run(DEV)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_out_dtype_refused_for_a_large_input_of_a_shaped_op():
    """The eager probe of an out= dtype runs on zeros of the real shape up to 2**20 elements: a
    sort or slice_scatter of 8000 elements into a float64 out computed and cast where eager
    raises."""
    x = torch.randn(20, 20, 20)
    for fn in (
        lambda x, o: torch.sort(x, out=(o, torch.empty(0, dtype=torch.int64, device=x.device))),
        lambda x, o: torch.slice_scatter(x, x[:10] * 2, 0, 0, 10, out=o),
    ):
        with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float"):
            fn(x, torch.empty(0, dtype=torch.float64))
        with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float"):
            fn(x.to(DEV), torch.empty(0, dtype=torch.float64, device=DEV))


def test_inplace_ops_derived_through_out_and_metadata():
    """From an OpInfo sweep of in-place variants: `ldexp_` (eager's `ldexp(x, y, out=x)`) with a
    broadcast shape raises eager's error where lazyxla resized `x` (an out= tensor that is also
    an input is not resized by eager's TensorIterator); `as_strided_` failed to lower."""

    def ldexp(dev):
        x, y = torch.randn(5, 1).to(dev), torch.randn(5, 5).to(dev)
        with pytest.raises(RuntimeError, match=r"output with shape \[5, 1\] doesn't match"):
            x.ldexp_(y)
        with pytest.raises(RuntimeError, match=r"output with shape \[5, 1\] doesn't match"):
            torch.mul(x, y, out=x)
        return x.cpu()

    def as_strided(dev):
        base = torch.arange(12.0).to(dev)
        x = base[:9].view(3, 3)
        y = x.as_strided_((2, 2), (1, 2), 1)
        assert y is x
        layout = (tuple(x.shape), x.stride(), x.storage_offset())
        x.mul_(10)
        return x.cpu(), base.cpu(), layout

    torch.manual_seed(0)
    expected = ldexp("cpu")
    torch.manual_seed(0)
    assert torch.equal(ldexp(DEV), expected)
    (xe, be, le), (xl, bl, ll) = as_strided("cpu"), as_strided(DEV)
    assert le == ll and torch.equal(xl, xe) and torch.equal(bl, be)
