"""torch_xla's `torch_xla.utils.dlpack`: lazy tensors to and from DLPack, without a copy on CPU.

# Note [DLPack]
`to_dlpack(t)` computes `t` (with everything pending, as any value read does) and returns a DLPack
capsule of its device buffer: a consumer on the same device (`torch.utils.dlpack.from_dlpack` on
the CPU, `jax.dlpack.from_dlpack` after that) sees the same memory. `from_dlpack(x)` takes a
capsule or any object with `__dlpack__` / `__dlpack_device__` (a CPU torch tensor, a jax or NumPy
array) and returns a lazy tensor whose device data is that memory where the runtime can alias it
(an aligned CPU buffer), else a copy. As in torch_xla, only CPU producers are accepted.

The memory is shared at the moment of the exchange: later lazy ops on the tensor write new
buffers (XLA buffers are immutable), so they never show through the other side; writing in place
through the other side into the shared buffer is visible to the lazy tensor until it is next
rebound, as with torch_xla. Buffers lazyxla shares between tensors (cached one-element uploads)
are copied before export, so such a write can only reach the exported tensor.
"""

from __future__ import annotations

from typing import Any

import jax
import torch
import torch.utils.dlpack as torch_dlpack

from . import runtime, transfer
from .ir import TensorSpec, device_data
from .sharding import sharding_key, upload_placement
from .tensor import is_lazy, new_tensor


def to_dlpack(xla_tensor: torch.Tensor) -> Any:
    """A DLPack capsule of lazy tensor `xla_tensor`'s device buffer (Note [DLPack]).

    Example:
        >>> cpu = torch.utils.dlpack.from_dlpack(to_dlpack(t))  # shares t's buffer on CPU
    """
    if not is_lazy(xla_tensor):
        raise TypeError(
            f"to_dlpack takes a lazyxla tensor, got {type(xla_tensor).__name__} on "
            f"{getattr(xla_tensor, 'device', None)}; for a CPU tensor use torch.utils.dlpack"
        )
    arr = transfer.materialize(xla_tensor)
    if len(arr.sharding.device_set) > 1:
        if not arr.sharding.is_fully_replicated:
            raise ValueError(
                f"to_dlpack: the tensor (shape {tuple(xla_tensor.shape)}) is sharded over "
                f"{len(arr.sharding.device_set)} devices; DLPack describes one buffer. Gather it "
                "first (.cpu(), or xs.clear_sharding) and export that"
            )
        arr = arr.addressable_shards[0].data
    if runtime.is_shared_upload(arr):
        arr = jax.numpy.array(arr, copy=True)
    runtime.shares_memory(arr)  # the consumer may write it: no host copy stands for it
    return arr.__dlpack__()


def _check_cpu(ext_tensor: Any) -> None:
    if not hasattr(ext_tensor, "__dlpack_device__"):
        return
    device_type, _ = ext_tensor.__dlpack_device__()
    if int(device_type) != int(torch_dlpack.DLDeviceType.kDLCPU):
        raise ValueError(
            "PyTorch/XLA DLPack implementation currently only supports CPU "
            f"(got DLPack device type {int(device_type)}); move the tensor to the CPU first"
        )


def from_dlpack(ext_tensor: Any) -> torch.Tensor:
    """A lazy tensor holding the data of a DLPack capsule or `__dlpack__` object (Note [DLPack]).

    Example:
        >>> t = from_dlpack(torch.arange(4))             # a CPU tensor, no copy
        >>> u = from_dlpack(jax.numpy.ones((2, 2)))      # a jax array
    """
    if is_lazy(ext_tensor):
        raise TypeError("from_dlpack: the tensor is already a lazyxla tensor")
    _check_cpu(ext_tensor)
    # torch reads capsules and __dlpack__ objects alike; the view shares the producer's memory.
    host = torch_dlpack.from_dlpack(ext_tensor)
    runtime.check_dtype(host.dtype, "from_dlpack")
    if not host.is_contiguous():
        arr = runtime.host_to_device(host.contiguous())
    else:
        arr = jax.dlpack.from_dlpack(host, copy=None)  # aliases the buffer when it is aligned
        runtime.shares_memory(arr)  # the producer may write it
    placement = upload_placement()  # SPMD mode: replicated over every device
    if placement is not None:
        arr = jax.device_put(arr, placement)
    elif arr.devices() != {runtime.default_device()}:
        arr = jax.device_put(arr, runtime.default_device())
    spec = TensorSpec(tuple(host.shape), host.dtype)
    node = device_data(arr, spec, sharding=sharding_key(placement, arr.ndim))
    return new_tensor((node, 0), spec)
