"""CTC loss on the device (Note [CTC loss]): values and gradients against eager, lengths that
change per batch without a new graph, eager's errors, and trace-once."""

import pytest
import torch
import torch.nn.functional as F

import lazyxla
import lazyxla.debug.metrics as met

dev = lazyxla.device()
T, N, C = 12, 5, 6
# a full sequence, shorter ones, an empty target, a one-frame input, and a target longer than
# its input (an infinite loss: NaN gradients, or zeros with zero_infinity)
INPUT_LENGTHS = [12, 10, 7, 1, 3]
TARGET_LENGTHS = [5, 3, 0, 1, 5]


def _targets(concatenated: bool) -> torch.Tensor:
    padded = torch.randint(1, C, (N, 5), generator=torch.Generator().manual_seed(1))
    padded[1, 1] = padded[1, 0]  # a repeated label: no skip between them
    if not concatenated:
        return padded
    return torch.cat([padded[i, :n] for i, n in enumerate(TARGET_LENGTHS)])


def _loss_and_grad(logits, targets, device, **kwargs):
    x = logits.clone().to(device).requires_grad_()
    loss = F.ctc_loss(
        x.log_softmax(-1), targets.to(device), INPUT_LENGTHS, TARGET_LENGTHS, **kwargs
    )
    (grad,) = torch.autograd.grad(loss.sum(), x)
    return loss.detach().cpu(), grad.cpu()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("concatenated", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_matches_eager(dtype, concatenated, reduction, zero_infinity):
    logits = torch.randn(T, N, C, dtype=dtype, generator=torch.Generator().manual_seed(0))
    targets = _targets(concatenated)
    kw = dict(reduction=reduction, zero_infinity=zero_infinity)
    met.clear_counters()
    loss, grad = _loss_and_grad(logits, targets, dev, **kw)
    ref_loss, ref_grad = _loss_and_grad(logits, targets, "cpu", **kw)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, ref_loss, equal_nan=True, **tol)
    torch.testing.assert_close(grad, ref_grad, equal_nan=True, **tol)
    if not zero_infinity:  # the impossible alignment's gradients are eager's NaNs
        assert grad[:3, 4].isnan().all() and ref_grad[:3, 4].isnan().all()
    assert met.counter_value("xla::ctc_loss") == 1
    assert met.counter_value("xla::ctc_loss_backward") == 1
    assert not [k for k in met.counter_names() if k.startswith("aten::_ctc")]  # no fallback


def test_internal_op_keeps_eager_outputs():
    """`aten::_ctc_loss` itself: eager's -0.0 for an empty input and target, +inf where no
    alignment exists, and log_alpha in eager's shape (2 * the longest target + 1 states)."""
    lp = torch.randn(4, 3, 5, dtype=torch.float64).log_softmax(-1).requires_grad_()
    lpd = lp.detach().to(dev).requires_grad_()
    targets = torch.tensor([[1, 2, 2, 0], [3, 3, 3, 0], [1, 0, 0, 0]])
    got = torch.ops.aten._ctc_loss(lpd, targets.to(dev), [4, 2, 0], [3, 3, 0], 0, False)
    ref = torch.ops.aten._ctc_loss(lp, targets, [4, 2, 0], [3, 3, 0], 0, False)
    assert got[1].shape == ref[1].shape == (3, 4, 7)
    nll = got[0].detach().cpu()
    torch.testing.assert_close(nll, ref[0].detach())
    assert nll[1] == float("inf") and nll[2] == 0 and nll[2].signbit()
    # its gradient for log_probs themselves, eager's formula (with the exp(log_prob) term that a
    # log_softmax before it cancels)
    grad = torch.autograd.grad(got[0][0] * 2 + got[0][2], lpd)[0].cpu()
    ref_grad = torch.autograd.grad(ref[0][0] * 2 + ref[0][2], lp)[0]
    torch.testing.assert_close(grad, ref_grad, equal_nan=True)  # (NaN * 0 where no alignment)


def test_batches_of_other_lengths_share_one_graph():
    """The lengths are graph inputs, not statics: with padded targets of one width, batches
    whose lengths (and longest target) differ run the same executable."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, C).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(input_lengths, target_lengths):
        x = torch.randn(T, 3, 4).to(dev)
        targets = torch.randint(1, C, (3, 6)).to(dev)
        loss = F.ctc_loss(model(x).log_softmax(-1), targets, input_lengths, target_lengths)
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()

    step([12, 10, 5], [6, 4, 2])
    before = met.counter_value("UncachedCompile")
    for lengths in (([12, 11, 3], [2, 1, 1]), ([9, 9, 9], [5, 5, 3]), ([7, 12, 12], [3, 6, 0])):
        step(*lengths)
    assert met.counter_value("UncachedCompile") == before


def test_each_lengths_list_is_uploaded_once():
    """Note [CTC uploads]: the forward and the backward kernel share one upload of each lengths
    list, and a later step with the same lists uploads neither (they were four uploads a step);
    the losses and gradients stay eager's."""
    from lazyxla._src import runtime

    runtime._DATA_CACHE.clear()  # (lists another test uploaded would be there already)
    torch.manual_seed(0)
    cpu = torch.nn.Linear(4, C).double()
    lazy = torch.nn.Linear(4, C).double().to(dev)
    lazy.load_state_dict(cpu.state_dict())

    def step(model, device, input_lengths, target_lengths, seed):
        g = torch.Generator().manual_seed(seed)
        x, targets = (
            torch.randn(T, 3, 4, generator=g).double(),
            torch.randint(1, C, (3, 6), generator=g),
        )
        before = met.counter_value("CreateDataHandles") or 0
        loss = F.ctc_loss(
            model(x.to(device)).log_softmax(-1), targets.to(device), input_lengths, target_lengths
        )
        loss.backward()
        uploads = (met.counter_value("CreateDataHandles") or 0) - before
        grad = model.weight.grad.cpu().clone()
        model.zero_grad()
        return loss.detach().cpu(), grad, uploads

    lengths = [([12, 10, 5], [6, 4, 2]), ([12, 10, 5], [6, 4, 2]), ([9, 11, 7], [5, 3, 1])]
    uploads = []
    for seed, (il, tl) in enumerate(lengths):
        ref, ref_grad, _ = step(cpu, "cpu", il, tl, seed)
        loss, grad, n = step(lazy, dev, il, tl, seed)
        torch.testing.assert_close(loss, ref)
        torch.testing.assert_close(grad, ref_grad)
        uploads.append(n)
    assert uploads[0] - uploads[1] == 2, uploads  # the two lists, once each
    assert uploads[2] == uploads[0], uploads  # new lists: uploaded again


def test_shared_lengths_survive_entering_and_leaving_spmd():
    """The shared lengths (Note [CTC uploads]) are device arrays, not tensors: entering SPMD
    moves every live tensor onto the mesh, and a kept one broke the next call after leaving it
    (one-device and 8-device arguments in one graph). Plain, SPMD, plain again: eager's values."""
    from lazyxla._src import sharding

    def run(device):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(T, 3, C, generator=g).double()
        x = x.to(device).requires_grad_()
        targets = torch.randint(1, C, (3, 6), generator=g)
        loss = F.ctc_loss(x.log_softmax(-1), targets.to(device), [12, 10, 5], [6, 4, 2])
        (grad,) = torch.autograd.grad(loss, x)
        return loss.detach().cpu(), grad.cpu()

    ref = run("cpu")
    for phase in ("plain", "spmd", "plain again"):
        if phase == "spmd":
            sharding.use_spmd()
        try:
            got = run(dev)
        finally:
            if phase == "spmd":
                sharding._leave_spmd_for_tests()
        torch.testing.assert_close(got[0], ref[0], msg=phase)
        torch.testing.assert_close(got[1], ref[1], msg=phase)


def test_bad_lengths_and_dtypes_raise_eagers_errors():
    lp = torch.randn(4, 2, 5).log_softmax(-1)
    targets = torch.tensor([[1, 2], [1, 1]])
    with pytest.raises(RuntimeError, match="Expected input_lengths to have value at most 4"):
        F.ctc_loss(lp.to(dev), targets.to(dev), [5, 4], [2, 2])
    with pytest.raises(NotImplementedError, match="not implemented for 'BFloat16'"):
        F.ctc_loss(lp.bfloat16().to(dev), targets.to(dev), [4, 4], [2, 2])


def test_trace_once_matches_eager():
    def loss_fn(x, targets, input_lengths, target_lengths):
        return F.ctc_loss(x.log_softmax(-1), targets, input_lengths, target_lengths)

    compiled = torch.compile(loss_fn, backend="lazyxla")
    g = torch.Generator().manual_seed(0)
    for lengths in (([12, 7], [3, 2]), ([9, 4], [1, 3])):
        x = torch.randn(T, 2, C, dtype=torch.float64, generator=g, requires_grad=True)
        targets = torch.randint(1, C, (2, 3), generator=g)
        ref = loss_fn(x, targets, *lengths)
        (ref_grad,) = torch.autograd.grad(ref, x)
        xd = x.detach().to(dev).requires_grad_()
        got = compiled(xd, targets.to(dev), *lengths)
        (grad,) = torch.autograd.grad(got, xd)
        torch.testing.assert_close(got.cpu(), ref)
        torch.testing.assert_close(grad.cpu(), ref_grad)
