"""torch_xla's `torch_xla.core.xla_model` (`xm`).

A process alone is one replica (world size 1, ordinal 0), and the collectives have their
one-replica meaning: a reduction over one replica is the input (times `scale`), a gather or
scatter over one shard is the input, and a permutation either keeps the value (pair `(0, 0)`) or,
as XLA's collective-permute does for a device nobody sends to, gives zeros. Processes started
together (`torch_xla.launch`, torchrun) are the replicas of one job, and the collectives cross
them (Note [Cross-process collectives] in collectives.py); inside an SPMD manual region they run
over mesh axes (manual.py). The collectives are in replica_collectives.py, served here as
`xm.<name>`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import torch

from . import (
    analysis,
    api,
    collectives,
    distributed,
    eager,
    graph,
    metrics,
    random_state,
    runtime,
    runtime_api,
    step_closures,
)
from .ir import Node, Ref, device_data
from .py_utils import DataWrapper

# xm's collectives live in their own module; `xm.<name>` serves them as before
from .replica_collectives import REDUCE_AND as REDUCE_AND
from .replica_collectives import REDUCE_MAX as REDUCE_MAX
from .replica_collectives import REDUCE_MIN as REDUCE_MIN
from .replica_collectives import REDUCE_MUL as REDUCE_MUL
from .replica_collectives import REDUCE_OR as REDUCE_OR
from .replica_collectives import REDUCE_SUM as REDUCE_SUM
from .replica_collectives import _check_groups as _check_groups
from .replica_collectives import all_gather as all_gather
from .replica_collectives import all_gather_bucketized as all_gather_bucketized
from .replica_collectives import all_reduce as all_reduce
from .replica_collectives import all_to_all as all_to_all
from .replica_collectives import collective_broadcast as collective_broadcast
from .replica_collectives import collective_permute as collective_permute
from .replica_collectives import recv as recv
from .replica_collectives import reduce_scatter as reduce_scatter
from .replica_collectives import reduce_scatter_bucketized as reduce_scatter_bucketized
from .replica_collectives import send as send
from .tensor import DEVICE_TYPE, is_lazy, new_tensor, read, state, write

# --- devices and ordinals ------------------------------------------------------------------------


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    """The lazyxla device (torch_xla's deprecated spelling of `torch_xla.device()`)."""
    del devkind
    return api.device(n)


def _real_device(device: torch.device | str) -> str:
    d = torch.device(device) if isinstance(device, str) and ":" in device else device
    if isinstance(d, str):
        d = torch.device(d, 0)
    if d.type != DEVICE_TYPE:
        raise ValueError(f"{device} is not a lazyxla device (expected {DEVICE_TYPE}:N)")
    reals = api.real_devices()
    index = d.index or 0
    if index >= len(reals):
        raise ValueError(f"{device} does not exist; the devices are {api.devices()}")
    return reals[index]


def xla_device_hw(device: torch.device | str) -> str:
    """The hardware type behind `device`: `CPU`, `CUDA` or `TPU`."""
    return _real_device(device).split(":")[0]


def xla_real_devices(devices: Sequence[torch.device | str] | None = None) -> list[str]:
    """The runtime devices (`CPU:0`) behind `devices` (all devices if None)."""
    if devices is None:
        return api.real_devices()
    return [_real_device(d) for d in devices]


def xla_replication_devices(local_devices: Sequence[torch.device | str] | None = None) -> list[str]:
    """The runtime devices a computation over `local_devices` replicates on (torch_xla's): every
    device of their one kind, which they must all be."""
    local = list(local_devices) if local_devices is not None else api.devices()
    real = xla_real_devices(local)
    kinds = {r.split(":")[0] for r in real}
    if len(kinds) != 1:
        raise RuntimeError(
            f"Cannot replicate across different device types: devices={local}/{real}"
        )
    kind = kinds.pop()
    of_kind = [d for d in api.real_devices() if d.split(":")[0] == kind]
    if len(of_kind) != len(local) and not runtime_api.spmd_mode():
        raise RuntimeError(
            f"Cannot replicate if number of devices ({len(local)}) is different from {len(of_kind)}"
        )
    return of_kind


def _replica() -> Any:
    """(replicas, index) on a DataParallel replica thread, else None (Note [DataParallel
    replicas])."""
    from . import data_parallel

    return data_parallel.current()


def get_ordinal() -> int:
    """This process's global ordinal (on a DataParallel replica thread: the replica's index)."""
    replica = _replica()
    return replica[1] if replica is not None else runtime_api.global_ordinal()


def get_local_ordinal() -> int:
    """This process's ordinal on its host (on a DataParallel replica thread: the replica's)."""
    replica = _replica()
    return replica[1] if replica is not None else runtime_api.local_ordinal()


def is_master_ordinal(local: bool = True) -> bool:
    """True on the process that should log and save (always, for one process)."""
    return (get_local_ordinal() if local else get_ordinal()) == 0


def xrt_world_size() -> int:
    """The number of replicas (torch_xla's old name for `runtime.world_size()`; on a
    DataParallel replica thread, the number of replicas of that call)."""
    replica = _replica()
    return replica[0].count if replica is not None else runtime_api.world_size()


def master_print(*args: Any, fd: Any = None, local: bool = False, flush: bool = False) -> None:
    """`print` (to `fd`, default stdout) on the master ordinal only."""
    if is_master_ordinal(local=local):
        print(*args, file=sys.stdout if fd is None else fd, flush=flush)


def is_xla_tensor(tensor: torch.Tensor) -> bool:
    """True if `tensor` lives on a lazyxla device."""
    return is_lazy(tensor)


# --- steps ---------------------------------------------------------------------------------------


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    """Run the pending graph, then the step closures (torch_xla's spelling of `sync`; see
    `lazyxla.sync` for `reset_scope`)."""
    api.sync(wait=wait, reset_scope=reset_scope)


analysis.ENTRY_POINTS.add(mark_step.__code__)


def wait_device_ops(devices: Sequence[Any] = ()) -> None:
    """Block until every executed computation has finished and its results are ready."""
    del devices
    jax.block_until_ready(graph.live_device_arrays())
    metrics.wait_for_samples()  # ExecuteTime samples still being timed (Note [ExecuteTime])
    step_closures.wait_async()


def add_step_closure(
    closure: Callable[..., Any], args: Sequence[Any] = (), run_async: bool = False
) -> None:
    """Run `closure(*args)` after the next `mark_step` / `sync`, once the step has executed.

    Reading tensors in a closure (`loss.item()`) does not split the step's graph: by then they hold
    device data. With `run_async=True` the closure runs on a background thread.
    """
    step_closures.add(closure, args, run_async)


def _gradients(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [
        p.grad
        for group in optimizer.param_groups
        for p in group["params"]
        if p.grad is not None and is_lazy(p.grad)
    ]


def _fetch_gradients(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """torch_xla's private helper its tests use: each parameter's gradient (`.data`, so an
    in-place change to it is not recorded by autograd), in param-group order."""
    return [
        p.grad.data
        for group in optimizer.param_groups
        for p in group["params"]
        if isinstance(p, torch.Tensor) and p.grad is not None
    ]


def reduce_gradients(
    optimizer: torch.optim.Optimizer, groups: Any = None, pin_layout: bool = True
) -> None:
    """Average the gradients of `optimizer`'s parameters over the replicas (in place).

    With one replica there is nothing to do. Over several processes it records one all-reduce of
    every gradient (scaled by 1/world size) into the step's graph. `pin_layout`: torch_xla pins
    the all-reduce operands' layouts so every replica's program agrees; here every graph input and
    output already has XLA's default layout (JAX pins them), so True is what happens, and False
    (let XLA choose) is a hint left unused; anything but a bool is refused.
    """
    if not isinstance(pin_layout, bool):
        raise TypeError(f"reduce_gradients(pin_layout=...) takes a bool, got {pin_layout!r}")
    from . import data_parallel

    replica = data_parallel.current()
    if replica is not None:  # a DataParallel replica thread (Note [DataParallel replicas])
        grads = _gradients(optimizer)
        group = data_parallel._group_of(groups, replica[0].count, replica[1])
        all_reduce(REDUCE_SUM, grads, scale=1.0 / len(group), groups=groups)
        return
    count = runtime_api.world_size()
    if count <= 1 or not collectives.active():
        _check_groups(groups, "reduce_gradients")
        return
    grads = _gradients(optimizer)
    if grads:
        g = collectives.check_groups(groups, "reduce_gradients")
        scale = 1.0 / (count if g is None else len(g[0]))
        all_reduce(REDUCE_SUM, grads, scale=scale, groups=groups)


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    barrier: bool = False,
    optimizer_args: dict[str, Any] | None = None,
    groups: Any = None,
    pin_layout: bool = True,
) -> Any:
    """`reduce_gradients(optimizer)`, then `optimizer.step(**optimizer_args)`.

    Args:
        optimizer: the optimizer to step.
        barrier: also `mark_step()` afterwards (for loops that do not use a device loader).
        optimizer_args: keyword arguments of `optimizer.step`.
        groups: replica groups of the gradient all-reduce (None: all replicas).
        pin_layout: see `reduce_gradients`.

    Returns:
        What `optimizer.step` returned.
    """
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    loss = optimizer.step(**(optimizer_args or {}))
    if barrier:
        mark_step()
    return loss


def rendezvous(tag: str, payload: bytes = b"", replicas: Sequence[int] = ()) -> list[bytes]:
    """Wait for every process (or `replicas`) at `tag`; returns all their payloads, in order."""
    return distributed.rendezvous(tag, payload, replicas)


def mesh_reduce(tag: str, data: Any, reduce_fn: Callable[[list[Any]], Any]) -> Any:
    """`reduce_fn` over every process's `data` (lazy tensors in it are moved to the CPU first),
    outside the graph: no compile, for metrics such as an epoch's accuracy."""
    return distributed.mesh_reduce(tag, _to_cpu(data), reduce_fn)


def get_xla_supported_devices(devkind: str | None = None, max_devices: int | None = None) -> list:
    """This process's devices, as torch_xla names them (`jax:0`, ...)."""
    del devkind
    devs = [str(d) for d in api.devices()[: runtime_api.addressable_device_count()]]
    return devs[:max_devices] if max_devices else devs


# --- data movement -------------------------------------------------------------------------------


def _map_tensors(data: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*[_map_tensors(x, fn) for x in data])
    if isinstance(data, (list, tuple)):
        return type(data)(_map_tensors(x, fn) for x in data)
    if isinstance(data, dict):
        return type(data)((k, _map_tensors(v, fn)) for k, v in data.items())
    if isinstance(data, DataWrapper):  # torch_xla's xu.DataWrapper: rebuilt from its tensors
        return data.from_tensors([_map_tensors(t, fn) for t in data.get_tensors()])
    return data


def _to_cpu(data: Any) -> Any:
    lazy = []
    _map_tensors(data, lambda t: lazy.append(t) if is_lazy(t) else None)
    if lazy:  # one graph for everything that is pending, not one per tensor
        graph.sync_states([state(t) for t in lazy])
    return _map_tensors(data, lambda t: t.cpu() if is_lazy(t) else t)


def save(
    data: Any, file_or_path: Any, master_only: bool = True, global_master: bool = False
) -> None:
    """`torch.save` of `data` with its lazy tensors moved to the CPU first (on the master only)."""
    cpu_data = _to_cpu(data)
    if not master_only or is_master_ordinal(local=not global_master):
        torch.save(cpu_data, file_or_path)
    if distributed.process_count() > 1:
        rendezvous("torch_xla.core.xla_model.save")  # the file is complete when anyone returns


def upload(t: torch.Tensor) -> jax.Array:
    """The device copy of CPU tensor `t` (thread-safe: makes no IR)."""
    return runtime.host_to_device(t)


def wrap_uploaded(arr: jax.Array, t: torch.Tensor) -> torch.Tensor:
    """A lazy tensor holding `arr`, the device copy of CPU tensor `t` (main thread only)."""
    from .ir import TensorSpec

    spec = TensorSpec(tuple(t.shape), t.dtype)
    out = new_tensor((device_data(arr, spec), 0), spec)
    return out.requires_grad_(t.requires_grad) if t.requires_grad else out


def check_view_sharing(obj: Any) -> None:
    """Raise `RuntimeError` if two different tensors inside `obj` (any nesting, as
    `utils.for_each_instance` walks it) share storage: views of one another, which `save` and
    `xser.save` would write as separate copies. One tensor reached twice is fine. Lazy tensors
    compare by their storage's address (Note [Fake data pointers]), CPU tensors by theirs."""
    from .py_utils import for_each_instance

    seen: set[tuple[str, int]] = set()
    owners: dict[int, torch.Tensor] = {}

    def info(t: torch.Tensor) -> str:
        return f"{t.dtype}{list(t.size())}"

    def tensor_id(t: torch.Tensor) -> tuple[str, int]:
        return ("xla", state(t).seq + 1) if is_lazy(t) else ("torch", id(t))

    def check(t: torch.Tensor) -> None:
        tid = tensor_id(t)
        if tid in seen:
            return
        seen.add(tid)
        address = t.untyped_storage().data_ptr()
        if not address:
            return
        other = owners.get(address)
        if other is not None:
            raise RuntimeError(
                f"Tensor ID {tid} ({info(t)}) is sharing a view with tensor ID "
                f"{tensor_id(other)} ({info(other)}); save a copy (.clone()) of one of them, or "
                "save the base and recreate the view after loading"
            )
        owners[address] = t

    for_each_instance(obj, lambda v: type(v) is torch.Tensor, check)


def send_cpu_data_to_device(
    datas: Any, device: torch.device | str, input_sharding: Any = None
) -> Any:
    """Copy every CPU tensor in a nested structure to `device`.

    As in torch_xla, a bare tensor comes back as a one-element list. `input_sharding` (an SPMD
    `ShardingSpec`) shards each tensor whose rank it fits; in SPMD mode the others are annotated
    replicated, as torch_xla's SPMD uploads are.
    """
    from .sharding import upload_batch_tensor

    if isinstance(datas, torch.Tensor):
        datas = [datas]
    return _map_tensors(
        datas,
        lambda t: upload_batch_tensor(t, input_sharding, device) if t.device.type == "cpu" else t,
    )


class RateTracker:
    """Samples per second, smoothed between calls to `rate()` (torch_xla's `xm.RateTracker`)."""

    def __init__(self, smooth_factor: float | None = None) -> None:
        self._smooth_factor = 0.4 if smooth_factor is None else smooth_factor
        self._start_time = time.time()
        self._partial_time = self._start_time
        self._partial_count = 0.0
        self._partial_rate: float | None = None
        self._count = 0.0

    def _update(self, now: float, rate: float) -> None:
        self._partial_count += self._count
        self._count = 0.0
        self._partial_time = now
        self._partial_rate = rate

    def add(self, count: float) -> None:
        self._count += count

    def _smooth(self, current_rate: float) -> float:
        if self._partial_rate is None:
            return current_rate
        return (1 - self._smooth_factor) * current_rate + self._smooth_factor * self._partial_rate

    def rate(self) -> float:
        """The rate since the last `rate()` call, smoothed with the previous one."""
        now = time.time()
        delta = now - self._partial_time
        report_rate = 0.0
        if delta > 0:
            report_rate = self._smooth(self._count / delta)
            self._update(now, report_rate)
        return report_rate

    def global_rate(self) -> float:
        """The rate since the tracker was created."""
        delta = time.time() - self._start_time
        count = self._partial_count + self._count
        return count / delta if delta > 0 else 0.0


# --- RNG -----------------------------------------------------------------------------------------

_SEED_BITS = 48  # random_state keeps 48-bit seeds; the counter goes above them


def get_rng_state(device: Any = None) -> int:
    """The device RNG state as one integer; `set_rng_state` of it replays the same numbers.

    Right after `set_rng_state(s)` (or `manual_seed(s)`) it is `s`, as in torch_xla.
    """
    del device
    seed, counter = random_state.get_state()
    return seed | (counter << _SEED_BITS)


def set_rng_state(seed: int, device: Any = None) -> None:
    """Restore a state from `get_rng_state`, or seed the device RNG with a plain seed."""
    del device
    seed = int(seed)
    random_state.set_state(seed & ((1 << _SEED_BITS) - 1), seed >> _SEED_BITS)


@contextlib.contextmanager
def fork_rng(device: Any = None, enabled: bool = True) -> Iterator[None]:
    """Inside the block draw from the device RNG freely; on exit its state is what it was."""
    if not enabled:
        yield
        return
    saved = get_rng_state(device)
    try:
        yield
    finally:
        set_rng_state(saved, device)


# --- memory, barriers, materialisation -----------------------------------------------------------


def get_memory_info(device: Any = None) -> dict[str, int]:
    """`{'bytes_used', 'bytes_limit', 'peak_bytes_used'}` of `device`'s memory.

    From the runtime's allocator statistics where it keeps them (GPU, TPU); on the CPU, from the
    live device buffers and the host's physical memory.
    """
    index = 0 if device is None else (torch.device(device).index or 0)
    dev = runtime.jax_devices()[index]
    stats = dev.memory_stats() or {}
    if "bytes_in_use" in stats:
        used = int(stats["bytes_in_use"])
        limit = int(stats.get("bytes_limit", 0))
        peak = int(stats.get("peak_bytes_in_use", used))
        return {"bytes_used": used, "bytes_limit": limit, "peak_bytes_used": peak}
    used = sum(a.nbytes for a in jax.live_arrays() if dev in a.devices())
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"bytes_used": int(used), "bytes_limit": int(limit), "peak_bytes_used": int(used)}


def _barrier_rule(*xs: jax.Array) -> tuple[jax.Array, ...]:
    return tuple(jax.lax.optimization_barrier(xs))


def optimization_barrier_(tensors: Sequence[torch.Tensor]) -> None:
    """Put `tensors` behind one XLA optimization barrier, in place.

    XLA does not move computation across the barrier: nothing computed from the outputs is fused
    with or hoisted above what computed the inputs (used, e.g., to keep gradient checkpointing's
    recomputation from being merged back with the forward pass).
    """
    tensors = list(tensors)
    if not tensors:
        return
    states = [state(t) for t in tensors]
    values = tuple(read(s) for s in states)
    specs = tuple(v[0].specs[v[1]] for v in values)
    node = Node(
        "xla::optimization_barrier",
        _barrier_rule,
        values,
        tuple(Ref(i) for i in range(len(values))),
        (),
        specs,
    )
    for i, s in enumerate(states):
        write(s, (node, i))
    eager.ran_outside_dispatch(tensors)


def unlazy(tensors: Sequence[torch.Tensor]) -> None:
    """Execute the pending graph of `tensors` only, and wait for it."""
    graph.sync_states([state(t) for t in tensors], wait=True)


def _lowered(tensors: Sequence[torch.Tensor] | None) -> jax.stages.Lowered:
    if tensors is None:  # "the whole computation graph": every pending live tensor
        states = graph.pending_states(None)
    else:
        states = [state(t) for t in tensors]
        for s in states:
            read(s)
    cap = graph.Capture(states)
    return jax.jit(cap.program().function()).lower(cap.data, cap.scalars)


def get_stablehlo(tensors: Sequence[torch.Tensor] | None = None) -> str:
    """The StableHLO text of the graph computing `tensors` (every pending tensor if None), with
    source locations (`#loc` lines) when XLA_HLO_DEBUG or XLA_IR_DEBUG is set, as torch_xla's."""
    debug = any(
        os.environ.get(v, "0").lower() in ("1", "true") for v in ("XLA_HLO_DEBUG", "XLA_IR_DEBUG")
    )
    return _lowered(tensors).as_text(debug_info=debug)


def get_stablehlo_bytecode(tensors: Sequence[torch.Tensor] | None = None) -> bytes:
    """The StableHLO of the graph computing `tensors`, as MLIR bytecode."""
    from jax._src.interpreters import mlir

    return mlir.module_to_bytecode(_lowered(tensors).compiler_ir("stablehlo"))


def broadcast_master_param(model: torch.nn.Module) -> None:
    """Overwrite every replica's parameters and buffers with the master's (ordinal 0), then
    run the step (torch_xla's `xm.broadcast_master_param`)."""
    collective_broadcast([*model.parameters(), *model.buffers()])
    mark_step()
