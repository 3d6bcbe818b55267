"""torch_xla's `torch_xla.runtime` (`xr`): which devices, how many, which process.

lazyxla runs as one process over the JAX devices it sees. Outside SPMD mode each JAX device is one
torch device; in SPMD mode, as in torch_xla, the program sees one virtual device backed by all the
runtime devices (`global_runtime_device_count`).
"""

from __future__ import annotations

import os
from typing import Any

import jax

from . import distributed, graph, metrics, runtime

_PLATFORM_NAMES = {"cpu": "CPU", "gpu": "CUDA", "cuda": "CUDA", "rocm": "ROCM", "tpu": "TPU"}
_spmd_recorded = False


def _sharding() -> Any:
    """lazyxla's SPMD module if it is present (it owns the mode once it is)."""
    try:
        from . import sharding
    except ImportError:
        return None
    return sharding if hasattr(sharding, "use_spmd") else None


def device_type() -> str:
    """The PJRT device type: `CPU`, `CUDA` or `TPU` (torch_xla's `PJRT_DEVICE` names)."""
    return _PLATFORM_NAMES.get(runtime.default_device().platform, runtime.default_device().platform)


def set_device_type(pjrt_device: str) -> None:
    """Choose the device type (`CPU`, `CUDA`, `TPU`); must come before the first device use."""
    want = pjrt_device.upper()
    platforms = runtime._PLATFORMS
    if want not in platforms:
        raise ValueError(f"PJRT device {pjrt_device!r} is not one of {sorted(platforms)}")
    if runtime.jax_devices.cache_info().currsize:
        if device_type() == _PLATFORM_NAMES[platforms[want]]:
            return
        raise RuntimeError(
            f"set_device_type({pjrt_device!r}) after the runtime started on {device_type()}: "
            "call it before the first tensor is put on the device, or set PJRT_DEVICE "
            "in the environment"
        )
    os.environ["PJRT_DEVICE"] = want
    jax.config.update("jax_platforms", platforms[want])


def use_spmd(auto: bool = False) -> None:
    """Enter SPMD mode: one virtual device, backed by every runtime device."""
    global _spmd_recorded
    if auto:
        raise NotImplementedError(
            "use_spmd(auto=True) (XLA's auto-sharding) is not supported by lazyxla; annotate "
            "tensors with mark_sharding instead"
        )
    sh = _sharding()
    if sh is not None:
        sh.use_spmd()
    _spmd_recorded = True
    os.environ["XLA_USE_SPMD"] = "1"


def spmd_mode() -> bool:
    """Whether lazyxla places data in SPMD mode (entered once; data stays where it was put)."""
    sh = _sharding()
    return sh.is_spmd() if sh is not None else _spmd_recorded


def is_spmd() -> bool:
    """True in SPMD mode (`use_spmd()` or `XLA_USE_SPMD=1`).

    As torch_xla's, it reads the environment variable `use_spmd()` sets: deleting
    `XLA_USE_SPMD` (torch_xla's own test classes do, between classes) reports False until the
    next `use_spmd()`. Tensors already placed stay where they are (lazyxla never moves data out
    of SPMD mode), so lazyxla's own placement follows `spmd_mode()`."""
    flag = os.environ.get("XLA_USE_SPMD", "")
    return spmd_mode() and (flag == "true" or (flag.isdigit() and int(flag) > 0))


def world_size() -> int:
    """The number of replicas: one per process (1 in SPMD mode, where one program spans all)."""
    return 1 if is_spmd() else distributed.process_count()


def global_ordinal() -> int:
    """This process's ordinal among all processes (Note [Processes])."""
    return distributed.process_index()


def local_ordinal() -> int:
    """This process's ordinal on its host."""
    return distributed.local_rank()


def local_process_count() -> int:
    """The number of processes on this host (1 unless a launcher started several)."""
    return distributed.local_world_size()


def host_index() -> int:
    """This host's index among the hosts: its first process's index over processes per host."""
    return distributed.process_index() // local_process_count()


def process_index() -> int:
    """This process's index among the JAX processes."""
    return distributed.process_index()


def process_count() -> int:
    """The number of JAX processes."""
    return distributed.process_count()


def addressable_device_count() -> int:
    """Torch devices this process addresses: 1 in SPMD mode (the virtual device)."""
    return 1 if is_spmd() else len(runtime.local_devices())


def global_device_count() -> int:
    """Torch devices across all processes: 1 in SPMD mode (the virtual device)."""
    return 1 if is_spmd() else len(runtime.jax_devices())


def local_device_count() -> int:
    """Torch devices on this host (one process per host, so `addressable_device_count()`)."""
    return addressable_device_count()


def global_runtime_device_count() -> int:
    """Runtime (PJRT) devices across all processes, SPMD or not."""
    return len(runtime.jax_devices())


def addressable_runtime_device_count() -> int:
    """Runtime (PJRT) devices this process addresses, SPMD or not."""
    return len(jax.local_devices())


def _attributes(d: jax.Device) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "name": f"{_PLATFORM_NAMES.get(d.platform, d.platform.upper())}:{d.id}",
        "id": d.id,
        "process_index": d.process_index,
        "device_kind": d.device_kind,
    }
    for extra in ("coords", "core_on_chip", "num_cores", "slice_index"):
        v = getattr(d, extra, None)
        if v is not None:
            attrs[extra] = list(v) if isinstance(v, (tuple, list)) else v
    return attrs


def global_runtime_device_attributes() -> list[dict[str, Any]]:
    """One attribute dict per runtime device (`name`, `id`, `device_kind`, TPU `coords`...)."""
    return [_attributes(d) for d in runtime.jax_devices()]


def runtime_device_attributes(device: str) -> dict[str, Any]:
    """The attributes of one runtime device, named as `xm.xla_real_devices` names it (`CPU:0`)."""
    for d in runtime.jax_devices():
        a = _attributes(d)
        if a["name"] == device.upper():
            return a
    names = [_attributes(d)["name"] for d in runtime.jax_devices()]
    raise ValueError(f"no runtime device {device!r}; the runtime devices are {names}")


_cache_path: str | None = None
_cache_readonly = False

# JAX's events for a compile that consults the persistent cache, as torch_xla's counters.
_PERSISTENT_COUNTERS = {
    "/jax/compilation_cache/cache_hits": "PersistentCacheHit",
    "/jax/compilation_cache/cache_misses": "PersistentCacheMiss",
}


def _count_persistent(event: str, **kwargs: Any) -> None:
    name = _PERSISTENT_COUNTERS.get(event)
    if name is not None:
        metrics.counter_inc(name)


def initialize_cache(path: str, readonly: bool = False) -> None:
    """Turn on the persistent compilation cache in `path` (JAX's), as torch_xla's does.

    Must come before the first compilation. Every executable is cached, however fast it compiled.
    With `readonly=True` the cache is read but never written (JAX has no read-only switch: the
    minimum compile time worth caching is set out of reach). Each compile that misses lazyxla's
    in-memory cache (`UncachedCompile`) then counts `PersistentCacheHit` when it was read from
    `path` and `PersistentCacheMiss` when XLA compiled it.
    """
    global _cache_path, _cache_readonly
    if _cache_path is not None:
        if _cache_path == path:
            return
        raise RuntimeError(f"the compilation cache is already initialized at {_cache_path!r}")
    if len(graph.CACHE):
        raise RuntimeError(
            "Computation cache must be initialized before any computations run: call "
            "initialize_cache() at the start of the program"
        )
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    # Readonly: no compile is ever "slow enough" to be written; lookups still read the cache.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1e30 if readonly else 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.monitoring.register_event_listener(_count_persistent)
    _cache_path = path
    _cache_readonly = readonly
