"""PJRT devices through JAX, and host <-> device transfers.

JAX is configured here, once, before first use: 64-bit types on (torch's int64/float64 keep their
width)
and, for `CPU_NUM_DEVICES=N`, N virtual CPU devices.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import ml_dtypes
import numpy as np
import torch

from . import metrics

jax.config.update("jax_enable_x64", True)
if os.environ.get("CPU_NUM_DEVICES"):
    jax.config.update("jax_num_cpu_devices", int(os.environ["CPU_NUM_DEVICES"]))
_PLATFORMS = {"CPU": "cpu", "CUDA": "cuda", "GPU": "cuda", "TPU": "tpu"}
if os.environ.get("PJRT_DEVICE"):
    _want = os.environ["PJRT_DEVICE"].upper()
    if _want not in _PLATFORMS:
        raise ValueError(f"PJRT_DEVICE={_want!r} is not one of {sorted(_PLATFORMS)}")
    jax.config.update("jax_platforms", _PLATFORMS[_want])

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
    return jax_devices()[0]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (bfloat16 through its bit pattern); shares its memory."""
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    bits = _BITS.get(t.dtype)
    if bits is not None:
        return t.view(bits).numpy().view(TORCH_TO_NP[t.dtype])
    return t.numpy()


def host_to_device(t: torch.Tensor, device: Any = None) -> jax.Array:
    """Copy a CPU tensor to the device (counted as TransferToDeviceTime / OutboundData)."""
    with metrics.timed("TransferToDeviceTime"):
        # A copy: on the CPU backend device_put may alias an aligned numpy buffer, and the host
        # tensor stays writable by the user while jax buffers must never change.
        arr = jax.device_put(np.array(to_numpy(t), copy=True), device or default_device())
    metrics.metric_add("OutboundData", t.numel() * t.element_size())
    metrics.counter_inc("CreateDataHandles")
    return arr


def device_to_host(arr: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    """Copy a device array to a new, writable CPU tensor."""
    with metrics.timed("TransferFromDeviceTime"):
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
