"""ZeRO-1 (`torch_xla.distributed.zero_redundancy_optimizer`): optimizer state sharded over the
data-parallel processes.

Each process keeps the full parameters (for forward and backward) but the optimizer sees only
its shard of each parameter (flattened, padded to a multiple of the world size). A step
reduce-scatters every gradient (the mean over processes, each keeping its shard), clips by the
global gradient norm (an all-reduce of the shards' squared norms), steps the wrapped optimizer on
the shards, and all-gathers the updated shards into the full parameters. All of it is recorded
into the step's graph (Note [Cross-process collectives]); XLA combines the collectives, so
torch_xla's bucket sizes have nothing left to tune and are accepted as no-ops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer

from . import collectives, runtime_api
from . import xla_model as xm


class ZeroRedundancyOptimizer(Optimizer):
    """Wraps `optimizer_class` so that its state is sharded across the processes.

    Args:
        params: the parameters (or parameter groups), as for any optimizer.
        optimizer_class: the optimizer run on the shards (e.g. `torch.optim.AdamW`).
        optimizer_dtype: dtype of the shards the optimizer updates (default float32: bf16
            parameters get float32 master shards).
        grad_clipping: clip the gradients by their global norm before the step (torch_xla's
            default: on, with `max_norm` 1.0).
        max_norm: the clipping norm.
        save_master_weights: include the float master shards in `state_dict()`.
        higher_cc_precision: reduce-scatter gradients in float32.
        pin_layout, bucket_cap_mb_all_gather, bucket_cap_mb_reduce_scatter: accepted for
            torch_xla's signature; XLA chooses layouts and combines the collectives here.
        lazy_init: shard on `init_zero()` instead of now.
        **defaults: the wrapped optimizer's hyper-parameters (lr, betas, ...).
    """

    def __init__(
        self,
        params: Iterable[Any],
        optimizer_class: type[Optimizer],
        optimizer_dtype: torch.dtype | None = None,
        grad_clipping: bool = True,
        max_norm: float | None = None,
        pin_layout: bool = True,
        sharding_groups: Any = None,
        grad_norm_groups: Any = None,
        lazy_init: bool = False,
        bucket_cap_mb_all_gather: int = 0,
        bucket_cap_mb_reduce_scatter: int = 0,
        use_grad_acc_hook: bool = False,
        save_master_weights: bool = False,
        higher_cc_precision: bool = False,
        **defaults: Any,
    ) -> None:
        del pin_layout, bucket_cap_mb_all_gather, bucket_cap_mb_reduce_scatter
        for name, value in (
            ("sharding_groups", sharding_groups),
            ("grad_norm_groups", grad_norm_groups),
            ("use_grad_acc_hook", use_grad_acc_hook),
        ):
            if value:
                raise NotImplementedError(
                    f"ZeroRedundancyOptimizer({name}=...) is not supported by lazyxla: it shards "
                    "over all processes; leave it unset"
                )
        super().__init__(params, defaults)
        self.optimizer_class = optimizer_class
        self.optimizer_dtype = optimizer_dtype or torch.float32
        self.grad_clipping = grad_clipping
        self.max_norm = 1.0 if max_norm is None else float(max_norm)
        self.save_master_weights = save_master_weights
        self.higher_cc_precision = higher_cc_precision
        self.world_size = runtime_api.world_size()
        self.rank = runtime_api.global_ordinal()
        self.grad_norm: torch.Tensor | None = None
        self.inited = False
        if not lazy_init:
            self.init_zero()

    # --- sharding ------------------------------------------------------------------------------

    def init_zero(self) -> None:
        """Make the shards and the wrapped optimizer over them."""
        self.pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []
        shard_groups = []
        for group in self.param_groups:
            shards = []
            for p in group["params"]:
                with torch.no_grad():
                    mine = collectives.flat_shard(p.detach(), self.world_size, self.rank)
                    shard = torch.nn.Parameter(mine.to(self.optimizer_dtype).clone())
                self.pairs.append((p, shard))
                shards.append(shard)
            shard_groups.append(
                {**{k: v for k, v in group.items() if k != "params"}, "params": shards}
            )
        # Each shard is a rank-dependent slice: materialise it now, on this process alone, so
        # the first step's graph is the same on every process (Note [Cross-process collectives]).
        lazy = [s for _, s in self.pairs if s.device.type == "jax"]
        if lazy:
            xm.unlazy(lazy)
        self.base_optimizer = self.optimizer_class(shard_groups, **self.defaults)
        self.inited = True

    def _sync_param_groups(self) -> None:
        """Hyper-parameters changed on this optimizer (an lr schedule) reach the wrapped one."""
        for mine, base in zip(self.param_groups, self.base_optimizer.param_groups):
            for k, v in mine.items():
                if k != "params":
                    base[k] = v

    # --- the step -------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        if not self.inited:
            self.init_zero()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_param_groups()
        scale = 1.0 / self.world_size
        for p, shard in self.pairs:
            if p.grad is None:
                shard.grad = None
                continue
            g = collectives.padded_flat(p.grad, self.world_size)
            if self.higher_cc_precision:
                g = g.float()
            reduced = xm.reduce_scatter("sum", g, scale, 0, self.world_size)
            shard.grad = reduced.to(shard.dtype)
        if self.grad_clipping:
            self._clip_grad_norm()
        self.base_optimizer.step(**kwargs)
        for p, shard in self.pairs:
            full = xm.all_gather(shard.detach().to(p.dtype), dim=0)
            p.copy_(full[: p.numel()].reshape(p.shape))
        return loss

    def _clip_grad_norm(self) -> None:
        """`clip_grad_norm_(max_norm)` over the global gradient, from the shards."""
        grads = [s.grad for _, s in self.pairs if s.grad is not None]
        if not grads:
            return
        local = torch.stack([g.float().square().sum() for g in grads]).sum()
        total = xm.all_reduce("sum", local).sqrt()
        self.grad_norm = total
        coef = torch.clamp(self.max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        if self.inited:
            self.base_optimizer.zero_grad(set_to_none=set_to_none)

    # --- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        out = {
            "base_state_dict": self.base_optimizer.state_dict(),
            "shape_info": self.get_shape_info(),
        }
        if self.save_master_weights:
            out["sharded_master_weights"] = {i: s.detach() for i, (_, s) in enumerate(self.pairs)}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self.inited:
            self.init_zero()
        self.base_optimizer.load_state_dict(state_dict["base_state_dict"])
        master = state_dict.get("sharded_master_weights")
        if master is not None:
            with torch.no_grad():
                for i, (_, s) in enumerate(self.pairs):
                    s.copy_(master[i])
        self.param_groups = [
            {**mine, **{k: v for k, v in base.items() if k != "params"}}
            for mine, base in zip(self.param_groups, self.base_optimizer.param_groups)
        ]

    def get_shape_info(self) -> dict[int, torch.Size]:
        return {i: p.shape for i, (p, _) in enumerate(self.pairs)}
