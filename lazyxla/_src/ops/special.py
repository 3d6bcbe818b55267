"""Kernels that are not a lowering: transfers, copies, reading values back, and the CPU fallback."""

from __future__ import annotations

from typing import Any

import torch

from .. import graph, metrics, runtime, sharding
from ..dispatch import cast_value, register_kernel
from ..ir import TensorSpec
from ..tensor import DEVICE_TYPE, new_tensor, read, state, write

aten = torch.ops.aten


# Kernels here replace what install() would derive.
OVERRIDES = {aten.copy_.default}


def _spec(t: torch.Tensor, dtype: torch.dtype | None = None) -> TensorSpec:
    return TensorSpec(tuple(t.shape), dtype or t.dtype)


def upload(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A CPU tensor → a new lazy tensor holding a device copy."""
    if dtype is not None and dtype != t.dtype:
        t = t.to(dtype)
    return new_tensor((sharding.upload_node(t), 0), _spec(t))


def materialize(t: torch.Tensor) -> Any:
    """Run what `t` needs (only that) and return its device array."""
    s = state(t)
    graph.sync_states([s])
    return read(s)[0].data


def download(t: torch.Tensor) -> torch.Tensor:
    return runtime.device_to_host(materialize(t), t.dtype)


def _to_copy(
    x: torch.Tensor,
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    non_blocking: bool = False,
    memory_format: Any = None,
) -> torch.Tensor:
    target = torch.device(device) if device is not None else x.device
    if x.device.type != DEVICE_TYPE:  # host → device
        return upload(x, dtype)
    if target.type != DEVICE_TYPE:  # device → host
        out = download(x)
        return out.to(device=target, dtype=dtype or out.dtype)
    metrics.counter_inc("xla::_to_copy")
    spec = _spec(x, dtype)
    return new_tensor(cast_value(read(state(x)), spec), spec)


def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    metrics.counter_inc("xla::copy_")
    if dst.device.type != DEVICE_TYPE:  # device → host copy into an existing CPU tensor
        dst.copy_(download(src))
        return dst
    if src.device.type != DEVICE_TYPE:
        src = upload(src)
    ds = state(dst)
    write(ds, cast_value(read(state(src)), ds.spec))
    return dst


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return copy_(dst, src, non_blocking)


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return copy_(dst, src)


def _local_scalar_dense(x: torch.Tensor) -> Any:
    return download(x).item()


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    return bool(torch.eq(a, b).all().item())


def install() -> None:
    register_kernel(aten._to_copy.default, _to_copy)
    register_kernel(aten.copy_.default, copy_)
    register_kernel(aten._copy_from.default, _copy_from)
    register_kernel(aten._copy_from_and_resize.default, _copy_from_and_resize)
    register_kernel(aten._local_scalar_dense.default, _local_scalar_dense)
    register_kernel(aten.equal.default, equal)
    from .. import fallback

    fallback.install()
