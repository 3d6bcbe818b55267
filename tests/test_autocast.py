"""torch.autocast on the lazyxla device ("jax") follows CUDA's policy; compare with CPU autocast."""

import copy

import pytest
import torch

import lazyxla

dev = lazyxla.device()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_matches_cpu_autocast(dtype):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    model = copy.deepcopy(ref).to(dev)
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=dtype):
        y_ref = ref(x)
    with torch.autocast("jax", dtype=dtype):
        y = model(x.to(dev))
        assert y.dtype == dtype
        probs = torch.softmax(y, -1)
        assert probs.dtype == torch.float32  # softmax runs in float32 under autocast
    y_ref.float().pow(2).mean().backward()
    y.float().pow(2).mean().backward()
    tol = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y.cpu().float(), y_ref.float(), **tol)
    assert model[0].weight.grad.dtype == torch.float32  # master weights stay float32
    torch.testing.assert_close(model[0].weight.grad.cpu(), ref[0].weight.grad, **tol)


def test_no_autocast_outside_the_region():
    y = torch.nn.functional.linear(torch.randn(2, 3).to(dev), torch.randn(4, 3).to(dev))
    assert y.dtype == torch.float32


def _grad_scaler_run(device, make_opt=lambda ps: torch.optim.SGD(ps, lr=0.1)):
    """Five GradScaler steps, the third an overflow; returns the parameters, the scales, and per
    step each parameter's `.grad` after `scaler.step` and the optimizer's state tensors."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model.to(device)
    opt = make_opt(model.parameters())
    scaler = torch.amp.GradScaler(
        device=torch.device(device).type, init_scale=8.0, growth_interval=2
    )
    x = torch.randn(5, 4)
    scales, seen = [], []
    for i in range(5):
        opt.zero_grad()
        loss = model(x.to(device)).pow(2).sum()
        if i == 2:
            loss = loss * float("inf")  # an overflow: the step is skipped, the scale backs off
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        seen.append(
            [p.grad.cpu().clone() for p in model.parameters()]  # (on the CPU, .cpu() aliases)
            + [v.cpu().clone() for st in opt.state.values() for _, v in sorted(st.items())]
        )
    return [p.detach().cpu() for p in model.parameters()], scales, seen


def test_torch_grad_scaler_runs_in_the_graph():
    """torch.amp.GradScaler's own ops (Note [GradScaler's ops]) are lowered: eager's parameters
    and scales, and no CPU fallback (each step used to copy every gradient to the host)."""
    import lazyxla.debug.metrics as met

    want_params, want_scales, _ = _grad_scaler_run("cpu")
    met.clear_all()
    got_params, got_scales, _ = _grad_scaler_run(dev)
    assert got_scales == want_scales == [8.0, 16.0, 8.0, 8.0, 16.0]
    for g, w in zip(got_params, want_params):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    assert not [k for k in met.counter_names() if k.startswith("aten::_amp")]


FUSED = {
    "Adam": lambda ps: torch.optim.Adam(ps, lr=0.1, weight_decay=0.1, fused=True),
    "AdamW_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=0.1, amsgrad=True, fused=True),
    "SGD_momentum": lambda ps: torch.optim.SGD(
        ps, lr=0.1, momentum=0.9, weight_decay=0.01, fused=True
    ),
    "Adagrad": lambda ps: torch.optim.Adagrad(
        ps, lr=0.1, lr_decay=0.01, weight_decay=0.1, fused=True
    ),
}


@pytest.mark.parametrize("name", list(FUSED))
def test_fused_optimizer_under_grad_scaler_as_eager(name):
    """Note [Fused optimizers and GradScaler]: `scaler.step` hands a fused optimizer the scale
    and the overflow flag. Each step leaves eager's unscaled `.grad`, and the overflow step
    leaves every state buffer (momentum, amsgrad's max) as it was; no CPU fallback."""
    import lazyxla.debug.metrics as met

    want_params, want_scales, want_seen = _grad_scaler_run("cpu", FUSED[name])
    met.clear_all()
    got_params, got_scales, got_seen = _grad_scaler_run(dev, FUSED[name])
    assert got_scales == want_scales
    for step, (got, want) in enumerate(zip(got_seen, want_seen)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(
                g, w, rtol=1e-5, atol=1e-6, equal_nan=True, msg=lambda m: f"step {step}: {m}"
            )
    for g, w in zip(got_params, want_params):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    assert not met.cpu_fallback_ops()  # (GradScaler's own `found_inf.item()` is a read)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_unscale_and_update_scale_as_eager(dtype):
    """The two ops on their own, exactly: non-finite elements set found_inf, unscaling in opmath,
    a scale grown in double and kept below float32's overflow, and backed off."""
    g = [torch.tensor([1.5, -2.0, 3.0], dtype=dtype), torch.tensor([[0.25, 7.0]], dtype=dtype)]
    bad = [g[0].clone(), torch.tensor([[0.25, float("nan")]], dtype=dtype)]
    for grads in (g, bad):
        for inv in (0.125, 1.0 / 3.0):
            res = []
            for d in ("cpu", dev):
                xs = [t.clone().to(d) for t in grads]
                found = torch.zeros((), device=d)
                inv_scale = torch.full((), inv, device=d)
                torch._amp_foreach_non_finite_check_and_unscale_(xs, found, inv_scale)
                res.append([t.cpu() for t in xs] + [found.cpu()])
            for a, b in zip(*res):
                torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    cases = [(3.0e38, 0, 0.0, 2.0), (1.7, 0, 0.0, 1.1), (1.7, 3, 0.0, 1.1), (1.7, 2, 1.0, 1.1)]
    for scale, tracker, found_inf, growth in cases:
        res = []
        for d in ("cpu", dev):
            s = torch.full((), scale, device=d)
            t = torch.full((), tracker, dtype=torch.int32, device=d)
            f = torch.full((), found_inf, device=d)
            torch._amp_update_scale_(s, t, f, growth, 0.3, 4)
            res.append((s.cpu(), t.cpu()))
        assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1]), (
            scale,
            tracker,
            found_inf,
            res,
        )
