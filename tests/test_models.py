"""Acceptance: training on lazyxla matches eager CPU step for step, and compiles only to warm up.

Each case trains the same model from identical initial weights on identical data, once in eager on
the CPU and once on `lazyxla.device()` with one `lazyxla.sync()` per step, and compares the float32
losses at every step and the parameters at the end. After the second step (the first step has no
optimizer state yet, so its graph differs) every step must hit the graph cache.

Note [Float64 reference]: both float32 runs are measured against a third, in float64 on the CPU,
and lazyxla must be no farther from it than eager is, plus a few float32 ulps. Eager's own float32
rounding depends on the CPU (MKL and oneDNN pick their kernels, and so their summation orders, by
ISA: AVX2 or AVX-512), and so does XLA's; a tolerance on lazyxla - eager tuned on one machine
therefore fails on another where both are equally accurate, and passes a lowering that is
consistently less accurate than eager as long as it fits. The distance to float64 measures what
matters (accuracy) on any machine, where the loss is smooth: a ReLU whose input is within rounding
of 0 is on in one float32 run and off in the other, whichever rounds better. On an AVX2 EPYC, the
MLP's third ReLU met an input of 6.8e-8 at step 4 (fused Adam): lazyxla's gradient of that layer
was 28% off float64's at one element, and the loss 26 ulps off from then on, with every value
computed to float32's accuracy. So the MLP case trains with GELU between its layers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla._src.ops.registry import LOWERINGS
from lazyxla.debug import metrics
from lazyxla.models import MLP, Decoder, DecoderConfig

STEPS = 20
# Note [Float64 reference]. On an AVX-512 EPYC, lazyxla's excess over eager's distance is at most
# 1.2 ulps of the loss and 2.3 ulps of a parameter tensor's mean magnitude (decoder, Adam).
LOSS_ULPS = 8  # per step: |loss - loss64| <= eager's + LOSS_ULPS ulps of loss64
PARAM_ULPS = 32  # per tensor: mean |p - p64| <= eager's + PARAM_ULPS ulps of mean |p64|
F32_EPS = torch.finfo(torch.float32).eps

TINY_DECODER = DecoderConfig(
    vocab_size=32, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16, ffn_dim=64
)

# Adam's update is g / (|g| + eps) early on: where |g| is near eps, a 1-ulp difference in a gradient
# (XLA and eager CPU sum matmuls in different orders) moves the parameter by ~lr / 100. eps=1e-6
# keeps such elements rare; the parameters are compared by their mean distance to float64 (Note
# [Float64 reference]), which the few left move by an ulp or two, where a lowering that rounds
# worse than eager moves it everywhere. (The MLP has no ReLU to flip: Note [Float64 reference].)
OPTIMIZERS = {
    "SGD": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4}),
    "Adam": (torch.optim.Adam, {"lr": 1e-3, "weight_decay": 1e-4, "eps": 1e-6}),
    "AdamW": (torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 1e-2, "eps": 1e-6}),
}
IMPLS = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def _uncached() -> int:
    return metrics.counter_value("UncachedCompile") or 0


def _fallback_counts() -> dict[str, int]:
    """`{op: count}` of the ops that ran through the CPU fallback so far."""
    return {op: metrics.counter_value(f"aten::{op}") or 0 for op in metrics.cpu_fallback_ops()}


def _mlp_case(steps: int) -> tuple[Callable[[], torch.nn.Module], list, Callable]:
    width, batch = 512, 64  # the benchmark's MLP: 4 x Linear(512, 512)
    gen = torch.Generator().manual_seed(1234)
    batches = [
        (torch.randn(batch, width, generator=gen), torch.randn(batch, width, generator=gen))
        for _ in range(steps)
    ]

    def loss_fn(model, x, y):
        return F.mse_loss(model(x), y)

    # (GELU, not the benchmark's ReLU: Note [Float64 reference])
    return lambda: MLP(width=width, depth=4, activation=F.gelu), batches, loss_fn


def _decoder_case(steps: int) -> tuple[Callable[[], torch.nn.Module], list, Callable]:
    cfg = TINY_DECODER
    gen = torch.Generator().manual_seed(4321)
    batches = []
    for _ in range(steps):
        x = torch.randint(0, cfg.vocab_size, (4, cfg.max_seq_len), generator=gen)
        batches.append((x, torch.roll(x, -1, dims=1)))

    def loss_fn(model, x, y):
        return model.loss(x, y)

    return lambda: Decoder(cfg), batches, loss_fn


CASES = {"mlp": _mlp_case, "decoder": _decoder_case}

aten = torch.ops.aten
# A known lowering gap, expected to fail only while the lowering is missing: once it lands the
# condition turns false and the case is enforced again.
_NO_FUSED_SGD = aten._fused_sgd_.default not in LOWERINGS


def _train(model, opt, batches, loss_fn, device, on_step=None):
    losses = []
    for i, (x, y) in enumerate(batches):
        opt.zero_grad()
        loss = loss_fn(model, x.to(device), y.to(device))
        loss.backward()
        opt.step()
        if device.type != "cpu":
            lazyxla.sync()
        losses.append(loss.detach())
        if on_step is not None:
            on_step(i)
    return [float(v.item()) for v in losses]


def _float64(batches: list) -> list:
    return [tuple(t.double() if t.is_floating_point() else t for t in b) for b in batches]


def _assert_no_farther_than_eager(eager, lazy, ref, ulps: int, what: str) -> None:
    """Note [Float64 reference]: `lazy` is no farther from `ref` than `eager`, plus `ulps` float32
    ulps of `ref`'s magnitude (for tensors: mean distance, mean magnitude)."""
    if isinstance(ref, torch.Tensor):
        ref = ref.detach()
        de = (eager.detach().double() - ref).abs().mean().item()
        dl = (lazy.detach().cpu().double() - ref).abs().mean().item()
        scale = ref.abs().mean().item()
        values = ""
    else:
        de, dl, scale = abs(eager - ref), abs(lazy - ref), abs(ref)
        values = f" (lazyxla {lazy}, eager {eager}, float64 {ref})"
    allowed = de + ulps * F32_EPS * scale
    assert dl <= allowed, (
        f"{what}: lazyxla is {dl:.3g} from float64, eager {de:.3g}, allowed {allowed:.3g}{values}"
    )


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("case", list(CASES))
def test_training_matches_eager(case: str, opt_name: str, impl: str) -> None:
    """20 steps on lazyxla are as close to float64 as eager's (losses at each step, parameters at
    the end; Note [Float64 reference])."""
    make_model, batches, loss_fn = CASES[case](STEPS)
    opt_cls, opt_kwargs = OPTIMIZERS[opt_name]
    opt_kwargs = {**opt_kwargs, **IMPLS[impl]}

    torch.manual_seed(0)
    cpu_model = make_model()
    dev_model = copy.deepcopy(cpu_model).to(lazyxla.device())
    ref_model = copy.deepcopy(cpu_model).double()
    # Every implementation computes the same update; the reference uses the single-tensor one.
    ref_kwargs = {k: v for k, v in opt_kwargs.items() if k not in ("foreach", "fused")}
    ref_losses = _train(
        ref_model,
        opt_cls(ref_model.parameters(), foreach=False, **ref_kwargs),
        _float64(batches),
        loss_fn,
        torch.device("cpu"),
    )

    cpu_losses = _train(
        cpu_model,
        opt_cls(cpu_model.parameters(), **opt_kwargs),
        batches,
        loss_fn,
        torch.device("cpu"),
    )

    fallbacks_before = _fallback_counts()
    compiles: list[int] = []
    dev_losses = _train(
        dev_model,
        opt_cls(dev_model.parameters(), **opt_kwargs),
        batches,
        loss_fn,
        lazyxla.device(),
        on_step=lambda i: compiles.append(_uncached()),
    )

    for i, (a, b, r) in enumerate(zip(cpu_losses, dev_losses, ref_losses, strict=True)):
        _assert_no_farther_than_eager(a, b, r, LOSS_ULPS, f"step {i} loss")
    for (name, p_cpu), p_dev, p_ref in zip(
        cpu_model.named_parameters(), dev_model.parameters(), ref_model.parameters(), strict=True
    ):
        _assert_no_farther_than_eager(p_cpu, p_dev, p_ref, PARAM_ULPS, name)
    assert compiles[-1] == compiles[1], f"UncachedCompile grew after step 2: {compiles}"
    after = _fallback_counts()
    fallbacks = [op for op, n in after.items() if n > fallbacks_before.get(op, 0)]
    if fallbacks == ["_fused_sgd_"] and _NO_FUSED_SGD:
        pytest.xfail("lazyxla: aten::_fused_sgd_ has no lowering; it ran on the CPU fallback")
    assert not fallbacks, f"ops ran on the CPU fallback: {fallbacks}"


def test_python_floats_compile_once() -> None:
    """50 different Python floats reuse one executable; a new shape compiles exactly once more."""
    dev = lazyxla.device()
    x = torch.randn(37, 5).to(dev)
    lazyxla.sync()
    before = _uncached()
    for i in range(50):
        f = 0.5 + i * 0.137
        y = x * f + f
        lazyxla.sync()
        expected = x.cpu() * f + f
        torch.testing.assert_close(y.cpu(), expected)
    assert _uncached() - before == 1

    x2 = torch.randn(38, 5).to(dev)
    lazyxla.sync()
    before = _uncached()
    for i in range(10):
        f = -1.0 - i * 0.25
        y = x2 * f + f
        lazyxla.sync()
    torch.testing.assert_close(y.cpu(), x2.cpu() * f + f)
    assert _uncached() - before == 1
