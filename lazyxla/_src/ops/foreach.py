"""`_foreach_*` ops and fused Adam/AdamW, derived from the elementwise rules."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from . import elementwise as ew
from .registry import is_const, register, to_opmath

aten = torch.ops.aten

_BINARY = {
    "add": ew.add,
    "sub": ew.sub,
    "mul": ew._multiply,
    "div": lambda x, y: ew._div(x, y),
    "maximum": lambda x, y: jnp.maximum(x, y),
    "minimum": lambda x, y: jnp.minimum(x, y),
    "pow": ew._power,  # (jnp.power of integers takes exponents below 64: 3 ** 200 was 3 ** 8)
    "clamp_min": lambda x, y: ew._clamp_below(x, y),  # Note [Clamp keeps x at a tie]
    "clamp_max": lambda x, y: ew._clamp_above(x, y),
}
# The single-tensor ops' lowerings where they exist, so a foreach op gives what the loop of single
# ops gives (signed zeros, complex branch cuts: Note [Complex functions by symmetry]).
_UNARY = {
    "sqrt": ew._UNARY[aten.sqrt.default],
    "neg": jnp.negative,
    "exp": ew._UNARY[aten.exp.default],
    "log": ew._UNARY[aten.log.default],
    "abs": jnp.abs,
    "sign": ew._sign,
    "reciprocal": jnp.reciprocal,
    "zero": jnp.zeros_like,
    "sigmoid": lambda x: 1 / (1 + jnp.exp(-x)),
    "tanh": ew._UNARY[aten.tanh.default],
    "rsqrt": ew._UNARY[aten.rsqrt.default],
    "floor": jnp.floor,
    "ceil": jnp.ceil,
    "round": jnp.round,
    "trunc": jnp.trunc,
    "sin": ew._UNARY[aten.sin.default],
    "cos": ew._UNARY[aten.cos.default],
}


def _binary(fn, kind):
    if kind == "List":
        return lambda xs, ys, alpha=1: [
            fn(x, y, alpha) if not is_const(alpha, 1) else fn(x, y) for x, y in zip(xs, ys)
        ]
    if kind == "ScalarList":
        return lambda xs, ss: [fn(x, s) for x, s in zip(xs, ss)]
    if kind == "Tensor":
        return lambda xs, t, alpha=1: [
            fn(x, t, alpha) if not is_const(alpha, 1) else fn(x, t) for x in xs
        ]
    return lambda xs, s: [fn(x, s) for x in xs]


for _name, _fn in _BINARY.items():
    _packet = getattr(aten, f"_foreach_{_name}")
    for _kind in ("List", "Scalar", "ScalarList", "Tensor"):
        if _kind in _packet.overloads():
            register(getattr(_packet, _kind), _binary(_fn, _kind))

for _name, _fn in _UNARY.items():
    _packet = getattr(aten, f"_foreach_{_name}", None)
    if _packet is not None and "default" in _packet.overloads():
        register(_packet.default, lambda xs, _fn=_fn: [_fn(x) for x in xs])


def _addc(op):
    def scalar(xs, t1, t2, value=1):
        return [op(x, a, b, value) for x, a, b in zip(xs, t1, t2)]

    def scalar_list(xs, t1, t2, scalars):
        return [op(x, a, b, s) for x, a, b, s in zip(xs, t1, t2, scalars)]

    def tensor(xs, t1, t2, scalars):
        return [op(x, a, b, scalars[i]) for i, (x, a, b) in enumerate(zip(xs, t1, t2))]

    return scalar, scalar_list, tensor


for _name, _op in (("addcmul", ew.addcmul), ("addcdiv", ew.addcdiv)):
    _s, _sl, _t = _addc(_op)
    _packet = getattr(aten, f"_foreach_{_name}")
    register(_packet.Scalar, _s)
    register(_packet.ScalarList, _sl)
    register(_packet.Tensor, _t)

register(
    aten._foreach_lerp.List,
    lambda xs, ends, ws: [ew.lerp(x, e, w) for x, e, w in zip(xs, ends, ws)],
)
register(
    aten._foreach_lerp.Scalar, lambda xs, ends, w: [ew.lerp(x, e, w) for x, e in zip(xs, ends)]
)
register(
    aten._foreach_copy.default,
    lambda xs, srcs, non_blocking=False: [
        jnp.broadcast_to(s.astype(x.dtype), x.shape) for x, s in zip(xs, srcs)
    ],
)


def _norm(xs, ord=2, dtype=None):
    from .reduction import vector_norm

    return [vector_norm(x, ord, None, False, dtype) for x in xs]


register(aten._foreach_norm.Scalar, _norm, static=("ord",))


# Note [Fused optimizers and GradScaler]
# A fused optimizer step given GradScaler's `grad_scale` and `found_inf` (`scaler.step(opt)` on an
# optimizer with `fused=True`) does, in eager's CPU kernels: nothing at all when `found_inf` is 1
# (parameters, every state buffer and the gradients keep their values; the optimizer then takes
# its step count back); otherwise it divides each gradient by the scale in the opmath type and
# stores the unscaled gradient back into `.grad`, before `maximize` negates it. The lowerings
# below return the gradients as an output for that, and select every output, not just the
# parameters, on `found_inf`. Scale and flag are GradScaler's shape (1,) tensors: read as 0-d, so
# a 0-d parameter keeps its shape.
def _unscaled(g, grad_scale):
    """`g` in its opmath type, divided by `grad_scale` if given (eager's unscaling)."""
    x = to_opmath(g)
    if grad_scale is None:
        return x
    return x / grad_scale.reshape(()).astype(x.dtype)


def _skipped(found_inf, new, old):
    """`new` (cast to `old`'s dtype), or `old` where eager's kernel returns early."""
    new = new.astype(old.dtype)
    return new if found_inf is None else jnp.where(found_inf.reshape(()) == 1, old, new)


def _adam(
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    max_exp_avg_sqs,
    state_steps,
    *,
    lr,
    beta1,
    beta2,
    weight_decay,
    eps,
    amsgrad,
    maximize,
    grad_scale=None,
    found_inf=None,
    decoupled,
):
    new_p, new_g, new_m, new_v, new_vmax = [], [], [], [], []
    for i, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        step = state_steps[i].astype(jnp.float32 if p.dtype != jnp.float64 else p.dtype)
        g = _unscaled(g, grad_scale)
        new_g.append(_skipped(found_inf, g, grads[i]))
        if maximize:
            g = -g
        if not is_const(weight_decay, 0):
            if decoupled:
                p = p * (1 - lr * weight_decay)
            else:
                g = g + weight_decay * p
        m = m + (g - m) * (1 - beta1)
        v = v * beta2 + (1 - beta2) * g * g
        bc1 = 1 - beta1**step
        bc2 = 1 - beta2**step
        step_size = lr / bc1
        if amsgrad:
            vmax = jnp.maximum(max_exp_avg_sqs[i], v)
            new_vmax.append(_skipped(found_inf, vmax, max_exp_avg_sqs[i]))
            denom = jnp.sqrt(vmax) / jnp.sqrt(bc2) + eps
        else:
            denom = jnp.sqrt(v) / jnp.sqrt(bc2) + eps
        new_p.append(_skipped(found_inf, p - step_size * m / denom, params[i]))
        new_m.append(_skipped(found_inf, m, exp_avgs[i]))
        new_v.append(_skipped(found_inf, v, exp_avg_sqs[i]))
    if not amsgrad:
        new_vmax = list(max_exp_avg_sqs)
    return new_p, new_g, new_m, new_v, new_vmax


def _register_fused(packet, rule, lift):
    """A fused optimizer's overloads: a float `lr`, and a tensor one where PyTorch has it."""
    for ov in ("default", "tensor_lr"):
        if ov in packet.overloads():
            register(getattr(packet, ov), rule, lift=lift)


_FLOATS = ("lr", "beta1", "beta2", "weight_decay", "eps")
for _packet, _decoupled in ((aten._fused_adam, False), (aten._fused_adamw, True)):
    _register_fused(_packet, lambda *a, _d=_decoupled, **k: _adam(*a, decoupled=_d, **k), _FLOATS)


def _sgd(params, grads, momentum_buffers, *, weight_decay, momentum, lr, dampening, nesterov,
         maximize, is_first_step, grad_scale=None, found_inf=None):  # fmt: skip
    new_p, new_g, new_b = [], [], []
    for i, (p, g) in enumerate(zip(params, grads)):
        g = _unscaled(g, grad_scale)
        new_g.append(_skipped(found_inf, g, grads[i]))
        if maximize:
            g = -g
        if not is_const(weight_decay, 0):
            g = g + weight_decay * p
        buf = momentum_buffers[i] if momentum_buffers else None
        if not is_const(momentum, 0):
            buf = g if is_first_step else buf * momentum + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        new_p.append(_skipped(found_inf, p - lr * g, p))
        new_b.append(_skipped(found_inf, buf, momentum_buffers[i]) if buf is not None else None)
    if not momentum_buffers:
        new_b = list(momentum_buffers)
    return new_p, new_g, new_b


_register_fused(aten._fused_sgd, _sgd, ("lr", "momentum", "weight_decay", "dampening"))


def _adagrad(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
             maximize, grad_scale=None, found_inf=None):  # fmt: skip
    """Eager's CPU kernel (its vectorized loop, which takes all but a tail of each tensor): the
    decayed rate `lr / (1 + (step - 1) * lr_decay)` in double from the float step count, then
    it and the other constants rounded to the parameter's dtype and used in its opmath type."""
    new_p, new_g, new_s = [], [], []
    for i, (p, g, ssum) in enumerate(zip(params, grads, state_sums)):
        x = _unscaled(g, grad_scale)
        new_g.append(_skipped(found_inf, x, g))
        ot = x.dtype

        def const(c):
            return jnp.asarray(c).astype(p.dtype).astype(ot)

        if maximize:
            x = -x
        if not is_const(weight_decay, 0):
            x = x + p.astype(ot) * const(weight_decay)
        total = ssum.astype(ot) + x * x
        step = state_steps[i].astype(jnp.float32).astype(jnp.float64)
        clr = lr / (1 + (step - 1) * lr_decay)
        std = jnp.sqrt(total) + const(eps)
        new_p.append(_skipped(found_inf, p.astype(ot) - const(clr) * x / std, p))
        new_s.append(_skipped(found_inf, total, ssum))
    return new_p, new_g, new_s, list(state_steps)


_register_fused(aten._fused_adagrad, _adagrad, ("lr", "lr_decay", "weight_decay", "eps"))


# Note [GradScaler's ops]
# `torch.amp.GradScaler` unscales the gradients with `_amp_foreach_non_finite_check_and_unscale_`
# and adjusts its scale with `_amp_update_scale_`. Through the CPU fallback each step synced the
# pending backward and copied every gradient to the host and back; lowered, they stay in the
# step's graph (GradScaler still reads `found_inf` before `optimizer.step`, as on any device). As
# eager's CPU kernels: a non-finite gradient element (before scaling) sets `found_inf` to 1, each
# element is multiplied by `inv_scale` in its opmath type; the scale is multiplied in double and
# stored as float, and does not grow past float32's range.
def _unscale(grads, found_inf, inv_scale):
    inv = inv_scale.reshape(())
    bad = jnp.zeros((), bool)
    out = []
    for g in grads:
        x = to_opmath(g)
        bad = bad | ~jnp.all(jnp.isfinite(x))
        out.append((x * inv.astype(x.dtype)).astype(g.dtype))
    return out, jnp.where(bad, jnp.ones_like(found_inf), found_inf)


def _update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    found = found_inf.reshape(()) != 0
    wide = scale.astype(jnp.float64)
    backed_off = (wide * backoff_factor).astype(scale.dtype)
    grown = (wide * growth_factor).astype(scale.dtype)
    successful = growth_tracker + 1
    grow = successful == growth_interval
    new_scale = jnp.where(found, backed_off, jnp.where(grow & jnp.isfinite(grown), grown, scale))
    tracker = jnp.where(found | grow, jnp.zeros_like(growth_tracker), successful)
    return new_scale, tracker


register(aten._amp_foreach_non_finite_check_and_unscale.default, _unscale, opmath=False)
register(aten._amp_update_scale.default, _update_scale, opmath=False)
