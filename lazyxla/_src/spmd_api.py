"""torch_xla.distributed.spmd.api: PyTorch DTensor's vocabulary (DeviceMesh, placements) on SPMD.

A `DeviceMesh` becomes a lazyxla `Mesh` with the same device ids, shape and axis names; placements
become a partition spec (`Shard(d)` on mesh dim `i` puts `i` at tensor dim `d`; `Replicate()` adds
nothing). Each entry point enters SPMD mode first, as torch_xla's do.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from . import runtime, runtime_api
from .sharding import Mesh, ShardingType, XLAShardedTensor, mark_sharding

_DEVICE_TYPES = ("xla", "jax")


def with_xla(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run `func` in SPMD mode (enter it first)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not runtime_api.is_spmd():
            runtime_api.use_spmd()
        return func(*args, **kwargs)

    return wrapper


def auto_policy(mod_name: str, mod: nn.Module, mesh: Any) -> None:
    """The `partition_fn` asking for XLA's auto-sharding (not supported by lazyxla: see
    `xla_distribute_module`)."""
    return None


@with_xla
def convert_to_xla_mesh(dt_mesh: Any) -> Mesh:
    """The lazyxla `Mesh` of a DTensor `DeviceMesh` (same device ids, shape and dim names)."""
    n = len(runtime.jax_devices())
    if dt_mesh.size() != n:
        raise ValueError(
            f"convert_to_xla_mesh: the DeviceMesh has {dt_mesh.size()} devices, but SPMD runs on "
            f"all {n} devices; build it over all of them"
        )
    ids = dt_mesh.mesh.flatten().tolist()
    names = tuple(dt_mesh.mesh_dim_names) if dt_mesh.mesh_dim_names else None
    return Mesh(ids, tuple(dt_mesh.mesh.size()), names)


@with_xla
def convert_to_xla_partition_spec(
    tensor: torch.Tensor, placements: Sequence[Any]
) -> tuple[int | None, ...]:
    """The partition spec of DTensor `placements` (Shard and Replicate only) for `tensor`."""
    spec: list[int | None] = [None] * tensor.dim()
    for mesh_dim, p in enumerate(placements):
        if p.is_shard():
            spec[p.dim] = mesh_dim
        elif not p.is_replicate():
            raise ValueError(f"Unsupported placement type: {type(p).__name__}")
    return tuple(spec)


@with_xla
def xla_distribute_tensor(
    tensor: torch.Tensor, device_mesh: Any, placements: Sequence[Any] | None = None
) -> XLAShardedTensor:
    """`tensor` (a global tensor, moved to the device) sharded over `device_mesh` by `placements`
    (default: replicated)."""
    from torch.distributed.tensor.placement_types import Replicate

    if device_mesh.device_type not in _DEVICE_TYPES:
        raise ValueError(
            f"xla_distribute_tensor: the DeviceMesh's device type is "
            f"{device_mesh.device_type!r}; build it with DeviceMesh('xla', ...)"
        )
    mesh = convert_to_xla_mesh(device_mesh)
    if type(tensor).__name__ == "DTensor":
        raise ValueError(
            "Cannot distribute a DTensor with local tensor on xla devices. The input tensor must "
            "be global."
        )
    if isinstance(tensor, XLAShardedTensor):
        if tensor.sharding_type not in (None, ShardingType.REPLICATED):
            raise ValueError(
                "XLAShardedTensor `tensor` is already annotated with non-replication sharding. "
                "Clear the existing sharding annotation first, by calling "
                "torch_xla.distributed.spmd.clear_sharding."
            )
        tensor = tensor.global_tensor
    if not tensor.is_meta and tensor.device != _device():
        tensor = tensor.to(_device())
    placements = list(placements) if placements is not None else [Replicate()] * device_mesh.ndim
    if len(placements) != device_mesh.ndim:
        raise ValueError(
            f"`placements` must have the same length as `device_mesh.ndim`! Found placements "
            f"length: {len(placements)}, and device_mesh.ndim: {device_mesh.ndim}."
        )
    return mark_sharding(tensor, mesh, convert_to_xla_partition_spec(tensor, placements))


def _device() -> torch.device:
    from .api import device

    return device()


@with_xla
def xla_distribute_module(
    module: nn.Module,
    device_mesh: Any = None,
    partition_fn: Callable[[str, nn.Module, Any], None] | None = None,
    input_fn: Callable[..., Any] | None = None,
    output_fn: Callable[..., Any] | None = None,
) -> nn.Module:
    """Shard `module`'s parameters with `partition_fn(name, submodule, mesh)` for each submodule,
    and install `input_fn` / `output_fn` (taking `(module, inputs|outputs, mesh)`) as forward
    pre/post hooks."""
    if partition_fn is not None:
        if getattr(partition_fn, "__name__", "") == "auto_policy":
            raise NotImplementedError(
                "xla_distribute_module(partition_fn=auto_policy) asks for XLA's auto-sharding, "
                "which lazyxla does not support; pass a partition_fn that calls mark_sharding"
            )
        for name, submod in module.named_modules():
            partition_fn(name, submod, device_mesh)

    def nargs(fn: Callable[..., Any]) -> int:
        return len(inspect.signature(fn).parameters)

    if input_fn is not None:
        n = nargs(input_fn)
        if n == 2:
            warnings.warn(
                "Deprecating input_fn that takes two arguments (inputs, device_mesh), please use "
                "input_fn that takes in (module, inputs, device_mesh) instead!",
                stacklevel=2,
            )
            module.register_forward_pre_hook(lambda _, inputs: input_fn(inputs, device_mesh))
        elif n == 3:
            module.register_forward_pre_hook(lambda m, inputs: input_fn(m, inputs, device_mesh))
        else:
            raise ValueError(f"input_fn should take in 3 arguments, but got {n} arguments!")
    if output_fn is not None:
        n = nargs(output_fn)
        if n == 2:
            warnings.warn(
                "Deprecating output_fn that takes two arguments (outputs, device_mesh), please "
                "use output_fn that takes in (module, outputs, device_mesh) instead!",
                stacklevel=2,
            )
            module.register_forward_hook(lambda m, i, outputs: output_fn(outputs, device_mesh))
        elif n == 3:
            module.register_forward_hook(lambda m, i, outputs: output_fn(m, outputs, device_mesh))
        else:
            raise ValueError(f"output_fn should take in 3 arguments, but got {n} arguments!")
    return module
