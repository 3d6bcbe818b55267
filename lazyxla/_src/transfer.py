"""Host <-> device transfer: a CPU tensor's data onto the device, and a lazy tensor's value back.

# Note [Host and device transfer]
Data crosses between the host and the device in two places: `upload` (a CPU tensor becomes a
lazy tensor holding a device-data leaf; `upload_node` is the leaf alone, for graph inputs the
recorder creates) and `download` (a lazy tensor's value, computed first if pending, as a CPU
tensor). Where an upload is placed is sharding's business: one device, or in SPMD mode replicated
over all devices (`sharding.upload_placement`). `runtime.host_to_device` / `device_to_host` count
both directions in the transfer metrics. The copy kernels (`ops/special.py`) and the CPU fallback
(`fallback.py`) use this module; neither depends on the other.
"""

from __future__ import annotations

from typing import Any

import torch

from . import graph, runtime
from .ir import TensorSpec, device_data
from .sharding import sharding_key, upload_placement
from .tensor import new_tensor, read, state


def upload_node(t: torch.Tensor) -> Any:
    """A device-data node holding a copy of CPU tensor `t`: on one device, or in SPMD mode
    replicated over all of them."""
    spec = TensorSpec(tuple(t.shape), t.dtype)
    placement = upload_placement()
    arr = runtime.host_to_device(t, placement)
    return device_data(arr, spec, sharding=sharding_key(placement, arr.ndim))


def upload(
    t: torch.Tensor, dtype: torch.dtype | None = None, stride: tuple[int, ...] | None = None
) -> torch.Tensor:
    """A CPU tensor -> a new lazy tensor holding a device copy (`stride`: its layout)."""
    runtime.check_dtype(dtype or t.dtype, "a copy to the lazyxla device")
    if dtype is not None and dtype != t.dtype:
        t = t.to(dtype)
    return new_tensor((upload_node(t), 0), TensorSpec(tuple(t.shape), t.dtype), stride)


def materialize(t: torch.Tensor) -> Any:
    """Run what `t` needs and return its device array (Note [What a value read syncs])."""
    s = state(t)
    graph.sync_read(s)
    return read(s)[0].data


def download(t: torch.Tensor) -> torch.Tensor:
    """A lazy tensor's value as a new CPU tensor."""
    return runtime.device_to_host(materialize(t), t.dtype)
