"""Reductions, scans, sort/topk and matrix products: forward and backward vs eager CPU."""

from __future__ import annotations

import pytest
import torch
from util import DEV, assert_same, check, to_lazy

import lazyxla.debug.metrics as met


def rnd(*shape, seed=0, grad=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g)).to(dtype).requires_grad_(grad)


def distinct(*shape, seed=0, grad=True):
    """Values without ties (max/min/sort/topk gradients are only defined without ties)."""
    g = torch.Generator().manual_seed(seed)
    n = torch.Size(shape).numel()
    return (torch.randperm(n, generator=g).float() / n - 0.5).reshape(shape).requires_grad_(grad)


REDUCTIONS = {
    "sum": lambda x: x.sum(),
    "sum_dim": lambda x: x.sum(1),
    "sum_dims_keep": lambda x: x.sum((0, 2), keepdim=True),
    "sum_neg_dim": lambda x: x.sum(-1),
    "mean": lambda x: x.mean(),
    "mean_dim": lambda x: x.mean((1, 2)),
    "mean_keep": lambda x: x.mean(-1, keepdim=True),
    "var": lambda x: x.var(),
    "var_dim": lambda x: x.var(1),
    "var_unbiased_false": lambda x: x.var(-1, unbiased=False, keepdim=True),
    "var_correction0": lambda x: torch.var(x, dim=(0, 1), correction=0),
    "std": lambda x: x.std(),
    "std_dim": lambda x: x.std(2, keepdim=True),
    "var_mean": lambda x: torch.var_mean(x, dim=1),
    "logsumexp": lambda x: x.logsumexp(-1),
    "logsumexp_dims": lambda x: x.logsumexp((0, 2), keepdim=True),
    "cumsum": lambda x: x.cumsum(1),
    "cumsum_neg": lambda x: x.cumsum(-1),
    "cumprod": lambda x: x.cumprod(2),
    "prod_dim": lambda x: x.prod(1),
    "norm": lambda x: x.norm(),
    "norm_dim": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "norm_1": lambda x: torch.linalg.vector_norm(x, ord=1, dim=1),
    "norm_inf": lambda x: torch.linalg.vector_norm(x, ord=float("inf"), dim=1),
    "amax": lambda x: x.amax(1),
    "amin_dims": lambda x: x.amin((0, 2)),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reduction(name):
    x = distinct(3, 4, 5) if name.startswith(("am", "norm_inf")) else rnd(3, 4, 5)
    check(REDUCTIONS[name], x)


TIE_FREE = {
    "max": lambda x: x.max(),
    "min": lambda x: x.min(),
    "max_dim": lambda x: x.max(1),
    "max_dim_keep": lambda x: x.max(-1, keepdim=True),
    "min_dim": lambda x: x.min(0),
    "sort": lambda x: x.sort(-1),
    "sort_desc": lambda x: x.sort(1, descending=True),
    "sort_dim0": lambda x: torch.sort(x, 0),
    "topk": lambda x: x.topk(3),
    "topk_dim1_smallest": lambda x: x.topk(2, dim=1, largest=False),
    "topk_dim0": lambda x: torch.topk(x, 2, dim=0),
    "argsort": lambda x: (x * 1).argsort(-1),
    "kthvalue_via_sort": lambda x: x.sort(2).values[..., 2],
}


@pytest.mark.parametrize("name", list(TIE_FREE))
def test_order_statistics(name):
    check(TIE_FREE[name], distinct(3, 4, 5), grad=name != "argsort")


def test_argmax_argmin():
    x = distinct(3, 4, 5, grad=False)
    check(
        lambda v: (
            v.argmax(),
            v.argmin(),
            v.argmax(1),
            v.argmin(-1, keepdim=True),
            v.argmax(0, keepdim=True),
        ),
        x,
        grad=False,
        exact=True,
    )


def test_argmax_ties_pick_first():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    check(lambda v: (v.argmax(1), v.argmin(1), v.max(1), v.argmax()), x, grad=False, exact=True)


def test_sort_stable_with_ties():
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0, 1.0, 3.0]])
    check(lambda v: (v.sort(stable=True), v.sort(descending=True, stable=True)), x, grad=False)


def test_int_and_bool_reductions():
    x = torch.arange(24).reshape(2, 3, 4) - 7
    b = x > 0

    def f(v, m):
        return (
            v.sum(),
            v.sum(1),
            v.sum(dtype=torch.float32),
            v.cumsum(2),
            v.prod(1),
            v.max(),
            v.amax(0),
            m.sum(),
            m.sum(-1),
            m.any(1),
            m.all(),
            v.float().mean(1),
        )

    out_l, out_c = check(f, x, b, grad=False, exact=True)
    assert [o.dtype for o in out_l] == [o.dtype for o in out_c]


def test_mean_of_int_requires_float_dtype():
    x = torch.arange(6).reshape(2, 3)
    check(lambda v: v.mean(dtype=torch.float32), x, grad=False)


MATMUL = {
    "mm": ((3, 4), (4, 5), torch.mm),
    "bmm": ((2, 3, 4), (2, 4, 5), torch.bmm),
    "matmul_2d": ((3, 4), (4, 5), torch.matmul),
    "matmul_batched_broadcast": ((2, 1, 3, 4), (3, 4, 2), torch.matmul),
    "matmul_vec": ((3, 4), (4,), torch.matmul),
    "matmul_vec_mat": ((4,), (2, 4, 3), torch.matmul),
    "matmul_1d_1d": ((4,), (4,), torch.matmul),
    "matmul_3d_2d": ((2, 3, 4), (4, 5), torch.matmul),
    "einsum_bij_bjk": ((2, 3, 4), (2, 4, 5), lambda a, b: torch.einsum("bij,bjk->bik", a, b)),
    "einsum_attn": (
        (2, 3, 4, 5),
        (2, 3, 6, 5),
        lambda a, b: torch.einsum("bhqd,bhkd->bhqk", a, b),
    ),
    "einsum_outer": ((3,), (4,), lambda a, b: torch.einsum("i,j->ij", a, b)),
    "einsum_trace_like": ((3, 4), (3, 4), lambda a, b: torch.einsum("ij,ij->", a, b)),
    "outer": ((3,), (4,), torch.outer),
    "dot": ((5,), (5,), torch.dot),
    "mv": ((3, 5), (5,), torch.mv),
}


@pytest.mark.parametrize("name", list(MATMUL))
def test_matmul(name):
    sa, sb, fn = MATMUL[name]
    check(fn, rnd(*sa, seed=1), rnd(*sb, seed=2))


def test_addmm_and_linear():
    bias, a, b = rnd(5, seed=0), rnd(3, 4, seed=1), rnd(4, 5, seed=2)
    check(lambda c, x, y: torch.addmm(c, x, y), bias, a, b)
    check(lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2.0), bias, a, b)
    check(lambda c, x, y: torch.baddbmm(c, x[None], y[None], beta=2.0, alpha=-1.0), bias, a, b)
    w, x = rnd(5, 4, seed=3), rnd(2, 3, 4, seed=4)
    check(lambda x_, w_, b_: torch.nn.functional.linear(x_, w_, b_), x, w, bias)
    check(lambda x_, w_: torch.nn.functional.linear(x_, w_), x, w)


def test_bf16_matmul():
    a = rnd(4, 8, seed=1, dtype=torch.bfloat16)
    b = rnd(8, 3, seed=2, dtype=torch.bfloat16)
    check(torch.mm, a, b)


def test_histogram_edges_weights_density():
    """Lowered natively: a value on an inner edge opens that bin, the last edge closes the last
    bin, values outside `range` are dropped, a constant input gets eager's +-0.5 range."""
    x = torch.tensor([0.0, 1.0, 1.0, 2.5, 4.0, 9.0, -1.0])
    w = torch.arange(7.0)
    cases = [
        ((x, 4), {}),
        ((x, 4), {"range": (0.0, 4.0), "weight": w}),
        ((x, 3), {"density": True}),
        ((torch.full((5,), 2.0), 3), {}),
        ((x, torch.tensor([-1.0, 0.5, 1.0, 4.0])), {"weight": w, "density": True}),
    ]
    met.clear_all()
    for args, kwargs in cases:
        out = torch.histogram(*to_lazy(args), **to_lazy(kwargs))
        assert_same(tuple(out), tuple(torch.histogram(*args, **kwargs)))
    assert not [n for n in met.counter_names() if n.startswith("aten::")]  # no CPU fallback


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["var", "std", "var_mean", "std_mean", "var_dim", "std_dim"])
def test_variance_no_farther_from_float64_than_eager(name, dtype):
    """Eager CPU accumulates var/std in float64 in every float dtype. lazyxla's float32 two-pass
    lost the digits of a spread small against the mean (1000 + 0.01 * randn: 1.6e-4 relative
    error, eager's 3e-8; [3e19, 3e19 +- 1e13]: 13 %, eager's 0.8 %), and std of 1e20s was inf,
    its variance overflowing float32 (Note [Variance in float64]). Eager's full reduction
    centres on a float32 mean, so the bar is eager's distance from float64 plus one ulp."""
    g = torch.Generator().manual_seed(0)
    fns = {
        "var": lambda v: v.var(),
        "std": lambda v: v.std(),
        "var_mean": lambda v: torch.var_mean(v, 0),
        "std_mean": lambda v: torch.std_mean(v, 0, correction=0),
        "var_dim": lambda v: v.var(1),
        "std_dim": lambda v: v.std(1),
    }
    big = 1e20 if dtype != torch.float16 else 1e4
    inputs = [
        (1000 + 0.01 * torch.randn(256, 8, generator=g)).to(dtype),
        torch.tensor([[3e19, 3e19 + 1e13, 3e19 - 1e13, 3e19]]).to(dtype),
        torch.tensor([[3.0, 3.0001, 2.9999, 3.0], [big, -big, 3 * big, 0.0]]).to(dtype),
    ]
    for x in inputs:
        outs = [fns[name](v) for v in (x, to_lazy(x), x.double())]
        eager, lazy, ref = ([o] if isinstance(o, torch.Tensor) else list(o) for o in outs)
        for e, lz, r in zip(eager, lazy, ref):
            lz = lz.cpu()
            assert lz.dtype == e.dtype
            r = r.to(e.dtype).double()  # the float64 result, as the dtype holds it
            e, lz = e.double(), lz.double()
            assert torch.equal(torch.isfinite(lz), torch.isfinite(e)), (lz, e)
            fin = torch.isfinite(r)
            bar = (e - r).abs() + torch.finfo(dtype).eps * r.abs()
            assert ((lz - r).abs()[fin] <= bar[fin]).all(), (lz, e, r)


def test_float32_scans_accumulate_in_float64_like_eager():
    """Eager CPU scans float32 in a float64 accumulator (`acc_type<float, false>`). Uniform
    [0, 1) float32 values are multiples of 2**-24, so the float64 prefix sums of 1e5 of them are
    exact and both round them once: bit-equal (the float32 scan was 1.4 ulps off). A float32
    cumprod of 1e5 factors near 1 drifted 6000 ulps from float64, eager's 74."""
    x = torch.rand(100_000, generator=torch.Generator().manual_seed(0))
    assert_same(to_lazy(x).cumsum(0), x.cumsum(0), exact=True)
    f = 1 + (x - 0.5) * 1e-4
    ref = f.double().cumprod(0)
    ulp = ref.abs().max().item() * torch.finfo(torch.float32).eps
    eager_err = (f.cumprod(0).double() - ref).abs().max().item() / ulp
    lazy_err = (to_lazy(f).cumprod(0).cpu().double() - ref).abs().max().item() / ulp
    assert lazy_err <= 2 * eager_err + 2, (lazy_err, eager_err)
    # bf16 input, float32 scan: converted first, then scanned in float64
    b = x[:20_000].bfloat16()
    assert_same(
        to_lazy(b).cumsum(0, dtype=torch.float32), b.cumsum(0, dtype=torch.float32), exact=True
    )


@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_cross_rounds_like_eager(dtype, dim):
    """Eager's bf16/fp16 cross product rounds each product and the difference to the dtype; one
    rounding of a float32 result differed from it in a third of the components."""
    g = torch.Generator().manual_seed(0)
    shape = [40, 30, 20]
    shape[dim] = 3
    a = torch.randn(shape, generator=g).to(dtype)
    b = torch.randn(shape, generator=g).to(dtype)
    out = torch.linalg.cross(to_lazy(a), to_lazy(b), dim=dim)
    assert_same(out, torch.linalg.cross(a, b, dim=dim), exact=True)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128, torch.float32], ids=str)
def test_vdot_conjugates_its_first_vector(dtype):
    """vdot was lowered as dot: a complex vdot gave dot(a, b), without conjugating `a` (found by
    a sweep of OpInfo in complex64, which the OpInfo test does not run)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(7, dtype=dtype, generator=g), torch.randn(7, dtype=dtype, generator=g)
    for f in (
        torch.vdot,
        lambda x, y: torch.vdot(x.conj(), y),
        lambda x, y: torch.vdot(x, y.conj()),
    ):
        torch.testing.assert_close(f(a.to(DEV), b.to(DEV)).cpu(), f(a, b))


LINALG_CHECKED = {
    "inv": lambda a: torch.linalg.inv(a),
    "cholesky": lambda a: torch.linalg.cholesky(a @ a.mT + torch.eye(4, device=a.device)),
    "solve": lambda a: torch.linalg.solve(a, a.sum(-1, keepdim=True)),
    "lu_factor": lambda a: torch.linalg.lu_factor(a)[0],
    "inv_ex": lambda a: torch.linalg.inv_ex(a, check_errors=True)[0],
}


@pytest.mark.parametrize("name", sorted(LINALG_CHECKED))
def test_linalg_error_checks_do_not_run_the_graph(name):
    """Note [Linalg info checks]: `_linalg_check_errors` read a lowering's zero `info`, which ran
    the pending graph at every `inv` (one compile and execution in the middle of the step)."""
    a = torch.randn(4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    la = to_lazy(a)
    executions = met.counter_value("ExecuteComputation") or 0
    out = LINALG_CHECKED[name](la * 1.0)  # on a pending input
    assert (met.counter_value("ExecuteComputation") or 0) == executions
    assert_same(out, LINALG_CHECKED[name](a))


@pytest.mark.parametrize(
    "call",
    [
        lambda x: torch.std(x),
        lambda x: torch.var(x, 0),
        lambda x: torch.var_mean(x, 1, correction=2),
        lambda x: torch.std_mean(x, unbiased=True),
    ],
)
def test_variance_does_not_warn_where_eager_does_not(call):
    """The first std/var call of a signature warned "degrees of freedom is <= 0": lazyxla's
    dtype probe ran it on one-element tensors, and a warning C++ raises inside a kernel reaches
    the user's call past any filter. (A shape no other test uses: the probe runs once per
    signature.)"""
    import warnings

    x = torch.randn(7, 11, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call(x)
        call(x.to(DEV))
    assert not [w for w in caught if "degrees of freedom" in str(w.message)]


@pytest.mark.parametrize(
    "call",
    [
        lambda t: torch.std(t(torch.randn(5, 3))),
        lambda t: torch.std(t(torch.randn(1))),
        lambda t: torch.var_mean(t(torch.randn(3, 1)), 1),
        lambda t: torch.var(t(torch.randn(1)), unbiased=False),
        lambda t: torch.std(t(torch.randn(3, 2)), 0, correction=3),
        lambda t: torch.std_mean(t(torch.randn(2, 1, 4)), (1,)),
        lambda t: t(torch.randn(1)).var(),
    ],
)
def test_variance_warns_on_every_call_where_eager_warns(call):
    """A variance over no more elements than its correction: eager's kernel warns on every call
    (the meta kernels, and so lazyxla's recording, never did), at the caller's line."""
    import warnings

    seen = []
    for to in (lambda x: x, lambda x: x.to(DEV)):
        for _ in range(2):  # the second call takes the recording plan
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                call(to)
            seen.append([w.filename for w in caught if "degrees of freedom" in str(w.message)])
    assert seen[2:] == seen[:2]


GROUPED = {  # (mat_a, mat_b, offs): Note [Grouped matmul]'s cases
    "2d_3d": ((12, 16), (4, 16, 8), [3, 7, 7, 12]),
    "2d_2d": ((16, 12), (12, 8), [3, 7, 7, 12]),
    "3d_2d": ((4, 16, 16), (16, 12), [3, 7, 7, 12]),
    "3d_3d": ((4, 10, 16), (4, 16, 8), None),
}


@pytest.mark.parametrize("name", list(GROUPED))
def test_grouped_mm_matches_eager(name):
    """torch._grouped_mm (F.grouped_mm, transformers' experts) in each layout: values and both
    gradients as eager's (an empty group included), lowered: no CPU fallback, and new offsets
    (another routing of tokens to experts) run the same graph."""
    sa, sb, offs = GROUPED[name]
    a, b = rnd(*sa, seed=1), rnd(*sb, seed=2)
    offs = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    fn = lambda a, b, o: torch._grouped_mm(a, b, offs=o)  # noqa: E731
    before = [k for k in met.counter_names() if k.startswith("aten::")]
    check(fn, a, b, offs, rtol=1e-5, atol=1e-5)
    assert [k for k in met.counter_names() if k.startswith("aten::")] == before
    if offs is not None:
        compiles = met.counter_value("UncachedCompile")
        other = torch.tensor([5, 5, 9, 12], dtype=torch.int32)
        assert_same(
            fn(to_lazy(a), to_lazy(b), to_lazy(other)), fn(a, b, other), rtol=1e-5, atol=1e-5
        )
        assert met.counter_value("UncachedCompile") == compiles


def test_grouped_mm_bf16_and_rows_past_the_last_group():
    """bf16 accumulates in float32 and rounds once, as eager's CPU kernel (within one bf16 ulp of
    the float64 product: summation order is the CPU's); rows past the last offset are 0 (eager
    leaves them uninitialized: not compared)."""
    a, b = rnd(16, 16, seed=3, grad=False), rnd(4, 16, 8, seed=4, grad=False)
    a, b = a.bfloat16(), b.bfloat16()
    offs = torch.tensor([3, 7, 7, 12], dtype=torch.int32)
    got = torch._grouped_mm(to_lazy(a), to_lazy(b), offs=to_lazy(offs)).cpu()
    assert got.dtype == torch.bfloat16
    ref = torch.cat(
        [a[s:e].double() @ b[j].double() for j, (s, e) in enumerate(zip([0, 3, 7, 7], offs))]
    )
    torch.testing.assert_close(got[:12].double(), ref, rtol=2**-8, atol=2**-8)
    assert not got[12:].any()


def test_grouped_mm_bias_is_refused_as_eager():
    a, b = rnd(12, 16, grad=False), rnd(4, 16, 8, grad=False)
    offs, bias = torch.tensor([3, 7, 7, 12], dtype=torch.int32), torch.zeros(4, 8)
    for args in ((a, b, offs, bias), tuple(to_lazy(t) for t in (a, b, offs, bias))):
        with pytest.raises(RuntimeError, match="Bias not supported yet"):
            torch._grouped_mm(args[0], args[1], offs=args[2], bias=args[3])
