"""Factories, RNG ops (seeding, statistics, no recompilation), dropout, and the CPU fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from util import DEV, assert_same, check, to_cpu, to_lazy

import lazyxla
from lazyxla._src import metrics


def test_factories():
    cases = [
        lambda d: torch.arange(7, device=d),
        lambda d: torch.arange(2, 9, 3, device=d),
        lambda d: torch.arange(0.0, 1.0, 0.25, device=d),
        lambda d: torch.arange(5, dtype=torch.float32, device=d),
        lambda d: torch.zeros(2, 3, device=d),
        lambda d: torch.zeros(2, 3, dtype=torch.int32, device=d),
        lambda d: torch.ones(4, dtype=torch.bfloat16, device=d),
        lambda d: torch.full((2, 2), 3.5, device=d),
        lambda d: torch.full((2, 2), 7, device=d),
        lambda d: torch.full((3,), True, device=d),
        lambda d: torch.eye(3, 4, device=d),
        lambda d: torch.linspace(-1, 1, 5, device=d),
        lambda d: torch.zeros_like(torch.empty(2, 3, device=d)),
        lambda d: torch.ones(2, 3, device=d).new_full((2,), -1.0),
        lambda d: torch.tensor([1.5, 2.5], device=d),
        lambda d: torch.empty(3, 2, device=d).fill_(2.0),
    ]
    for make in cases:
        expected = make("cpu")
        actual = make(DEV)
        assert actual.device == DEV
        assert_same(actual, expected, exact=True)


def test_arange_float_bounds_are_part_of_the_shape_key():
    """Regression: shape inference was cached by a float's type, not value (arange(6.) then
    arange(4.) gave 6 elements)."""
    for end in (6.0, 4.0, 2.5):
        assert_same(torch.arange(end, device=DEV), torch.arange(end), exact=True)
        assert_same(torch.arange(0.5, end, device=DEV), torch.arange(0.5, end), exact=True)


SHAPES_DTYPES = [((3, 4), torch.float32), ((1000,), torch.float32), ((2, 2, 2), torch.bfloat16)]


@pytest.mark.parametrize("shape,dtype", SHAPES_DTYPES)
def test_rand_randn(shape, dtype):
    u = torch.rand(shape, dtype=dtype, device=DEV)
    n = torch.randn(shape, dtype=dtype, device=DEV)
    assert u.shape == n.shape == torch.Size(shape)
    assert u.dtype == n.dtype == dtype
    uc, nc = to_cpu(u).float(), to_cpu(n).float()
    assert (uc >= 0).all() and (uc < 1).all()
    if uc.numel() >= 1000:
        assert abs(uc.mean().item() - 0.5) < 0.05
        assert abs(nc.mean().item()) < 0.1
        assert abs(nc.std().item() - 1) < 0.1


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_integer_arange_of_float_bounds_has_eagers_length(dtype):
    """Eager's integer arange takes its values from the truncated start and step, and its length
    from the truncated bounds for int64 but from the bounds as given for narrower dtypes
    (`arange(0., -8.000001, -4., dtype=uint8)`: 3 elements, 0 252 248). Read through a float op,
    so XLA computes it (an integer-only graph is answered on the host by eager itself)."""
    for start, end, step in (
        (0.0, -8.000001, -4.0),
        (0.5, 7.9, 2.5),
        (-3.2, 4.7, 1.9),
        (10, 0, -3),
    ):
        want = torch.arange(start, end, step, dtype=dtype).float() + 0.5
        got = torch.arange(start, end, step, dtype=dtype, device=DEV).float() + 0.5
        assert_same(got, want, exact=True)


def test_randint_and_ranges():
    r = torch.randint(3, 9, (2000,), device=DEV)
    assert r.dtype == torch.int64 and r.shape == (2000,)
    rc = to_cpu(r)
    assert rc.min().item() == 3 and rc.max().item() == 8
    r2 = torch.randint(5, (4, 5), dtype=torch.int32, device=DEV)
    assert r2.dtype == torch.int32
    assert ((to_cpu(r2) >= 0) & (to_cpu(r2) < 5)).all()
    u = torch.empty(2000, device=DEV).uniform_(-3, -1)
    uc = to_cpu(u)
    assert (uc >= -3).all() and (uc < -1).all()
    nrm = torch.empty(4000, device=DEV).normal_(2.0, 0.5)
    nc = to_cpu(nrm)
    assert abs(nc.mean().item() - 2.0) < 0.05 and abs(nc.std().item() - 0.5) < 0.05


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32]
    + [torch.int16, torch.int8, torch.uint8, torch.bool],
)
def test_random_without_bounds_covers_eager_full_range(dtype):
    """`x.random_()`: integers in eager's range for the dtype ([0, 2**digits] for a floating one,
    [0, max] for an integer one, {0, 1} for bool), spread over all of it (the largest of 20000
    draws is in its top tenth), lowered: no CPU fallback."""
    before = metrics.counter_value("aten::random_") or 0
    got = to_cpu(torch.empty(20000, dtype=dtype, device=DEV).random_())
    assert (metrics.counter_value("aten::random_") or 0) == before
    if dtype == torch.bool:
        hi = 1
    elif dtype.is_floating_point:
        hi = (
            2 ** {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11, torch.float64: 53}[dtype]
        )
    else:
        hi = torch.iinfo(dtype).max
    assert got.dtype == dtype
    assert got.min().item() >= 0 and got.max().item() <= hi
    if dtype.is_floating_point:
        assert torch.equal(got, got.round())
    assert got.max().item() >= 0.9 * hi
    assert got.unique().numel() > min(hi, 100)  # (bool: both values)


def test_randperm():
    p = torch.randperm(20, device=DEV)
    assert p.dtype == torch.int64
    assert sorted(to_cpu(p).tolist()) == list(range(20))


def test_manual_seed_reproduces():
    def draw():
        return [
            to_cpu(t)
            for t in (
                torch.rand(5, device=DEV),
                torch.randn(2, 3, device=DEV),
                torch.randint(0, 100, (6,), device=DEV),
                F.dropout(torch.ones(16, device=DEV), 0.5),
            )
        ]

    lazyxla.manual_seed(1234)
    a = draw()
    b = draw()
    lazyxla.manual_seed(1234)
    c = draw()
    lazyxla.manual_seed(99)
    d = draw()
    assert_same(c, a, exact=True)
    assert not torch.equal(a[0], b[0])
    assert not torch.equal(a[0], d[0])
    torch.manual_seed(7)  # torch.manual_seed seeds the device too
    e = draw()
    torch.manual_seed(7)
    assert_same(draw(), e, exact=True)


def test_dropout_statistics_and_grad():
    lazyxla.manual_seed(0)
    p = 0.3
    x = to_lazy(torch.ones(4000, requires_grad=True))
    y = F.dropout(x, p, training=True)
    y.sum().backward()
    yc, gc = to_cpu(y), to_cpu(x.grad)
    kept = yc != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.03
    scale = torch.tensor(1 / (1 - p))
    assert_same(yc[kept], scale.expand(int(kept.sum())))
    assert_same(gc, torch.where(kept, scale, torch.tensor(0.0)))  # the same mask in backward


def test_dropout_masks_differ_without_recompiling():
    lazyxla.manual_seed(0)
    w = to_lazy(torch.ones(64, 32, requires_grad=True))
    masks = []
    compiles = []
    for _ in range(4):
        y = F.dropout(w, 0.5, training=True)
        y.sum().backward()
        lazyxla.sync()
        masks.append(to_cpu(y) != 0)
        compiles.append(metrics.counter_value("UncachedCompile"))
        w.grad = None
    assert compiles[1] == compiles[2] == compiles[3], compiles
    assert not torch.equal(masks[0], masks[1])
    assert not torch.equal(masks[1], masks[2])


def test_nonzero_cpu_fallback():
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]])
    before = metrics.counter_value("aten::nonzero") or 0
    out = torch.nonzero(to_lazy(x))
    assert out.device == DEV
    assert_same(out, torch.nonzero(x), exact=True)
    assert metrics.counter_value("aten::nonzero") == before + 1


def test_linalg_det_lowered_with_grad():
    a = torch.tensor([[2.0, 1.0, 0.5], [0.3, 3.0, 1.0], [1.0, 0.2, 4.0]], requires_grad=True)
    before = {n: metrics.counter_value(n) for n in metrics.counter_names() if n[:6] == "aten::"}
    check(torch.linalg.det, a)
    after = {n: metrics.counter_value(n) for n in metrics.counter_names() if n[:6] == "aten::"}
    assert after == before  # no CPU fallback


def test_cpu_fallback_with_grad():
    """3-D grid_sample has no lowering: forward and backward run on the CPU, counted, and match."""
    x = torch.randn(1, 2, 3, 4, 5, generator=torch.Generator().manual_seed(0), requires_grad=True)
    grid = torch.rand(1, 2, 3, 3, 3, generator=torch.Generator().manual_seed(1)) * 2 - 1
    before = metrics.counter_value("aten::grid_sampler_3d") or 0
    check(lambda v, g: torch.nn.functional.grid_sample(v, g, align_corners=False), x, grid)
    assert (metrics.counter_value("aten::grid_sampler_3d") or 0) > before


def _no_fallback(fn):
    before = {n: metrics.counter_value(n) for n in metrics.counter_names() if n[:6] == "aten::"}
    out = to_cpu(fn())
    after = {n: metrics.counter_value(n) for n in metrics.counter_names() if n[:6] == "aten::"}
    assert after == before, f"CPU fallback ran: {set(after.items()) - set(before.items())}"
    return out


def test_distribution_samplers_match_their_laws():
    """In-place samplers lowered natively, checked against their distributions' laws (n=20000:
    the bounds are > 5 standard errors)."""
    n = 20000
    x = torch.empty(n, device=DEV)
    c = _no_fallback(lambda: x.cauchy_(median=1.0, sigma=2.0))
    assert abs(c.median().item() - 1.0) < 0.1  # the median of Cauchy(1, 2) is 1; its IQR is 2*2
    q = torch.quantile(c, torch.tensor([0.25, 0.75]))
    assert abs((q[1] - q[0]).item() - 4.0) < 0.3
    ln = _no_fallback(lambda: x.log_normal_(mean=0.5, std=0.25)).log()
    assert abs(ln.mean().item() - 0.5) < 0.02 and abs(ln.std().item() - 0.25) < 0.02
    g = _no_fallback(lambda: x.geometric_(0.25))
    assert g.min().item() >= 1 and torch.equal(g, g.round())
    assert abs(g.mean().item() - 4.0) < 0.15  # mean 1/p, variance (1-p)/p^2 = 12
    mean, std = torch.linspace(-3, 3, n), torch.full((n,), 0.5)
    z = _no_fallback(lambda: torch.normal(mean.to(DEV), std.to(DEV)))
    assert abs((z - mean).std().item() - 0.5) < 0.02 and abs((z - mean).mean().item()) < 0.02
    z = _no_fallback(lambda: torch.normal(2.0, std.to(DEV)))
    assert abs(z.mean().item() - 2.0) < 0.02
    # x.bernoulli_(p) with a tensor p (it ran on the CPU), into an integer tensor too
    p = torch.linspace(0, 1, n)
    for dtype in (torch.float32, torch.int64):
        t = torch.empty(n, dtype=dtype, device=DEV)
        b = _no_fallback(lambda: t.bernoulli_(p.to(DEV))).cpu()
        assert b.dtype == dtype and set(b.unique().tolist()) <= {0, 1}
        assert b[0] == 0 and b[-1] == 1  # p = 0 and p = 1
        assert abs(b.double().mean().item() - 0.5) < 0.02  # the mean of p
        low, high = b[: n // 2].double().mean().item(), b[n // 2 :].double().mean().item()
        assert abs(low - 0.25) < 0.02 and abs(high - 0.75) < 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_bernoulli_out_takes_the_shape_of_p_and_draws_in_its_own_dtype(dtype):
    # eager: out.resize_as_(p).bernoulli_(p), whatever out's dtype (the generic out= path
    # refused a float result into an integer out)
    n = 20000
    p = torch.linspace(0, 1, n).reshape(2, n // 2)
    eager = torch.bernoulli(p, out=torch.empty(3, dtype=dtype))
    out = torch.empty(3, dtype=dtype, device=DEV)
    b = _no_fallback(lambda: torch.bernoulli(p.to(DEV), out=out))
    assert torch.bernoulli(p.to(DEV), out=out) is out
    assert out.shape == eager.shape and out.dtype == eager.dtype == b.dtype
    assert set(b.unique().tolist()) <= {0, 1}
    assert b[0, 0] == 0 and b[-1, -1] == 1  # p = 0 and p = 1
    assert abs(b.double().mean().item() - 0.5) < 0.02


def test_multinomial_frequencies_and_without_replacement():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25]])
    draws = _no_fallback(lambda: torch.multinomial(probs.to(DEV), 20000, replacement=True))
    assert draws.shape == (2, 20000) and draws.dtype == torch.int64
    freq = torch.stack([torch.bincount(d, minlength=4) for d in draws]).float() / 20000
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)
    perm = _no_fallback(lambda: torch.multinomial(probs.to(DEV), 3))
    for row, p in zip(perm, probs):
        assert len(set(row.tolist())) == 3 and all(p[i] > 0 for i in row.tolist())
    firsts = _no_fallback(
        lambda: torch.multinomial(probs[:1].expand(4000, 4).contiguous().to(DEV), 1)
    ).flatten()
    # The first draw without replacement follows the weights.
    freq = torch.bincount(firsts, minlength=4).float() / 4000
    torch.testing.assert_close(freq, probs[0], atol=0.03, rtol=0)
