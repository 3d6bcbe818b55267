"""FSDP v1 (`torch_xla.distributed.fsdp.XlaFullyShardedDataParallel`) over processes.

Each wrapped module's parameters are flattened, padded to a multiple of the world size and
sharded: a process keeps only its slice, as an ordinary `nn.Parameter` (what `parameters()` and
the optimizer see). The forward all-gathers the full parameters (an autograd function whose
backward reduce-scatters the full gradients into the shards' gradients, averaged over the
processes) and runs the module on them. Everything is recorded into the step's graph (Note
[Cross-process collectives]); XLA schedules and frees the gathered parameters, so
`reshard_after_forward` and the bucket sizes have nothing to control here and are accepted.
Step with `optimizer.step()` (not `xm.optimizer_step`: the shards' gradients are already
reduced).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import collectives, runtime_api
from . import xla_model as xm


class _GatherParams(torch.autograd.Function):
    """Full parameters from shards; their gradients reduce-scattered back to the shards."""

    @staticmethod
    def forward(ctx: Any, meta: tuple, world: int, *shards: torch.Tensor) -> tuple:
        ctx.world = world
        fulls = []
        for (shape, numel), s in zip(meta, shards):
            full = xm.all_gather(s, dim=0) if world > 1 else s
            fulls.append(full[:numel].reshape(shape))
        return tuple(fulls)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        world = ctx.world
        out = []
        for g in grads:
            flat = collectives.padded_flat(g, world)
            out.append(xm.reduce_scatter("sum", flat, 1.0 / world, 0, world) if world > 1 else flat)
        return (None, None, *out)


def _own_parameters(module: nn.Module) -> list[tuple[nn.Module, str]]:
    """(owner, name) of every parameter of `module` not inside a nested FSDP unit."""
    found = [(module, n) for n, p in module._parameters.items() if p is not None]
    for child in module.children():  # in definition order, as named_parameters() lists them
        if not isinstance(child, XlaFullyShardedDataParallel):
            found += _own_parameters(child)
    return found


class XlaFullyShardedDataParallel(nn.Module):
    """Shard `module`'s parameters over the processes (torch_xla's FSDP v1 API).

    Args:
        module: the module to wrap (its parameters on the lazyxla device).
        auto_wrap_policy: wrap submodules first, as torch_xla does (`fsdp.wrap` policies).
        auto_wrapper_callable: how a submodule is wrapped (default: this class, same arguments).
        compute_dtype: run the forward with parameters cast to this dtype (default: their own).
        Other torch_xla arguments (`reshard_after_forward`, `flatten_parameters`, bucket sizes,
        `pin_layout_in_collective_ops`, optimization barriers, `_shard_size_multiple`, ...) are
        accepted: XLA's scheduler decides what they tune. `sharding_groups` is rejected.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        compute_dtype: torch.dtype | None = None,
        sharding_groups: Any = None,
        auto_wrap_policy: Callable[..., bool] | None = None,
        auto_wrapper_callable: Callable[..., nn.Module] | None = None,
        param_init_fn: Callable[[nn.Module], None] | None = None,
        **accepted: Any,
    ) -> None:
        if sharding_groups is not None:
            raise NotImplementedError(
                "XlaFullyShardedDataParallel(sharding_groups=...) is not supported by lazyxla: "
                "it shards over all processes"
            )
        super().__init__()
        if param_init_fn is not None:
            param_init_fn(module)
        module.to(xm.xla_device())  # a CPU module's parameters and buffers move, as in torch_xla
        if auto_wrap_policy is not None:
            from .fsdp_wrap import recursive_wrap

            def wrapper(m: nn.Module) -> nn.Module:
                if auto_wrapper_callable is not None:
                    return auto_wrapper_callable(m, compute_dtype=compute_dtype, **accepted)
                return XlaFullyShardedDataParallel(m, compute_dtype=compute_dtype, **accepted)

            recursive_wrap(module, auto_wrap_policy, wrapper, only_wrap_children=True)
        self.module = module
        self.compute_dtype = compute_dtype
        self.world_size = runtime_api.world_size()
        self.rank = runtime_api.global_ordinal()
        self._owners: list[tuple[nn.Module, str]] = []
        self._meta: list[tuple[torch.Size, int]] = []
        shards = []
        for owner, name in _own_parameters(module):
            p = owner._parameters.pop(name)
            shard = nn.Parameter(
                collectives.flat_shard(p.detach(), self.world_size, self.rank).clone(),
                requires_grad=p.requires_grad,
            )
            self._owners.append((owner, name))
            self._meta.append((p.shape, p.numel()))
            shards.append(shard)
            setattr(owner, name, p.detach())  # a plain tensor until the first forward
        self.sharded_params = nn.ParameterList(shards)
        lazy = [s for s in shards if s.device.type == "jax"]
        if lazy:  # rank-dependent slices: materialised here, alone (see ZeRO-1's note)
            xm.unlazy(lazy)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        shards = list(self.sharded_params)
        if self.compute_dtype is not None:
            shards = [s.to(self.compute_dtype) for s in shards]
        fulls = _GatherParams.apply(tuple(self._meta), self.world_size, *shards)
        for (owner, name), full in zip(self._owners, fulls):
            setattr(owner, name, full)
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)

    def get_shard_metadata(self) -> dict[str, Any]:
        """What `consolidate_sharded_state_dicts` needs to rebuild the unwrapped model's state
        dict from every rank's `state_dict()`: for each shard's key, the original parameter's
        name and shape; for every other key, its name without the FSDP wrappers."""
        keys = list(self.state_dict().keys())
        shard_info = {}
        for path, unit in self.named_modules():
            if not isinstance(unit, XlaFullyShardedDataParallel):
                continue
            owner_paths = {id(m): n for n, m in unit.module.named_modules()}
            prefix = _unwrapped_name(self, path) if path else ""
            for i, ((owner, name), (shape, numel)) in enumerate(
                zip(unit._owners, unit._meta, strict=True)
            ):
                orig = ".".join(x for x in (prefix, owner_paths[id(owner)], name) if x)
                key = f"{path}.sharded_params.{i}" if path else f"sharded_params.{i}"
                shard_info[key] = {"_orig_name": orig, "_orig_size": shape, "_numel": numel}
        names = {k: _unwrapped_name(self, k) for k in keys if k not in shard_info}
        return {
            "shard_info": shard_info,
            "unwrapped_names": names,
            "world_size": self.world_size,
            "rank": self.rank,
        }


def _unwrapped_name(root: nn.Module, key: str) -> str:
    """`key` (a state-dict key or module path under `root`) without FSDP's `module.` levels."""
    parts, kept, cur = key.split("."), [], root
    for i, part in enumerate(parts):
        if isinstance(cur, XlaFullyShardedDataParallel) and part == "module":
            cur = cur.module
            continue
        kept.append(part)
        if i < len(parts) - 1:
            cur = cur._modules.get(part, cur) if isinstance(cur, nn.Module) else cur
    return ".".join(kept)


def checkpoint_module(module: nn.Module) -> nn.Module:
    """Run `module.forward` under activation checkpointing (`fsdp_utils.checkpoint_module`)."""
    from .fsdp_utils import checkpoint_module as checkpointed

    return checkpointed(module)
