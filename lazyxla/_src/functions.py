"""torch_xla.core.functions: differentiable collectives, a distributed matmul, SyncBatchNorm.

The collectives are `xm.all_reduce` / `xm.all_gather` with torch_xla's gradients: the gradient of
an all-reduce SUM is the (scaled) incoming gradient, of MUL the incoming gradient times
`output / input` (0 where the input is 0), of MIN/MAX the incoming gradient where this replica
held the extreme; the gradient of an all-gather is this replica's slice of the incoming gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import runtime_api
from . import xla_model as xm


class AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, reduce_type: str, scale: float, groups: Any):
        ctx.reduce_type, ctx.scale = reduce_type, scale
        output = xm.all_reduce(reduce_type, input, scale=scale, groups=groups)
        ctx.save_for_backward(input, output)
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor):
        input, output = ctx.saved_tensors
        grad = grad_output * ctx.scale if ctx.scale != 1.0 else grad_output
        if ctx.reduce_type == xm.REDUCE_SUM:
            return grad, None, None, None
        if ctx.reduce_type == xm.REDUCE_MUL:
            ratio = torch.where(input != 0, output / input, torch.zeros_like(input))
            return grad * ratio, None, None, None
        if ctx.reduce_type in (xm.REDUCE_MIN, xm.REDUCE_MAX):
            return torch.where(input == output, grad, torch.zeros_like(grad)), None, None, None
        raise RuntimeError(
            f"all_reduce: reduce type {ctx.reduce_type!r} has no gradient (only sum, mul, min, max)"
        )


def all_reduce(
    reduce_type: str, value: torch.Tensor, scale: float = 1.0, groups: Any = None
) -> torch.Tensor:
    """`xm.all_reduce(reduce_type, value, scale, groups)`, differentiable."""
    return AllReduce.apply(value, reduce_type, scale, groups)


class AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, dim: int):
        ctx.dim = dim
        ctx.ordinal = runtime_api.global_ordinal()
        ctx.world_size = runtime_api.world_size()
        return xm.all_gather(input, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor):
        size = grad_output.size(ctx.dim) // ctx.world_size
        return grad_output.narrow(ctx.dim, ctx.ordinal * size, size).clone(), None


def all_gather(value: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """`xm.all_gather(value, dim)`, differentiable (the gradient is this replica's slice)."""
    return AllGather.apply(value, dim)


def distributed_mm(w: torch.Tensor, x: torch.Tensor, split: int = 1) -> torch.Tensor:
    """`W @ X` with `W` sharded by columns across replicas: `w` is this replica's `N x Ko` shard,
    `x` is `(Ko * world_size) x M`; `split` cuts `M` into that many all-gathers."""
    ordinal, world = runtime_api.global_ordinal(), runtime_api.world_size()
    if x.size(0) != w.size(1) * world:
        raise ValueError(
            f"distributed_mm: x has {x.size(0)} rows, expected w.size(1) * world_size = "
            f"{w.size(1)} * {world}"
        )
    if x.size(1) % split:
        raise ValueError(f"distributed_mm: split={split} does not divide x's {x.size(1)} columns")
    parts: Sequence[torch.Tensor] = torch.split(x, x.size(1) // split, dim=1) if split > 1 else [x]
    results = []
    for part in parts:
        gathered = all_gather(part, dim=1)
        mine = gathered.narrow(0, ordinal * w.size(1), w.size(1))
        summed = all_reduce(xm.REDUCE_SUM, w @ mine)
        results.append(summed.narrow(1, ordinal * part.size(1), part.size(1)))
    return torch.cat(results, dim=1) if len(results) > 1 else results[0]


class AllReduceSumLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor):
        return xm.all_reduce(xm.REDUCE_SUM, x)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor):
        return xm.all_reduce(xm.REDUCE_SUM, grad_output)


class SyncBatchNorm(torch.nn.Module):
    """Batch norm whose batch statistics are averaged over all replicas.

    As torch_xla's: the running variance is updated with the biased batch variance.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = torch.nn.Parameter(torch.ones(num_features))
        self.bias = torch.nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        if not (2 <= batch.ndim <= 5 and batch.shape[1] == self.num_features):
            raise ValueError(
                f"SyncBatchNorm({self.num_features}): expected a 2-5 dim input with "
                f"{self.num_features} channels in dim 1, got shape {tuple(batch.shape)}"
            )
        dims = [d for d in range(batch.ndim) if d != 1]
        if self.training:
            scale = 1.0 / runtime_api.world_size()
            mean = AllReduceSumLayer.apply(batch.mean(dim=dims)) * scale
            sqr_mean = AllReduceSumLayer.apply((batch * batch).mean(dim=dims)) * scale
            var = sqr_mean - mean.pow(2)
            m = self.momentum
            self.running_mean = (1 - m) * self.running_mean + m * mean.detach()
            self.running_var = (1 - m) * self.running_var + m * var.detach()
        else:
            mean, var = self.running_mean, self.running_var
        shape = [1, -1] + [1] * (batch.ndim - 2)
        inv = torch.rsqrt(var + self.eps).view(shape)
        return (batch - mean.view(shape)) * inv * self.weight.view(shape) + self.bias.view(shape)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"
