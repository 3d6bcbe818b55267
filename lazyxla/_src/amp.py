"""torch_xla.amp: autocast on the lazyxla device, a gradient scaler, and sync-free optimizers.

# Note [Sync-free mixed precision]
A gradient scaler must skip the optimizer step when a gradient overflowed. `torch.amp.GradScaler`
decides that on the host (`found_inf.item()`), which on a lazy device cuts the training step
into two graphs and waits for the first. The sync-free optimizers (`syncfree.SGD/Adam/AdamW`) take
the overflow flag as a tensor, `step(found_inf=t)`, and apply the update under
`torch.where(found_inf != 0, old, new)`: the skip is decided on the device and the whole step
stays one graph. `GradScaler` passes the flag that way to any optimizer whose `step` accepts
`found_inf`, and unscales, checks and updates its scale with plain tensor ops (no CPU fallback,
no host read).
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from typing import Any

import torch

from .tensor import DEVICE_TYPE


class autocast(torch.amp.autocast_mode.autocast):
    """`torch.autocast` on the lazyxla device: matmul-like ops run in `dtype` (default bfloat16),
    precision-sensitive ones in float32 (the policy of `torch.autocast('jax')`).

    Example:
        >>> with torch_xla.amp.autocast(torch_xla.device()):
        ...     loss = loss_fn(model(x), y)
    """

    def __init__(
        self,
        device: Any = None,
        enabled: bool = True,
        dtype: torch.dtype | None = None,
        cache_enabled: bool = True,
    ) -> None:
        kind = torch.device(device).type if isinstance(device, torch.device) else str(device)
        kind = kind.split(":")[0]
        if device is not None and kind not in (DEVICE_TYPE, "xla"):
            raise ValueError(
                f"torch_xla.amp.autocast is for the XLA device, got {device!r}; use "
                f"torch.autocast({kind!r}) for other devices"
            )
        super().__init__(
            DEVICE_TYPE,
            enabled=enabled,
            dtype=dtype or torch.bfloat16,
            cache_enabled=cache_enabled,
        )


def _accepts_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    try:
        return "found_inf" in inspect.signature(optimizer.step).parameters
    except (TypeError, ValueError):
        return False


class GradScaler(torch.amp.GradScaler):
    """`torch.amp.GradScaler` for the lazyxla device, without host syncs (Note [Sync-free mixed
    precision]): with a `syncfree` optimizer the whole step is one graph."""

    def __init__(
        self,
        device: str = DEVICE_TYPE,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        device = str(device).split(":")[0]
        super().__init__(
            DEVICE_TYPE if device == "xla" else device,
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool,
    ) -> dict[torch.device, torch.Tensor]:
        per_device: dict[torch.device, torch.Tensor] = {}
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is None:
                        continue
                    if not allow_fp16 and g.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    dev = g.device
                    if dev not in per_device:
                        per_device[dev] = found_inf.to(dev, copy=True)
                    bad = (~torch.isfinite(g)).any().to(found_inf.dtype)
                    per_device[dev] = torch.maximum(per_device[dev], bad.reshape(found_inf.shape))
                    g.mul_(
                        inv_scale.to(dev).to(g.dtype)
                        if g.dtype != inv_scale.dtype
                        else inv_scale.to(dev)
                    )
        return per_device

    def _maybe_opt_step(
        self,
        optimizer: torch.optim.Optimizer,
        optimizer_state: dict[str, Any],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if _accepts_found_inf(optimizer) and "found_inf" not in kwargs:
            flags = list(optimizer_state["found_inf_per_device"].values())
            found = flags[0]
            for f in flags[1:]:
                found = found + f.to(found.device)
            return optimizer.step(*args, found_inf=found.reshape(()), **kwargs)
        return super()._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        if not self._enabled or new_scale is not None:
            super().update(new_scale)
            return
        scale, tracker = self._check_scale_growth_tracker("update")
        flags = [
            f.to(scale.device)
            for state in self._per_optimizer_states.values()
            for f in state["found_inf_per_device"].values()
        ]
        if not flags:
            raise AssertionError("No inf checks were recorded prior to update.")
        found = flags[0]
        for f in flags[1:]:
            found = found + f
        with torch.no_grad():
            bad = found > 0
            grown = tracker + 1
            grow = grown >= self._growth_interval
            scale.copy_(
                torch.where(
                    bad,
                    scale * self._backoff_factor,
                    torch.where(grow, scale * self._growth_factor, scale),
                )
            )
            tracker.copy_(torch.where(bad | grow, torch.zeros_like(tracker), grown))
        self._per_optimizer_states = defaultdict(torch.amp.grad_scaler._refresh_per_optimizer_state)


# --- sync-free optimizers ----------------------------------------------------------------------


def _check_found_inf(found_inf: torch.Tensor) -> None:
    if found_inf.dim() != 0:
        raise ValueError("The found_inf tensor has to be scalar type")


def _keep_if(skip: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> None:
    old.copy_(torch.where(skip, old, new))


class SGD(torch.optim.SGD):
    """`torch.optim.SGD` whose `step(found_inf=t)` skips the update on the device when `t != 0`
    (see Note [Sync-free mixed precision]); `step()` without it is torch's SGD."""

    @torch.no_grad()
    def step(self, closure: Any = None, found_inf: torch.Tensor | None = None) -> Any:
        if found_inf is None:
            return super().step(closure=closure)
        _check_found_inf(found_inf)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        skip = found_inf != 0
        for group in self.param_groups:
            wd, momentum, dampening = group["weight_decay"], group["momentum"], group["dampening"]
            nesterov, maximize, lr = group["nesterov"], group["maximize"], group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "step" not in state:
                    state["step"] = torch.zeros_like(found_inf)
                step = state["step"]
                d_p = -p.grad if maximize else p.grad
                if wd != 0:
                    d_p = d_p + wd * p
                if momentum != 0:
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = torch.clone(d_p).detach()
                    first = step == 0
                    new_buf = torch.where(first, d_p, momentum * buf + (1 - dampening) * d_p)
                    _keep_if(skip, buf, new_buf)
                    d_p = d_p + momentum * buf if nesterov else buf
                _keep_if(skip, p, p - lr * d_p)
                _keep_if(skip, step, step + 1)
        return loss


class _AdamBase:
    _decoupled = False

    @torch.no_grad()
    def step(self, closure: Any = None, found_inf: torch.Tensor | None = None) -> Any:
        if found_inf is None:
            return super().step(closure=closure)  # type: ignore[misc]
        _check_found_inf(found_inf)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        skip = found_inf != 0
        for group in self.param_groups:  # type: ignore[attr-defined]
            beta1, beta2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            amsgrad, maximize = group["amsgrad"], group.get("maximize", False)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]  # type: ignore[attr-defined]
                if "step" not in state or not isinstance(state["step"], torch.Tensor):
                    state["step"] = torch.zeros_like(found_inf, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                    state["max_exp_avg_sq"] = torch.zeros_like(p)
                step = state["step"]
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                grad = -p.grad if maximize else p.grad
                param = p
                if wd != 0:
                    if self._decoupled:
                        param = p * (1 - lr * wd)
                    else:
                        grad = grad + wd * p
                t = step + 1
                new_avg = beta1 * exp_avg + (1 - beta1) * grad
                new_sq = beta2 * exp_avg_sq + (1 - beta2) * grad * grad
                tp = t.to(p.dtype)  # bias corrections at the parameter's precision
                bc1 = 1 - beta1**tp
                bc2 = 1 - beta2**tp
                if amsgrad:
                    new_max = torch.maximum(state["max_exp_avg_sq"], new_sq)
                    _keep_if(skip, state["max_exp_avg_sq"], new_max)
                    denom = new_max.sqrt() / bc2.sqrt() + eps
                else:
                    denom = new_sq.sqrt() / bc2.sqrt() + eps
                _keep_if(skip, p, param - (lr / bc1) * new_avg / denom)
                _keep_if(skip, exp_avg, new_avg)
                _keep_if(skip, exp_avg_sq, new_sq)
                _keep_if(skip, step, t)
        return loss


class Adam(_AdamBase, torch.optim.Adam):
    """`torch.optim.Adam` with a sync-free `step(found_inf=t)` (Note [Sync-free mixed
    precision])."""


class AdamW(_AdamBase, torch.optim.AdamW):
    """`torch.optim.AdamW` with a sync-free `step(found_inf=t)` (Note [Sync-free mixed
    precision])."""

    _decoupled = True
