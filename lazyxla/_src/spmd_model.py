"""Model-level SPMD helpers: the patched linear, backward barriers, FSDPv2, sharding pictures."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import sharding as xs


class XLAPatchedLinear(torch.autograd.Function):
    """`F.linear` through einsum, so a sharded batch dim is never flattened away.

    `torch.matmul` reshapes N-d inputs to 2-D, merging a sharded dim with others and making
    sharding propagation hard; einsum keeps every dim.
    """

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor, bias: Any = None) -> Any:
        ctx.save_for_backward(input, weight, bias)
        with torch.no_grad():
            product = torch.einsum("...n,mn->...m", input, weight)
            return product if bias is None else product + bias

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = torch.einsum("...m,mn->...n", grad_output, weight)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.einsum("...m,...n->mn", grad_output, input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = torch.einsum("...m->m", grad_output)
        return grad_input, grad_weight, grad_bias


def xla_patched_nn_linear_forward(m: nn.Linear, input: torch.Tensor) -> torch.Tensor:
    return XLAPatchedLinear.apply(input, m.weight, m.bias)


def apply_backward_optimization_barrier(m: nn.Module) -> None:
    """Keep XLA from fusing this module's backward with others (bounds gradient buffers)."""
    from .xla_model import optimization_barrier_

    def barrier(module: nn.Module, grad_input: Any, grad_output: Any) -> None:
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        grads += [g for g in grad_input if isinstance(g, torch.Tensor)]
        optimization_barrier_(grads)

    m.register_full_backward_hook(barrier)


def _fsdp_spec(p: torch.Tensor, mesh: xs.Mesh, shard_maximal: bool) -> tuple:
    spec: list[Any] = [None] * p.dim()
    if p.dim() == 0:
        return ()
    size = mesh.shape()["fsdp"]
    dims = sorted(range(p.dim()), key=lambda d: -p.shape[d]) if shard_maximal else range(p.dim())
    for d in dims:
        if p.shape[d] % size == 0:
            spec[d] = "fsdp"
            break
    return tuple(spec)


class SpmdFullyShardedDataParallel(nn.Module):
    """FSDP through SPMD (torch_xla's FSDPv2): every parameter sharded over the mesh's 'fsdp' axis.

    Args:
        module: the model (already on the lazyxla device).
        mesh: a mesh with an 'fsdp' axis (default: the global mesh).
        shard_output: `f(output, mesh)` annotating the output; default shards the output's
            batch dim over 'fsdp'.
        auto_wrap_policy: accepted for torch_xla compatibility; every parameter is sharded
            whatever the policy, so the math is the same.
    """

    def __init__(
        self,
        module: nn.Module,
        mesh: xs.Mesh | None = None,
        shard_output: Callable[[Any, xs.Mesh], None] | None = None,
        auto_wrap_policy: Any = None,
        shard_maximal: bool = False,
    ) -> None:
        super().__init__()
        mesh = mesh if mesh is not None else xs.get_global_mesh()
        if mesh is None:
            raise ValueError(
                "SpmdFullyShardedDataParallel needs a mesh: pass mesh= or set_global_mesh"
            )
        if mesh.axis_names is None or "fsdp" not in mesh.axis_names:
            raise ValueError(f"the mesh needs an axis named 'fsdp'; it has {mesh.axis_names}")
        self.module = module
        self._mesh = mesh
        self._shard_output = shard_output
        for p in module.parameters():
            xs.mark_sharding(p, mesh, _fsdp_spec(p, mesh, shard_maximal))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.module(*args, **kwargs)
        if self._shard_output is not None:
            self._shard_output(out, self._mesh)
        elif isinstance(out, torch.Tensor) and out.dim() > 0:
            if out.shape[0] % self._mesh.shape()["fsdp"] == 0:
                xs.mark_sharding(out, self._mesh, ("fsdp",) + (None,) * (out.dim() - 1))
        return out


# --- pictures ------------------------------------------------------------------------------------


def visualize_tensor_sharding(t: torch.Tensor, **kwargs: Any) -> Any:
    """Print which device holds which tile of `t` (a rich table, via JAX's visualizer)."""
    import jax

    arr = xs.XLAShardedTensor.wrap(xs.unwrap(t))._array()
    if arr.ndim > 2:
        raise ValueError("visualize_tensor_sharding shows 1-D and 2-D tensors")
    return jax.debug.visualize_array_sharding(arr, **kwargs)


_V1 = re.compile(r"\{devices=\[([\d,]+)\]([\d,]+)( last_tile_dim_replicate)?\}")


def visualize_sharding(sharding: str, use_color: bool = True) -> Any:
    """Print a torch_xla sharding string as a grid of tiles and the devices holding each.

    Example:
        >>> visualize_sharding("{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}")
    """
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False, show_lines=True)
    if sharding in ("{replicated}", ""):
        table.add_row("replicated on all devices")
    else:
        m = _V1.fullmatch(sharding)
        if m is None:
            raise ValueError(f"not a torch_xla V1 sharding string: {sharding!r}")
        dims = [int(d) for d in m.group(1).split(",")]
        devs = [int(d) for d in m.group(2).split(",")]
        rep = dims.pop() if m.group(3) else 1
        tiles = [devs[i * rep : (i + 1) * rep] for i in range(len(devs) // rep)]
        if len(dims) == 1:
            dims = [1, dims[0]]
        if len(dims) != 2:
            raise ValueError("visualize_sharding shows 1-D and 2-D tilings")
        rows, cols = dims
        for r in range(rows):
            cells = []
            for c in range(cols):
                ids = tiles[r * cols + c]
                cells.append("CPU " + ",".join(map(str, ids)) if use_color else str(ids))
            table.add_row(*cells)
    Console().print(table)
    return table
