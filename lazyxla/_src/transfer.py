"""Host <-> device transfer: a CPU tensor's data onto the device, and a lazy tensor's value back.

# Note [Host and device transfer]
Data crosses between the host and the device in two places: `upload` (a CPU tensor becomes a
lazy tensor holding a device-data leaf; `upload_node` is the leaf alone, for graph inputs the
recorder creates) and `download` (a lazy tensor's value, computed first if pending, as a CPU
tensor). Where an upload is placed is sharding's business: one device, or in SPMD mode replicated
over all devices (`sharding.upload_placement`); in SPMD mode `upload` defers the copy until the
tensor is needed (Note [SPMD virtual device] in tensor.py, `resolve_host`).
`runtime.host_to_device` / `device_to_host` count both directions in the transfer metrics. The
copy kernels (`ops/special.py`) and the CPU fallback (`fallback.py`) use this module; neither
depends on the other.
"""

from __future__ import annotations

from typing import Any

import torch

from . import metrics, read_sync, runtime, sharding
from .ir import TensorSpec, device_data
from .sharding import sharding_key, upload_placement
from .tensor import HostState, Value, defer_upload, live_states, new_tensor, read, state


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
    """A CPU tensor -> a new lazy tensor holding a device copy (`stride`: its layout). In SPMD
    mode the copy stays on the host until the tensor is needed (Note [SPMD virtual device])."""
    runtime.check_dtype(dtype or t.dtype, "a copy to the lazyxla device")
    if dtype is not None and dtype != t.dtype:
        t = t.to(dtype)
    spec = TensorSpec(tuple(t.shape), t.dtype)
    if sharding.is_spmd():
        out = new_tensor(_NO_VALUE, spec, stride)
        # A private copy: the caller's tensor stays writable; ours is read once, at the upload.
        host = t.detach().resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format)
        defer_upload(state(out), host)
        global _deferred
        _deferred += 1
        return out
    return new_tensor((upload_node(t), 0), spec, stride)


_NO_VALUE: Value = (device_data(None, TensorSpec((), torch.float32)), 0)  # replaced at once
# Tensors deferred since the last `sync_host_data`: a sync walks the live tensors for them only
# when there can be some (every one deferred before it was uploaded then).
_deferred = 0


def resolve_host(s: HostState, placement: Any) -> Value:
    """Upload a deferred tensor's host data (Note [SPMD virtual device]): into `placement` (a
    sharding), or when None where any upload goes (replicated over every device). `s` becomes
    a plain state holding the device-data leaf; returns its value."""
    host = s.host
    if placement is None:
        placement = upload_placement()
    arr = runtime.host_to_device(host, placement, copy=False)
    node = device_data(arr, s.spec, sharding=sharding_key(placement, arr.ndim))
    s.value = (node, 0)  # (a HostState's setter: it becomes a LazyState)
    s.ir_data = node
    return s.value


def sync_host_data() -> None:
    """A sync's upload of every deferred live tensor, replicated (torch_xla's
    `SyncTensorsToData`; Note [SPMD virtual device])."""
    global _deferred
    if not _deferred:
        return
    hosts = [s for s in live_states() if type(s) is HostState]
    if hosts:
        metrics.counter_inc("SyncTensorsToData", len(hosts))
        for s in hosts:
            resolve_host(s, None)
    _deferred = 0


def materialize(t: torch.Tensor) -> Any:
    """Run what `t` needs and return its device array (Note [What a value read syncs])."""
    s = state(t)
    read_sync.sync_read(s)
    return read(s)[0].data


def download(t: torch.Tensor) -> torch.Tensor:
    """A lazy tensor's value as a new CPU tensor."""
    return runtime.device_to_host(materialize(t), t.dtype)
