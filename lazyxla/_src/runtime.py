"""PJRT devices through JAX, and host <-> device transfers.

JAX is configured here, once, before first use: 64-bit types on (torch's int64/float64 keep their
width)
and, for `CPU_NUM_DEVICES=N`, N virtual CPU devices.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import os
import re
import time
import weakref
from collections.abc import Callable
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
    return _numpy_view(t.detach().resolve_conj().resolve_neg().contiguous())


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    """`to_numpy` of a contiguous tensor that is not a conjugate or negative view."""
    bits = _BITS.get(t.dtype)
    if bits is not None:
        return t.view(bits).numpy().view(TORCH_TO_NP[t.dtype])
    return t.numpy()


# Note [Device data cache]
# As torch_xla's DataCache: a one-element host tensor (a scalar that `torch.tensor(2.0,
# device=...)` or a loss scale uploads every step) is uploaded once per (value, dtype, shape,
# device) and the device array reused; jax arrays are immutable, so sharing one is safe. An empty
# one too (transformers' DynamicCache starts each layer's keys and values as `torch.tensor([],
# device=...)`, every forward: two transfers per layer per training step). So is a
# small fill passed as data (Note [Fills passed as data] in read_sync.py: a backward's zero
# tangents, every step). A reused array that a graph has since donated (deleted) is uploaded
# again. Misses are counted as `DeviceDataCacheMiss`, torch_xla's counter.
_DATA_CACHE: collections.OrderedDict[tuple, jax.Array] = collections.OrderedDict()
_DATA_CACHE_SIZE = 128


def _cached_upload(key: tuple, upload: Callable[[], jax.Array]) -> jax.Array:
    arr = _DATA_CACHE.get(key)
    if arr is not None and not arr.is_deleted():
        _DATA_CACHE.move_to_end(key)
        return arr
    metrics.counter_inc("DeviceDataCacheMiss")
    arr = _DATA_CACHE[key] = upload()
    if len(_DATA_CACHE) > _DATA_CACHE_SIZE:
        _DATA_CACHE.popitem(last=False)
    return arr


def host_to_device(t: torch.Tensor, device: Any = None, copy: bool = True) -> jax.Array:
    """Copy a CPU tensor to the device (counted as TransferToDeviceTime / OutboundData).

    `device`: a jax device or sharding (default: the default device); `copy=False` when `t` is
    private to the caller and never written again (jax may then keep its memory)."""
    n = t.numel()
    if n == 0 or (n == 1 and not t.is_complex()):
        return shared_upload(t, device, copy)
    return _upload(t, device, copy)


def shared_upload(t: torch.Tensor, device: Any = None, copy: bool = True) -> jax.Array:
    """`t` on `device`, shared through the device data cache by its bits (-0.0, NaNs), dtype and
    shape (Note [Device data cache]): for small host values uploaded again and again."""
    key = (to_numpy(t).tobytes(), t.dtype, tuple(t.shape), device)
    return _cached_upload(key, lambda: _upload(t, device, copy))


def filled(value: int, shape: tuple[int, ...], dtype: torch.dtype) -> jax.Array:
    """A device array of `shape` holding `value` (0 or 1) on the default device, shared through
    the device data cache (Note [Device data cache])."""
    return _cached_upload(
        ("filled", value, dtype, shape),
        lambda: _upload(torch.full(shape, value, dtype=dtype), None, copy=False),
    )


def is_shared_upload(arr: Any) -> bool:
    """Whether `arr` is a cached upload other tensors may share (never to be donated)."""
    return any(a is arr for a in _DATA_CACHE.values())


def _upload(t: torch.Tensor, device: Any, copy: bool = True) -> jax.Array:
    t0 = time.perf_counter_ns()
    # A copy: on the CPU backend device_put may alias an aligned numpy buffer, and the host
    # tensor stays writable by the user while jax buffers must never change. torch's copy, not
    # numpy's: it is 64-byte aligned (numpy's are 16), so the CPU backend adopts its memory
    # instead of copying it a second time (a (1024, 1024) float32 upload in
    # bench/trace_overhead.py: 252 -> 224 us; having the runtime copy the user's buffer during
    # the call instead, `HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL`, measured slower, 160
    # -> 200 us), and a non-contiguous tensor is copied once.
    t = t.detach().resolve_conj().resolve_neg()
    if copy or not t.is_contiguous():
        t = t.clone(memory_format=torch.contiguous_format)
    arr = device_put(_numpy_view(t), device or default_device())
    elapsed = time.perf_counter_ns() - t0  # (one interval, two of torch_xla's metrics)
    metrics.metric_add("TensorToData", elapsed)
    metrics.metric_add("TransferToDeviceTime", elapsed)
    metrics.metric_add("OutboundData", _bytes_placed(t, device))
    metrics.counter_inc("CreateDataHandles")
    if device is None or isinstance(device, jax.Device):
        _remember_host_value(arr, t)  # (`t` is private here: copied, or given with copy=False)
    return arr


# Note [Host values of device data]
# A device array never changes, so a small one's values, once on the host, answer every later
# read of it without a transfer. transformers' `generate()` reads its input ids, its special
# tokens and a few flags several times per call (Note [Small integer reads on the host]), and
# uploads what it computed on the host to read it again: 12 downloads per call, half of them of
# an array read before. So an upload to one device keeps its private host copy, and a download
# keeps what it read, for arrays of at most `_HOST_VALUE_ELEMENTS` elements, as long as the array
# lives (a weak reference drops the entry with it); a read returns a fresh copy, which the caller
# may write. A deleted (donated) array is read as before, and fails as before. Such a read is not
# a transfer: it adds nothing to TransferFromDeviceTime or InboundData. An array whose memory
# another owner can write (shared through DLPack, Note [DLPack]) is read from the device every
# time (`shares_memory`).
_HOST_VALUE_ELEMENTS = 4096
# id(array) -> (a weak reference to it, its host value, or None: read it from the device)
_host_values: dict[int, tuple[weakref.ref, torch.Tensor | None]] = {}


def _entry(arr: Any, host: torch.Tensor | None) -> tuple[weakref.ref, torch.Tensor | None]:
    key = id(arr)
    return (weakref.ref(arr, lambda _, key=key: _host_values.pop(key, None)), host)


def _remember_host_value(arr: jax.Array, host: torch.Tensor) -> None:
    if host.numel() > _HOST_VALUE_ELEMENTS:
        return
    old = _host_values.get(id(arr))
    if old is not None and old[0]() is arr and old[1] is None:
        return  # (its memory is shared: never remembered)
    _host_values[id(arr)] = _entry(arr, host)


def shares_memory(arr: Any) -> None:
    """`arr`'s memory may be written by another owner (DLPack): read it from the device always
    (Note [Host values of device data])."""
    _host_values[id(arr)] = _entry(arr, None)


def _known_host_value(arr: Any, dtype: torch.dtype) -> torch.Tensor | None:
    entry = _host_values.get(id(arr))
    if entry is None or entry[0]() is not arr:
        return None
    host = entry[1]
    if host is None or host.dtype != dtype or arr.is_deleted():
        return None
    return host.clone()


# Note [Uploads to one device]
# `jax.device_put` spends ~50-100 us of Python on an upload (pytree flattening, sharding and
# layout checks, dispatch bookkeeping) around the transfer itself, jaxlib's `batched_device_put`
# (~20 us for a small array): a 31-element `.to(device)` took ~230 us (~80 us without them). An
# upload of a numpy array to one device calls the transfer directly, with the array's abstract
# value and the device's sharding, as jax's own path ends up doing for such an upload; an upload
# over a sharding (SPMD) takes jax.device_put. (jax is pinned: `_put_direct` is its private
# transfer entry, checked at import and by the tests; without it every upload takes
# jax.device_put.) Its abstract value is cached per shape and dtype (~10 us of jax's checks).
try:
    from jax._src import core as _jax_core
    from jax._src.interpreters.pxla import batched_device_put as _put_direct
except ImportError:  # pragma: no cover (another jax layout)
    _put_direct = None


@functools.lru_cache(maxsize=4096)
def _aval(shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """The abstract value of an upload: building one runs ~10 us of jax's checks."""
    return _jax_core.ShapedArray(shape, dtype)


@functools.cache
def _device_sharding(device: jax.Device) -> jax.sharding.SingleDeviceSharding:
    return jax.sharding.SingleDeviceSharding(device)


def device_put(host: np.ndarray, device: Any) -> jax.Array:
    """`host` on `device` (a jax device or a sharding); see Note [Uploads to one device]."""
    if _put_direct is None or not isinstance(device, jax.Device):
        return jax.device_put(host, device)
    return _put_direct(_aval(host.shape, host.dtype), _device_sharding(device), [host], [device])


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
    known = _known_host_value(arr, dtype)  # Note [Host values of device data]
    if known is not None:
        return known
    one_device = isinstance(arr.sharding, jax.sharding.SingleDeviceSharding)
    if not one_device:
        # An SPMD array read whole (torch_xla's name for assembling sharded data on the host).
        metrics.counter_inc("ReplicateShardedData")
    with metrics.timed("TransferFromDeviceTime"):
        if not (arr.is_fully_addressable or arr.is_fully_replicated):
            # Sharded over several processes (SPMD across hosts): a collective gather, so every
            # process must read the tensor at the same point, as in torch_xla.
            from jax.experimental import multihost_utils

            arr = multihost_utils.process_allgather(arr, tiled=True)
        host = np.array(arr)  # a copy: jax buffers are immutable, torch tensors are not
    metrics.observe_executions()  # (having waited for `arr`: Note [ExecuteTime])
    metrics.metric_add("InboundData", host.nbytes)
    bits = _BITS.get(dtype)
    if bits is not None and host.dtype == TORCH_TO_NP[dtype]:
        flat = host.reshape(-1).view(TORCH_TO_NP[bits])
        out = torch.from_numpy(flat).view(dtype).reshape(host.shape)
    else:  # (0-d too: a Python number would quiet a NaN, flush a denormal)
        out = torch.from_numpy(host)
        out = out if out.dtype == dtype else out.to(dtype)
    if one_device and out.numel() <= _HOST_VALUE_ELEMENTS:
        _remember_host_value(arr, out.clone())  # (`out` is the caller's to write)
    return out


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> jax.Array:
    return jnp.zeros(shape, jnp_dtype(dtype))


# Note [Out of memory before running]
# A graph whose outputs and temporaries cannot fit on its devices is refused when it is compiled,
# with torch_xla's message ("Error preparing computation: Out of memory allocating N bytes."),
# before it runs: on a CPU the alternative is worse than an error. XLA:CPU allocates lazily, so
# such a program either runs for hours (a 4 PiB `torch.rand(...).sum()` whose sum XLA fuses with
# the generator) or is killed by the kernel's OOM killer with no error at all. The figure is
# XLA's own buffer assignment (`compiled.memory_analysis()`: outputs + temporaries - outputs
# aliased onto donated inputs), per device; a device's capacity is its `bytes_limit` on GPU/TPU,
# and on the CPU the host's RAM and swap, which all of its virtual devices share. N is the largest
# single output when that alone cannot fit (as torch_xla names the one allocation that failed),
# else the whole. The check runs once per compile, never per execution; the failure goes
# through Note [Failed graphs], so only the tensors that need the allocation fail.


def _capacity(devices: list[jax.Device]) -> int | None:
    """Bytes the program may use over `devices` (None: unknown)."""
    if devices and devices[0].platform == "cpu":
        return _host_memory()
    limits = [(d.memory_stats() or {}).get("bytes_limit") for d in devices]
    return min(limits) if limits and all(limits) else None


@functools.cache
def _host_memory() -> int | None:
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    swap = 0
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("SwapTotal:"):
                    swap = int(line.split()[1]) * 1024
    return ram + swap


_HLO_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128)\[([\d,]*)\]")
_HLO_BITS = {"pred": 8, "bf16": 16, "c64": 64, "c128": 128}


def _largest_buffer(exe: Any, capacity: int) -> int | None:
    """The bytes of the largest array in `exe`'s optimized HLO, if that alone cannot fit (the
    allocation torch_xla names); read only on this error path."""
    try:
        text = exe.as_text()
    except Exception:
        return None
    best = 0
    for ty, dims in _HLO_SHAPE.findall(text or ""):
        bits = _HLO_BITS.get(ty) or int(ty[1:])
        best = max(best, math.prod(int(d) for d in dims.split(",") if d) * bits // 8)
    return best if best > capacity else None


def check_fits(exe: Any, largest_output: int) -> None:
    """Raise torch_xla's out-of-memory error if `exe` cannot fit (Note [Out of memory before
    running]). `largest_output`: the bytes of its largest output."""
    try:
        m = exe.memory_analysis()
        devices = list(exe.runtime_executable().local_devices())
    except Exception:  # a platform without the analysis: XLA reports at run time
        return
    if m is None or not devices:
        return
    capacity = _capacity(devices)
    if capacity is None:
        return
    per_device = int(m.output_size_in_bytes) + int(m.temp_size_in_bytes)
    per_device -= int(m.alias_size_in_bytes)
    shared = len(devices) if devices[0].platform == "cpu" else 1  # CPU devices share the host
    need = per_device * shared
    if need <= capacity:
        return
    n = largest_output if largest_output > capacity else _largest_buffer(exe, capacity) or need
    err = RuntimeError(f"Error preparing computation: Out of memory allocating {n} bytes.")
    err.add_note(
        f"lazyxla: this graph's outputs and temporaries need {need / 2**30:,.1f} GiB "
        f"(XLA's buffer assignment), more than the {capacity / 2**30:,.1f} GiB "
        f"{'of host memory (RAM and swap) ' if shared else 'a device has '}it runs on. Make the "
        "tensors smaller (batch, sequence), shard them over more devices, or sync more often so "
        "fewer intermediate results are outputs of one graph."
    )
    raise err


# Note [Scalars seen again]
# Most lifted scalars have the same value step after step: a learning rate, an optimizer's betas
# and epsilon, a decomposition's constants (a Llama training step: 100 of its 121 scalars). The
# executable converts a numpy scalar argument on every call (~3 us); a device array it takes as
# it is (~0.5 us). So a value passed to three different executions is put on the device once and
# passed as that array from then on (a Llama step's executable call: 0.88 ms -> 0.71). Values
# are keyed by dtype and bytes (0.0 and -0.0 differ, a NaN matches its own bits). A value that
# changes every step (Adam's bias corrections, passed once or twice a step) is never put, which
# would cost ~30 us: its sightings cost only a dict entry, and both tables are bounded.
# Single-device runs only: an SPMD program or one across processes places its arguments itself.
# Apart from the device data cache (Note [Device data cache]): that one holds what a tensor
# uploads, on first use, and may be read through a donated input; these are admitted after three
# runs, are never donated (scalars are not among a graph's donated arguments), and are more.
# Putting one is an upload, counted as a tensor's is (TransferToDeviceTime, OutboundData,
# CreateDataHandles); a value passed as itself is an argument of its execution, as a number.


class _ScalarArrays:
    """Device arrays of scalar values seen in earlier executions (Note [Scalars seen again])."""

    LIMIT = 4096
    RUNS = 3  # executions a value is passed to before it gets its own device array

    def __init__(self) -> None:
        self.kept: dict[tuple, jax.Array] = {}
        self.seen: dict[tuple, tuple[int, int]] = {}  # value -> (executions, the last one)
        self.execution = 0

    def arrays(self, values: list[np.generic]) -> list[Any]:
        """The arguments of an execution for `values`: each value's device array if it has one,
        else the value itself."""
        self.execution = g = self.execution + 1
        kept, seen = self.kept, self.seen
        out: list[Any] = []
        for v in values:
            key = (type(v), v.tobytes())  # (a numpy scalar's type names its dtype)
            a = kept.get(key)
            if a is None:
                a = v
                mark = seen.get(key)
                if mark is None:
                    if len(seen) >= self.LIMIT:
                        seen.clear()
                    seen[key] = (1, g)
                elif mark[1] != g:
                    if mark[0] + 1 < self.RUNS:
                        seen[key] = (mark[0] + 1, g)
                    else:
                        del seen[key]
                        if len(kept) >= self.LIMIT:
                            kept.clear()
                        a = kept[key] = _put_scalar(v)
            out.append(a)
        return out


def _put_scalar(v: np.generic) -> jax.Array:
    """A kept scalar's device array: an upload, counted as `_upload` counts a tensor's."""
    with metrics.timed("TransferToDeviceTime"):
        a = device_put(np.asarray(v), default_device())
    metrics.metric_add("OutboundData", v.nbytes)
    metrics.counter_inc("CreateDataHandles")
    return a


KEPT_SCALARS = _ScalarArrays()
