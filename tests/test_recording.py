"""Recording plans (Note [Recording plans], recording.py): a call that hits a plan made by an
earlier call of another signature must still record what the slow path would. Each case runs
the same ops, in an order that alternates signatures, on lazyxla and in eager, and compares
values and dtypes."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import lazyxla

DEV = lazyxla.device()


def _ops(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    i = (x * 10).to(torch.int32)
    b = x.to(torch.bfloat16)
    return [
        x * 2.5,
        x * 1.0,
        x * 1,
        x * True,
        x * -0.0,
        x + 0.0,
        x / -0.0,
        x * math.nan,
        x * math.inf,
        x.add(w, alpha=2),
        x.add(w, alpha=1),
        x.add(w, alpha=0.5),
        i * 2.5,
        i * 2,
        i * torch.tensor(2.5, dtype=torch.float64),
        i * torch.tensor(2, dtype=torch.int64),
        x * torch.tensor(3.0, dtype=torch.float64),
        x[0] * torch.tensor(3.0, dtype=torch.float64),  # 0-d against 0-d: float64
        x[0] * 3.0,
        b * 0.3,  # bf16 mul reads its scalar at float32 (Note [Scalar precision])
        b + 0.3,
        x.t() * 0.7,  # a transposed input keeps its layout
        x.t().contiguous() * 0.7,
        w * 0.7 + x.t(),
        torch.sub(0.25, x) if False else 0.25 - x,
        torch.clamp(x, -0.5, 0.5),
        torch.clamp(x, -0.25, 0.75),
        x.sum(0, keepdim=True),
        x.sum(1),
        # A unit 0-d CPU tensor (baked) before a lifted one: the plan must lift the second.
        torch.where(x > 0, torch.tensor(1.0), torch.tensor(2.5)),
        torch.where(x > 0, torch.tensor(1.0), torch.tensor(-3.5)),
        torch.addcmul(x, torch.tensor(1.0), torch.tensor(0.75)),
        torch.addcmul(x, torch.tensor(0.0), torch.tensor(1.25)),
        torch.cat([x, w]),  # tensor lists: their lengths are part of the signature
        torch.cat([x, w, x]),
        torch.cat([w, x.t()]),
        torch.stack([x, w], 1),
    ]


@pytest.mark.parametrize("rounds", [2])
def test_alternating_signatures_record_like_eager(rounds):
    torch.manual_seed(0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    ref = _ops(x, w)
    xd, wd = x.to(DEV), w.to(DEV)
    for _ in range(rounds):
        out = _ops(xd, wd)
        lazyxla.sync()
        for r, o in zip(ref, out, strict=True):
            assert o.dtype == r.dtype and o.shape == r.shape and o.stride() == r.stride()
            o = o.cpu()
            torch.testing.assert_close(o, r, equal_nan=True, rtol=1e-6, atol=1e-6)
            assert torch.equal(torch.signbit(o), torch.signbit(r))  # -0.0 is not 0.0


def test_plans_do_not_add_compiles():
    from lazyxla.debug import metrics

    x = torch.randn(8, 8).to(DEV)
    lazyxla.sync()

    def chain(v: float) -> torch.Tensor:
        y = x
        for _ in range(10):
            y = y * v + 0.5
        return y

    chain(1.5).cpu()
    c0 = metrics.counter_value("UncachedCompile")
    torch.testing.assert_close(chain(0.25).cpu(), chain(0.25).cpu())
    assert metrics.counter_value("UncachedCompile") == c0


def _factories(d: torch.device | str) -> list[torch.Tensor]:
    return [
        torch.arange(5, device=d),
        torch.arange(2, 9, device=d),  # other ints: another shape, another signature
        torch.arange(2, 9, 3, device=d),
        torch.arange(4, dtype=torch.float32, device=d),
        torch.full((2, 3), 1.5, device=d),  # no dtype: the default dtype's
        torch.full((2, 3), 2, device=d),  # an int fill: int64
        torch.full((2, 3), True, device=d),
        torch.full((2, 3), -0.0, device=d),
        torch.zeros(3, device=d),
        torch.ones(2, 2, dtype=torch.int32, device=d),
        torch.scalar_tensor(2.5, device=d),
        torch.scalar_tensor(7, dtype=torch.int64, device=d),
        torch.empty(0, device=d),
    ]


def _numbers(i: torch.Tensor) -> list[torch.Tensor]:
    """Ops whose result dtype is the default dtype: a Python float against integers."""
    return [i * 2.5, i + 1.5, 0.5 - i, torch.where(i > 1, i, 2.5), i.float() * 2.5, i * 2]


def test_factory_plans_like_eager():
    """Factories (ops with a device argument) replay plans too: their signature holds the device
    and the default dtype, which types a result given no dtype. So does an op on a Python float
    and an integer tensor (it typed its result float32 after `set_default_dtype(float64)`)."""
    i = torch.tensor([1, 2, 3])
    for default in (torch.float32, torch.float64, torch.float32):
        with _default_dtype(default):
            ref = _factories("cpu") + _numbers(i)
            for _ in range(2):
                out = _factories(DEV) + _numbers(i.to(DEV))
                for r, o in zip(ref, out, strict=True):
                    assert o.dtype == r.dtype and o.shape == r.shape, (o, r)
                    o = o.cpu()
                    assert torch.equal(o, r) and torch.equal(torch.signbit(o), torch.signbit(r))
    # a second lazyxla device is refused on a replayed call too (Note [Recording plans])
    torch.zeros(3, device=DEV)
    with pytest.raises(RuntimeError, match="one device per process"):
        torch.zeros(3, device=torch.device(DEV.type, 1))


class _default_dtype:
    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __enter__(self) -> None:
        self.old = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc: object) -> None:
        torch.set_default_dtype(self.old)


def _views(x: torch.Tensor) -> list[torch.Tensor]:
    out = [
        x.t(),
        x[1],
        x[-1],
        x[:, 1:3],
        x[:, ::2],
        x.unsqueeze(0).expand(3, *x.shape),
        x.t()[1:, 2],
        x.diagonal(1),
        x.transpose(0, 1)[1:],
    ]
    if x.is_contiguous():
        out += [x.view(-1), x.view(2, -1), x.view(torch.int32)]
    return out


def test_view_plans_alternate_signatures_like_eager():
    """A view kernel's plan (Note [Recording plans]) replays its input's layout and statics: views
    of other layouts and statics, in alternation, keep eager's values, layouts and aliasing."""
    torch.manual_seed(0)
    x = torch.randn(4, 4)
    xd = x.to(DEV)
    for _ in range(2):
        for src, dst in ((x, xd), (x.t(), xd.t()), (x[1:], xd[1:])):
            ref, out = _views(src), _views(dst)
            for r, o in zip(ref, out, strict=True):
                assert o.shape == r.shape and o.dtype == r.dtype and o.stride() == r.stride()
                assert o.storage_offset() == r.storage_offset()
                assert torch.equal(o.cpu(), r)
    # Writes through planned views reach the base and every other view, as in eager.
    for t in (x, xd):
        t.t()[1:, 2].add_(1.0)
        t[:, ::2].mul_(2.0)
    assert torch.equal(xd.cpu(), x)
    assert torch.equal(xd.t()[1:, 2].cpu(), x.t()[1:, 2])


def test_plans_read_views_their_base_changed_under():
    """A planned op on a view made before its base was written reads the written values (the
    view's chain is replayed, `read`), in every plan input position and in a tensor list."""
    outs = []
    for d in ("cpu", DEV):
        torch.manual_seed(0)
        x = torch.randn(4, 4).to(d)
        v, w = x[1:], x.t()[1:]
        got = []
        for step in range(3):  # the first call makes each plan, later calls replay it
            x.mul_(1.5 + step)  # v and w are stale now
            got += [v * 2.5, 0.25 - w, torch.add(x[:3], v, alpha=0.5), torch.cat([v, w])]
        outs.append([t.cpu() for t in got])
    for r, o in zip(*outs, strict=True):
        torch.testing.assert_close(o, r)


def test_planned_outputs_are_what_the_slow_path_builds():
    """A plan builds its nodes and output tensor inline (Note [Generated recording code]): each
    field of a replayed call's output, its state and its node (and a lifted scalar's leaf) is
    what the slow path's call built, and the output's storage is a fresh range of the same size
    (Note [Fake data pointers])."""
    from lazyxla._src.ir import Node
    from lazyxla._src.tensor import LazyState, state

    x = torch.randn(4, 6).to(DEV)
    per_call = ("seq", "value", "__weakref__")
    for make in (lambda: x * 2.5, lambda: x.t() * 2.5, lambda: x[:0] * 2.5, lambda: x + x):
        # the slow path, then the plan made from it, twice (each reserves a range after the last)
        first, replayed, again = make(), make(), make()
        for t in (first, replayed, again):
            assert t.stride() == first.stride() and t.storage_offset() == 0
        a, b = state(first), state(replayed)
        for slot in LazyState.__slots__:
            if slot not in per_call:  # (ir_data: set only by a debug dump)
                assert getattr(a, slot, None) == getattr(b, slot, None), slot
        assert a.seq < b.seq and a.value[1] == b.value[1] == 0
        na, nb = a.value[0], b.value[0]
        for slot in Node.__slots__:
            if slot != "inputs":
                assert getattr(na, slot) == getattr(nb, slot), slot
        assert len(na.inputs) == len(nb.inputs)
        for (ia, ka), (ib, kb) in zip(na.inputs, nb.inputs, strict=True):
            assert ka == kb
            for slot in Node.__slots__:  # x's value is one node; a lifted 2.5 is a fresh leaf
                va, vb = getattr(ia, slot), getattr(ib, slot)
                assert va is vb or va == vb, slot
        sa, sb, sc = (t.untyped_storage() for t in (first, replayed, again))
        assert sa.nbytes() == sb.nbytes() == sc.nbytes()
        if sa.nbytes():
            assert sb.data_ptr() % 64 == 0 and sc.data_ptr() - sb.data_ptr() >= sb.nbytes()


def test_float_statics_and_bool_masks_key_plans_exactly():
    """A baked float static (a norm's eps) and a `bool[]` static (a backward's output mask) are
    in the signature by value: calls alternating them replay each one's own plan and keep
    eager's values and gradients."""
    torch.manual_seed(0)
    x, w = torch.randn(3, 8), torch.randn(8)
    outs = []
    for d in ("cpu", DEV):
        got = []
        for _ in range(2):
            for eps in (1e-5, 0.5, 2.0, 0.5):
                got.append(torch.nn.functional.layer_norm(x.to(d), (8,), eps=eps))
                got.append(torch.nn.functional.rms_norm(x.to(d), (8,), eps=eps))
            for needs in ((True, False), (True, True), (False, True), (True, False)):
                xd = x.to(d).detach().requires_grad_(needs[0])
                wd = w.to(d).detach().requires_grad_(needs[1])
                y = torch.nn.functional.layer_norm(xd, (8,), wd, eps=1e-5)
                r = torch.nn.functional.rms_norm(xd, (8,), wd, eps=1e-5)
                wrt = [t for t, n in zip((xd, wd), needs, strict=True) if n]
                got += torch.autograd.grad((y * y).sum() + (r * r).sum(), wrt)
        outs.append([t.detach().cpu() for t in got])
    for r, o in zip(*outs, strict=True):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


def _inplace_ops(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    """In-place ops in alternating signatures; each writes a fresh clone (or a view of one)."""
    i = (x * 10).to(torch.int32)
    b = x.to(torch.bfloat16)
    c = x.clone()
    alias = c.detach()  # shares c's storage: a write to either is seen by both
    out = [
        x.clone().mul_(2.5),
        x.clone().mul_(-0.0),
        x.clone().mul_(0.25),  # same signature as 2.5: the plan replays with another scalar
        x.clone().add_(w, alpha=2),
        x.clone().add_(w, alpha=0.5),
        x.clone().add_(w),
        x.clone().div_(math.nan),
        x.clone().mul_(torch.tensor(3.0, dtype=torch.float64)),  # 0-d CPU tensor operand
        x.clone().lerp_(w, 0.3),
        x.clone().zero_(),
        x.clone().fill_(-0.0),
        x.clone().fill_(2.5),
        i.clone().add_(3),
        i.clone().mul_(2),
        b.clone().mul_(0.3),  # bf16 reads its scalar at float32 (Note [Scalar precision])
        b.clone().add_(x),  # a float32 result cast into the bf16 target: the slow path's cast
        x.clone().add_(b),
        c.add_(1.5),
        alias.mul_(3.0),  # through the alias: c sees it too
        c,
        x.clone().t().add_(w),  # a transposed base keeps its layout
        x.clone()[1:].add_(0.5),  # a view target: its base gets the write
        x.clone().clamp_(-0.5, 0.5),
        x.clone().clamp_(-0.25, None),
    ]
    v = x.clone()
    v[:, 1].mul_(4.0)  # through a view of a base with the same signature as a planned base op
    out.append(v)
    y = x.clone()
    y.add_(y)  # the target is also the input
    out.append(y)
    u = x.clone()
    row = u[1]
    u.mul_(2.5)  # a planned write to a base: its views see it
    out.append(row)
    return out


def test_inplace_plans_alternate_signatures_like_eager():
    """In-place plans (Note [In-place recording plans]): alternating signatures, scalars,
    aliases, views and casting writes record what the slow path would, values as in eager."""
    torch.manual_seed(0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    ref = _inplace_ops(x, w)
    xd, wd = x.to(DEV), w.to(DEV)
    for _ in range(3):
        out = _inplace_ops(xd, wd)
        lazyxla.sync()
        for r, o in zip(ref, out, strict=True):
            assert o.dtype == r.dtype and o.shape == r.shape and o.stride() == r.stride()
            o = o.cpu()
            torch.testing.assert_close(o, r, equal_nan=True, rtol=1e-6, atol=1e-6)
            assert torch.equal(torch.signbit(o), torch.signbit(r))


def test_inplace_plan_keeps_eager_errors():
    """A call whose result cannot be written into its target fails as in eager every time, also
    after a call of another signature made a plan."""
    xd = torch.randn(4, 4).to(DEV)
    i = torch.arange(16, dtype=torch.int32).reshape(4, 4).to(DEV)
    xd.clone().add_(1.5)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="can't be cast"):
            i.clone().add_(1.5)
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape|must match"):
            xd[:1].clone().add_(xd)
        i.clone().add_(2)


def _foreach_ops(xs: list[torch.Tensor], ws: list[torch.Tensor], k: float) -> list[torch.Tensor]:
    """Foreach ops (lists and scalar lists) in alternating signatures, an optimizer's shapes."""
    a = [x.clone() for x in xs]
    torch._foreach_mul_(a, k)
    torch._foreach_lerp_(a, ws, 0.1)
    torch._foreach_addcmul_(a, ws, ws, 1 - k)
    r = torch._foreach_sqrt(torch._foreach_abs(a))
    torch._foreach_div_(r, [k, 2.0 * k, 1.0][: len(r)])
    torch._foreach_add_(r, 1e-8)
    torch._foreach_addcdiv_(a, ws, r, [-k, 1.0, 0.0][: len(a)])
    b = [x.clone() for x in xs[:2]]
    torch._foreach_mul_(b, [1.0, k][: len(b)])
    return [*a, *r, *b]


def test_foreach_plans_like_eager():
    """Foreach recording plans: list lengths, lifted and baked scalar-list entries, and new
    scalar values each call, as eager computes them."""
    torch.manual_seed(0)
    shapes = [(4, 4), (3,), (2, 5)]
    xs = [torch.randn(s) for s in shapes]
    ws = [torch.randn(s) for s in shapes]
    xd, wd = [x.to(DEV) for x in xs], [w.to(DEV) for w in ws]
    for k in (0.5, 0.25, 0.75):
        for n in (3, 2, 3):
            ref = _foreach_ops(xs[:n], ws[:n], k)
            out = _foreach_ops(xd[:n], wd[:n], k)
            lazyxla.sync()
            for r, o in zip(ref, out, strict=True):
                torch.testing.assert_close(o.cpu(), r, rtol=1e-6, atol=1e-6)


def test_foreach_ops_that_alias_run_index_by_index():
    """Note [Foreach ops that alias]: eager's CPU foreach ops run tensor by tensor, so a tensor
    written at one index and read at another sees the new value; written twice, it is written
    twice. Also after a disjoint call of the same signature made a plan."""
    results = {}
    for dev in ("cpu", DEV):
        a, b = torch.ones(3, device=dev), torch.full((3,), 2.0, device=dev)
        c, d = torch.ones(3, device=dev), torch.full((3,), 2.0, device=dev)
        s0, e = torch.tensor(2.0, device=dev), torch.ones(3, device=dev)
        for _ in range(2):
            torch._foreach_add_([c, d], [d.clone(), c.clone()])  # disjoint: a plan
            torch._foreach_add_([a, b], [b, a])
            torch._foreach_add_([a, a], 1.5)
            torch._foreach_mul_([s0, e], s0)  # the Tensor operand is also written
        results[dev] = [t.cpu() for t in (a, b, c, d, s0, e)]
    for r, o in zip(results["cpu"], results[DEV], strict=True):
        torch.testing.assert_close(o, r)


def test_foreach_adamw_steps_like_eager():
    """AdamW's foreach step (planned after its first call) over several steps, as in eager."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    dev_model = copy.deepcopy(model).to(DEV)
    runs = []
    for m, dx, dy in ((model, x, y), (dev_model, x.to(DEV), y.to(DEV))):
        opt = torch.optim.AdamW(m.parameters(), lr=0.05, weight_decay=0.1, foreach=True)
        for _ in range(4):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(dx), dy).backward()
            opt.step()
            lazyxla.sync()
        runs.append([p.detach().cpu() for p in m.parameters()])
    for r, o in zip(*runs, strict=True):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-6)


def test_like_factories_do_not_hold_their_inputs_graph():
    """Note [Like factories read a layout]: `zeros_like(y)` recorded y's whole computation as its
    input, so each producer of y made a new graph (and a compile) for the same zeros."""
    import lazyxla.debug.metrics as met

    x = torch.randn(3, 4).to(DEV)
    lazyxla.sync()
    compiles = []
    for make in (lambda: (x * 2).exp(), lambda: x.sin() + 1):  # two producers
        y = make()
        outs = [
            torch.zeros_like(y),
            torch.ones_like(y.t()),
            torch.full_like(y, 2.5, dtype=torch.float64),
            torch.empty_like(y).fill_(3),
        ]
        del y  # only the factories' results are live: y's graph is not theirs
        c = met.counter_value("UncachedCompile") or 0
        got = [o.cpu() for o in outs]
        compiles.append((met.counter_value("UncachedCompile") or 0) - c)
        ref = [
            torch.zeros(3, 4),
            torch.ones(3, 4).t(),
            torch.full((3, 4), 2.5, dtype=torch.float64),
            torch.full((3, 4), 3.0),
        ]
        for g, r in zip(got, ref):
            assert torch.equal(g, r) and g.stride() == r.stride()
    assert compiles[1] == 0, compiles  # the second producer's factories reuse the first graph


def _guard_cases(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    """Calls that each differ from a guarded plan made just before (Note [Guarded plans]) in one
    argument: a guard that let it through would replay the other call's plan."""
    i = (x * 10).to(torch.int32)
    leaky, rsub = torch.ops.aten.leaky_relu.default, torch.ops.aten.rsub.Scalar
    c = x.clone()
    view = c.t()
    before = view * 2.5
    c.add_(1.0)  # the view is stale: a replay must read its base's write
    return [
        before,
        view * 2.5,
        x * 0.0,  # baked 0.0, then a lifted -0.0 (the sign of zero products differs)
        x * -0.0,
        x * 1.0,  # baked 1.0, then a lifted 1.5 of the same class
        x * 1.5,
        i * 2,  # an int scalar, then a float one: another result dtype
        i * 2.5,
        i * True,
        leaky(x),  # one argument, then two: the slope passed, not its default
        leaky(x, 0.2),
        leaky(x),
        rsub(x, 2, 3),  # a Scalar's class: an int, then a float
        rsub(x, 2, 2.5),
        rsub(i, 2, 3),
        x + w,  # another spec in the second position: float64 promotes
        x + w.double(),
        x + w[0],  # broadcast
        x + w.t(),  # a view in the second position, then in the first, then both
        x.t() + w,
        x.t() + w.t(),
        x.t() * 1.5,
        x[1:] * 1.5,  # another view of the same spec: other strides
        x.t()[1:] * 1.5,
        torch.softmax(x, 0),  # statics: an int, a list, a bool
        torch.softmax(x, 1),
        x.sum(0),
        x.sum(1),
        x.sum([0, 1]),
        x.sum([1], keepdim=True),
        x.sum([1], keepdim=False),
        torch.nn.functional.softplus(x, 2.0),  # a lifted default threshold after the beta given
        torch.nn.functional.softplus(x, 2.0, 5.0),
        torch.nn.functional.softplus(x, 2.0),
    ]


def test_guarded_plans_replay_only_their_own_signature():
    """Each call runs once the guarded function of a plan of another signature: it must miss and
    record what eager computes (values, dtypes, strides, signs of zero), with the default dtype
    changed in between (a factor of the result dtype of integers times a float). The guarded
    functions run."""
    import sys

    torch.manual_seed(0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    ran = [0]

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "fast":
            ran[0] += 1

    for dtype in (torch.float32, torch.float64, torch.float32):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            ref = _guard_cases(x, w)
            sys.setprofile(profile)
            try:
                out = _guard_cases(x.to(DEV), w.to(DEV))
            finally:
                sys.setprofile(None)
        finally:
            torch.set_default_dtype(prev)
        for k, (r, o) in enumerate(zip(ref, out, strict=True)):
            assert o.dtype == r.dtype and o.shape == r.shape and o.stride() == r.stride(), (
                dtype,
                k,
            )
            o = o.cpu()
            torch.testing.assert_close(o, r, rtol=1e-6, atol=1e-6, msg=f"{dtype} case {k}")
            assert torch.equal(torch.signbit(o), torch.signbit(r)), (dtype, k)
    assert ran[0] > len(ref)  # the later rounds go through the guarded functions


def _view_cases(x: torch.Tensor) -> list[torch.Tensor]:
    """View calls that each differ from the one before in one argument or in the input's
    strides (same input spec): a guarded view plan that let one through would give the other's
    layout, offset or values."""
    y = x.t()  # the same spec as x, other strides
    return [
        x.select(0, 3),
        x.select(0, 2),  # another index: another storage offset
        x.select(1, 2),  # another dim
        y.select(0, 2),  # another input layout
        x.transpose(0, 1),
        y.transpose(0, 1),
        x[1:3],
        x[1:4],
        x[:, 1:3],
        y[1:3],
        x[::2],
        x.view(16),
        x.view(2, 8),
        x.view(torch.int32),
        x.unsqueeze(0),
        x.unsqueeze(-1),
        x.expand(2, 4, 4),
        x.expand(3, 4, 4),
        x.diagonal(),
        x.diagonal(1),
        y.diagonal(1),
    ]


def test_guarded_view_plans_replay_only_their_own_signature():
    """Each view call follows a call of another signature of the same op on an input of the same
    spec: it must still get eager's shape, strides, storage offset and values, also once its
    plans are guarded (the second round)."""
    torch.manual_seed(0)
    x = torch.randn(4, 4)
    ref = _view_cases(x)
    xd = x.to(DEV)
    for _ in range(2):
        out = _view_cases(xd)
        for k, (r, o) in enumerate(zip(ref, out, strict=True)):
            assert (o.shape, o.stride(), o.storage_offset(), o.dtype) == (
                r.shape,
                r.stride(),
                r.storage_offset(),
                r.dtype,
            ), k
            assert torch.equal(o.cpu(), r), k


def test_broadcast_shapes_agrees_with_torch():
    """meta.broadcast_shapes replaces torch.broadcast_shapes on hot paths (SDPA's mask check,
    the index-into-empty check): the same shapes, and an error for the same pairs."""
    import itertools

    from lazyxla._src.meta import broadcast_shapes

    shapes = [(), (1,), (3,), (0,), (2, 1), (1, 3), (2, 3), (4, 1, 3), (0, 1), (1, 0), (5, 0, 3)]
    for a, b in itertools.product(shapes, repeat=2):
        try:
            want = tuple(torch.broadcast_shapes(a, b))
        except RuntimeError:
            want = None
        try:
            got = broadcast_shapes(torch.Size(a), b)
        except RuntimeError:
            got = None
        assert got == want, (a, b)
    assert broadcast_shapes() == () and broadcast_shapes((2, 1), (1, 3), (4, 1, 1)) == (4, 2, 3)
