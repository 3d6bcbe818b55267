"""CTC loss on the device: `F.ctc_loss` / `nn.CTCLoss` without a CPU fallback.

# Note [CTC loss]
`F.ctc_loss` reaches `aten::_ctc_loss(log_probs, targets, input_lengths, target_lengths, blank,
zero_infinity)` with the lengths as Python lists (its composite reads tensor lengths to the host
first), and autograd's derivative is `aten::_ctc_loss_backward`. Both had no lowering: each call
synced its inputs and ran on the CPU. Their kernels here record two lazyxla ops whose lengths are
small int64 device tensors, not statics, so a speech model's batches of varying lengths share
one graph (only the shapes and the longest target, which sizes `log_alpha`, are in its key).

- Forward: eager's alpha recursion (`LossCTC.cpp`), vectorized over the batch and scanned over
  time in log space, with eager's formula for each step: `log(exp(la - m) + exp(lb - m) +
  exp(lc - m)) + m + log_prob`, `m` the largest of the three (0 if all are -inf). A sequence's
  alphas stop changing past its input length; its loss reads the last two states.
- Backward: eager's gradient, `(exp(log_prob) - exp(lcab + nll - log_prob)) * grad` for t below
  the input length and 0 past it (lcab: alpha + beta summed per label). `-exp(lcab + nll -
  log_prob)` is the derivative of the loss itself, which JAX's reverse mode of the forward gives
  (a posterior, in [0, 1]: no log-space beta pass is needed); the `exp(log_prob)` term is
  eager's own (its formula is the gradient through a log_softmax, added here as eager adds it).
  An infinite loss gives eager's NaN gradients, or zeros with `zero_infinity`.
- Values are eager's to rounding (XLA's exp/log are not glibc's); validation (lengths against
  the shapes, the dtypes) is eager's own, by running its meta kernel. Other dtypes than float32
  and float64 keep the CPU fallback (eager's CPU kernel refuses them too).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import torch
from jax import lax

from . import fallback, runtime
from .dispatch import register_kernel
from .ir import TensorSpec, device_data
from .ops.registry import register
from .sharding import is_spmd
from .tensor import new_tensor

aten = torch.ops.aten
_NEG = -jnp.inf


@torch.library.custom_op("lazyxla::ctc_loss", mutates_args=())
def ctc_loss(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(neg_log_likelihood, log_alpha over 2 * width + 1 states), the lengths as tensors."""
    nll, alpha = aten._ctc_loss(
        log_probs, targets, input_lengths.tolist(), target_lengths.tolist(), blank, False
    )
    full = alpha.new_full((*alpha.shape[:2], 2 * width + 1), float("-inf"))
    full[..., : alpha.shape[2]] = alpha
    return nll, full


@ctc_loss.register_fake
def _(log_probs, targets, input_lengths, target_lengths, blank, width):
    n = log_probs.shape[1]
    return log_probs.new_empty((n,)), log_probs.new_empty((n, log_probs.shape[0], 2 * width + 1))


@torch.library.custom_op("lazyxla::ctc_loss_backward", mutates_args=())
def ctc_loss_backward(
    grad: torch.Tensor,
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    neg_log_likelihood: torch.Tensor,
    blank: int,
    zero_infinity: bool,
    width: int,
) -> torch.Tensor:
    """The gradient for `log_probs`, the lengths as tensors. Off the device: eager's."""
    il, tl = input_lengths.tolist(), target_lengths.tolist()
    _, alpha = aten._ctc_loss(log_probs, targets, il, tl, blank, zero_infinity)
    return aten._ctc_loss_backward(
        grad, log_probs, targets, il, tl, neg_log_likelihood, alpha, blank, zero_infinity
    )


@ctc_loss_backward.register_fake
def _(grad, log_probs, *_args):
    return torch.empty_like(log_probs)


def _forward(lp, targets, il, tl, blank, max_tl):
    """(nll (N,), log_alpha (N, T, 2 * max_tl + 1)) of log_probs `lp` (T, N, C)."""
    t_len, n, _ = lp.shape
    width = 2 * max_tl + 1
    s = jnp.arange(width)
    pos = jnp.maximum(s - 1, 0) // 2  # the target index of an odd state
    if targets.ndim == 2:
        tgt = jnp.take(targets, jnp.minimum(pos, targets.shape[1] - 1), axis=1)
    else:  # concatenated: sequence b starts after the targets of those before it
        start = jnp.cumsum(tl) - tl
        flat = jnp.clip(start[:, None] + pos[None, :], 0, max(targets.shape[0] - 1, 0))
        tgt = targets[flat] if targets.shape[0] else jnp.zeros((n, width), targets.dtype)
    label = jnp.where(s % 2 == 0, blank, tgt).astype(jnp.int32)  # (N, width)
    before = jnp.concatenate([jnp.full((n, 2), -1, jnp.int32), label[:, :-2]], axis=1)
    skip = (s >= 2) & (label != blank) & (label != before)
    emit = jnp.take_along_axis(lp, jnp.broadcast_to(label[None], (t_len, n, width)), axis=2)
    neg = jnp.asarray(_NEG, lp.dtype)
    first = jnp.where(s == 0, emit[0], jnp.where((s == 1) & (tl[:, None] > 0), emit[0], neg))

    def step(alpha, xs):
        t, e = xs
        la = alpha
        lb = jnp.concatenate([jnp.full((n, 1), neg), alpha[:, :-1]], axis=1)
        lc = jnp.where(skip, jnp.concatenate([jnp.full((n, 2), neg), alpha[:, :-2]], 1), neg)
        new = _logsumexp3(la, lb, lc) + e
        new = jnp.where((t < il)[:, None], new, alpha)  # past the input length: unchanged
        return new, new

    last, rest = lax.scan(step, first, (jnp.arange(1, t_len), emit[1:]))
    log_alpha = jnp.concatenate([first[None], rest], axis=0)  # (T, N, width)
    end = 2 * tl
    l1 = jnp.take_along_axis(last, end[:, None], axis=1)[:, 0]
    l2 = jnp.take_along_axis(last, jnp.maximum(end - 1, 0)[:, None], axis=1)[:, 0]
    l2 = jnp.where(tl > 0, l2, neg)
    ll = _logsumexp3(l1, l2, neg)
    ll = jnp.where(il == 0, jnp.where(tl == 0, jnp.zeros((), lp.dtype), neg), ll)
    return -ll, jnp.swapaxes(log_alpha, 0, 1)


def _logsumexp3(a, b, c):
    """log(exp(a - m) + exp(b - m) + exp(c - m)) + m, m the largest (0 if all are -inf), as
    eager's CPU kernel; -inf, with zero gradients, where all three are -inf."""
    m = lax.stop_gradient(jnp.maximum(jnp.maximum(a, b), c))
    m = jnp.where(jnp.isneginf(m), jnp.zeros((), m.dtype), m)
    total = jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)
    some = total > 0
    return jnp.where(some, jnp.log(jnp.where(some, total, 1)), _NEG) + m


def backward_rule(grad, lp, targets, il, tl, nll, blank, zero_infinity, width):
    _, vjp = jax.vjp(lambda x: _forward(x, targets, il, tl, blank, width)[0], lp)
    (d_loss,) = vjp(grad)
    inside = (jnp.arange(lp.shape[0])[:, None] < il[None, :])[..., None]  # (T, N, 1)
    out = jnp.where(inside, jnp.exp(lp) * grad[None, :, None], 0) + d_loss
    infinite = jnp.isposinf(nll)[None, :, None]
    if zero_infinity:
        return jnp.where(infinite, jnp.zeros((), lp.dtype), out)
    return jnp.where(infinite & inside, jnp.asarray(jnp.nan, lp.dtype), out)


register(torch.ops.lazyxla.ctc_loss.default, _forward, opmath=False)
register(torch.ops.lazyxla.ctc_loss_backward.default, backward_rule, opmath=False)


# Note [CTC uploads]
# The lengths arrive as Python lists, and the forward and the backward kernel each need them on
# the device: four uploads every step (the targets are moved once, by `F.ctc_loss` itself). Each
# list of lengths is instead uploaded once per value and shared through the device data cache
# (Note [Device data cache] in runtime.py: never written, never donated); a speech model's
# batches repeat a few lists, so most steps upload none. In SPMD mode a tensor waits on the host
# for its sharding (Note [SPMD virtual device]): uploaded as before.
def _lengths(values: Any, device: torch.device) -> torch.Tensor:
    host = torch.tensor([int(v) for v in values], dtype=torch.int64)
    if is_spmd():
        return host.to(device)
    spec = TensorSpec(tuple(host.shape), torch.int64)
    arr = runtime.shared_upload(host, copy=False)
    return new_tensor((device_data(arr, spec), 0), spec)


def _on_device(log_probs: torch.Tensor) -> bool:
    return log_probs.dtype in (torch.float32, torch.float64)


def ctc_loss_kernel(
    log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False
):
    """`aten::_ctc_loss` for lazy tensors (Note [CTC loss])."""
    if not _on_device(log_probs):
        return fallback.cpu_fallback(
            aten._ctc_loss.default,
            log_probs, targets, input_lengths, target_lengths, blank, zero_infinity,
        )  # fmt: skip
    meta = aten._ctc_loss.default(  # eager's checks and log_alpha's shape
        log_probs.to("meta"), targets.to("meta"), input_lengths, target_lengths, blank, False
    )
    dev = log_probs.device
    states = meta[1].shape[2]
    nll, alpha = torch.ops.lazyxla.ctc_loss(
        log_probs, targets.to(dev), _lengths(input_lengths, dev), _lengths(target_lengths, dev),
        blank, _width(targets, states),
    )  # fmt: skip
    if alpha.shape[2] != states:  # eager's shape (a copy: a read of it is rarely in the graph)
        alpha = alpha[..., :states].contiguous()
    return nll, alpha


def _width(targets: torch.Tensor, states: int) -> int:
    """The targets per sequence a graph is built for: a padded (N, S) target tensor's S, so that
    batches whose longest target differs share a graph; concatenated targets, the longest."""
    return targets.shape[1] if targets.dim() == 2 else (states - 1) // 2


def ctc_loss_backward_kernel(
    grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank,
    zero_infinity=False,
):  # fmt: skip
    """`aten::_ctc_loss_backward` for lazy tensors (Note [CTC loss])."""
    if not _on_device(log_probs):
        return fallback.cpu_fallback(
            aten._ctc_loss_backward.default,
            grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank,
            zero_infinity,
        )  # fmt: skip
    dev = log_probs.device
    return torch.ops.lazyxla.ctc_loss_backward(
        grad, log_probs, targets.to(dev), _lengths(input_lengths, dev),
        _lengths(target_lengths, dev), nll, blank, zero_infinity,
        _width(targets, log_alpha.shape[2]),
    )  # fmt: skip


register_kernel(aten._ctc_loss.default, ctc_loss_kernel)
register_kernel(aten._ctc_loss_backward.default, ctc_loss_backward_kernel)
