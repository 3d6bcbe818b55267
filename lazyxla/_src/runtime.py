"""PJRT devices through JAX, and host <-> device transfers.

JAX is configured here, once, before first use: 64-bit types on (torch's int64/float64 keep their
width)
and, for `CPU_NUM_DEVICES=N`, N virtual CPU devices.
"""

from __future__ import annotations

import collections
import functools
import math
import os
from typing import Any

import jax
import ml_dtypes
import numpy as np
import torch

from . import metrics

jax.config.update("jax_enable_x64", True)
_PLATFORMS = {"CPU": "cpu", "CUDA": "cuda", "GPU": "cuda", "TPU": "tpu"}


def apply_platform_env() -> None:
    """Configure JAX from `CPU_NUM_DEVICES` / `PJRT_DEVICE`, as they are now.

    Runs at import and again at the first device use (`jax_devices`): torch_xla initialises its
    runtime lazily, so a program may set these after `import torch_xla` and before it touches a
    device. Once JAX's backends exist the settings are fixed; nothing changes then.
    """
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        return
    n = os.environ.get("CPU_NUM_DEVICES")
    if n and jax.config.jax_num_cpu_devices != int(n):
        jax.config.update("jax_num_cpu_devices", int(n))
    want = os.environ.get("PJRT_DEVICE", "").upper()
    if want:
        if want not in _PLATFORMS:
            raise ValueError(f"PJRT_DEVICE={want!r} is not one of {sorted(_PLATFORMS)}")
        if jax.config.jax_platforms != _PLATFORMS[want]:
            jax.config.update("jax_platforms", _PLATFORMS[want])


apply_platform_env()

import jax.numpy as jnp  # noqa: E402

TORCH_TO_NP = {
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.int64: np.dtype(np.int64),
    torch.int32: np.dtype(np.int32),
    torch.int16: np.dtype(np.int16),
    torch.int8: np.dtype(np.int8),
    torch.uint8: np.dtype(np.uint8),
    torch.bool: np.dtype(np.bool_),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e4m3fnuz: np.dtype(ml_dtypes.float8_e4m3fnuz),
    torch.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
    torch.float8_e5m2fnuz: np.dtype(ml_dtypes.float8_e5m2fnuz),
    torch.float8_e8m0fnu: np.dtype(ml_dtypes.float8_e8m0fnu),
}
NP_TO_TORCH = {v: k for k, v in TORCH_TO_NP.items()}
# Dtypes NumPy knows only through ml_dtypes: moved between torch and numpy as their bits.
_BITS = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e4m3fnuz: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.float8_e5m2fnuz: torch.uint8,
    torch.float8_e8m0fnu: torch.uint8,
}


def jnp_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return TORCH_TO_NP[dtype]
    except KeyError:
        raise TypeError(unsupported_dtype(dtype)) from None


def unsupported_dtype(dtype: torch.dtype, where: str = "") -> str:
    return (
        f"lazyxla cannot hold {dtype}{where}: XLA has no equivalent type. Supported: "
        + ", ".join(str(d).removeprefix("torch.") for d in TORCH_TO_NP)
        + ". Convert the tensor first (e.g. .to(torch.complex64) for complex32)"
    )


def check_dtype(dtype: torch.dtype, what: str) -> None:
    """Raise at record time, naming the op and the user's line, for a dtype XLA cannot hold."""
    if dtype in TORCH_TO_NP:
        return
    from .ir import _user_frame

    raise TypeError(unsupported_dtype(dtype, f" (the result of {what}, at {_user_frame()})"))


@functools.cache
def jax_devices() -> list[jax.Device]:
    """Every process's devices (one process: this one's). See Note [Processes]."""
    from . import distributed

    apply_platform_env()
    distributed.ensure_initialized()
    try:
        return jax.devices()
    except RuntimeError as e:
        if not os.environ.get("PJRT_DEVICE"):
            raise
        raise RuntimeError(
            f"PJRT_DEVICE={os.environ['PJRT_DEVICE']} but JAX cannot use that platform here "
            f"({e}). Install JAX's plugin for it (jax[tpu], jax[cuda12]) or set PJRT_DEVICE=CPU"
        ) from None


def default_device() -> jax.Device:
    """The device this process drives (its first; with several processes, not process 0's)."""
    return local_devices()[0]


@functools.cache
def local_devices() -> list[jax.Device]:
    """This process's devices."""
    jax_devices()
    return jax.local_devices()


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (bfloat16 through its bit pattern); shares its memory."""
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    bits = _BITS.get(t.dtype)
    if bits is not None:
        return t.view(bits).numpy().view(TORCH_TO_NP[t.dtype])
    return t.numpy()


# Note [Device data cache]
# As torch_xla's DataCache: a one-element host tensor (a scalar that `torch.tensor(2.0,
# device=...)` or a loss scale uploads every step) is uploaded once per (value, dtype, shape,
# device) and the device array reused; jax arrays are immutable, so sharing one is safe. A reused
# array that a graph has since donated (deleted) is uploaded again. Misses are counted as
# `DeviceDataCacheMiss`, torch_xla's counter.
_DATA_CACHE: collections.OrderedDict[tuple, jax.Array] = collections.OrderedDict()
_DATA_CACHE_SIZE = 128


def host_to_device(t: torch.Tensor, device: Any = None, copy: bool = True) -> jax.Array:
    """Copy a CPU tensor to the device (counted as TransferToDeviceTime / OutboundData).

    `device`: a jax device or sharding (default: the default device); `copy=False` when `t` is
    private to the caller and never written again (jax may then keep its memory)."""
    if t.numel() == 1 and not t.is_complex():
        key = (to_numpy(t).tobytes(), t.dtype, tuple(t.shape), device)  # bits: -0.0, NaNs
        arr = _DATA_CACHE.get(key)
        if arr is not None and not arr.is_deleted():
            _DATA_CACHE.move_to_end(key)
            return arr
        metrics.counter_inc("DeviceDataCacheMiss")
        arr = _upload(t, device, copy)
        _DATA_CACHE[key] = arr
        if len(_DATA_CACHE) > _DATA_CACHE_SIZE:
            _DATA_CACHE.popitem(last=False)
        return arr
    return _upload(t, device, copy)


def is_shared_upload(arr: Any) -> bool:
    """Whether `arr` is a cached upload other tensors may share (never to be donated)."""
    return any(a is arr for a in _DATA_CACHE.values())


def _upload(t: torch.Tensor, device: Any, copy: bool = True) -> jax.Array:
    with metrics.timed("TensorToData"), metrics.timed("TransferToDeviceTime"):
        # A copy: on the CPU backend device_put may alias an aligned numpy buffer, and the host
        # tensor stays writable by the user while jax buffers must never change.
        host = np.array(to_numpy(t), copy=True) if copy else to_numpy(t)
        arr = jax.device_put(host, device or default_device())
    metrics.metric_add("OutboundData", _bytes_placed(t, device))
    metrics.counter_inc("CreateDataHandles")
    return arr


def _bytes_placed(t: torch.Tensor, device: Any) -> int:
    """The bytes an upload of `t` to `device` writes: one copy on one device; over a sharding,
    each device's shard (a replicated upload to 8 devices writes 8 copies), as torch_xla counts
    its OutboundData."""
    nbytes = t.numel() * t.element_size()
    if device is None or isinstance(device, jax.Device):
        return nbytes
    shard = math.prod(device.shard_shape(tuple(t.shape))) * t.element_size()
    return shard * len(device.addressable_devices)


def device_to_host(arr: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    """Copy a device array to a new, writable CPU tensor."""
    if not isinstance(arr.sharding, jax.sharding.SingleDeviceSharding):
        # An SPMD array read whole (torch_xla's name for assembling sharded data on the host).
        metrics.counter_inc("ReplicateShardedData")
    with metrics.timed("TransferFromDeviceTime"):
        if not (arr.is_fully_addressable or arr.is_fully_replicated):
            # Sharded over several processes (SPMD across hosts): a collective gather, so every
            # process must read the tensor at the same point, as in torch_xla.
            from jax.experimental import multihost_utils

            arr = multihost_utils.process_allgather(arr, tiled=True)
        host = np.array(arr)  # a copy: jax buffers are immutable, torch tensors are not
    metrics.metric_add("InboundData", host.nbytes)
    bits = _BITS.get(dtype)
    if bits is not None and host.dtype == TORCH_TO_NP[dtype]:
        flat = host.reshape(-1).view(TORCH_TO_NP[bits])
        return torch.from_numpy(flat).view(dtype).reshape(host.shape)
    out = torch.from_numpy(host) if host.ndim else torch.tensor(host.item(), dtype=dtype)
    return out if out.dtype == dtype else out.to(dtype)


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> jax.Array:
    return jnp.zeros(shape, jnp_dtype(dtype))
