"""torch_xla's `torch_xla.core.xla_model` (`xm`).

A process alone is one replica (world size 1, ordinal 0), and the collectives have their
one-replica meaning: a reduction over one replica is the input (times `scale`), a gather or
scatter over one shard is the input, and a permutation either keeps the value (pair `(0, 0)`) or,
as XLA's collective-permute does for a device nobody sends to, gives zeros. Processes started
together (`torch_xla.launch`, torchrun) are the replicas of one job, and the collectives cross
them (Note [Cross-process collectives] in collectives.py); inside an SPMD manual region they run
over mesh axes (manual.py).
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
    manual,
    metrics,
    random_state,
    runtime,
    runtime_api,
    step_closures,
)
from .ir import Node, Ref, device_data
from .py_utils import DataWrapper
from .tensor import DEVICE_TYPE, is_lazy, new_tensor, read, state, write

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"
_REDUCE_TYPES = (REDUCE_SUM, REDUCE_MUL, REDUCE_AND, REDUCE_OR, REDUCE_MIN, REDUCE_MAX)


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


def _refuse_in_replica(name: str) -> None:
    if _replica() is not None:
        raise NotImplementedError(
            f"xm.{name} inside a DataParallel replica: lazyxla's thread replicas reduce with "
            "xm.all_reduce / xm.reduce_gradients / xm.optimizer_step only (Note [DataParallel "
            "replicas]); for other collectives run one process per device (torch_xla.launch)"
        )


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


# --- collectives over one replica ----------------------------------------------------------------


def _check_reduce_type(reduce_type: str) -> None:
    if reduce_type not in _REDUCE_TYPES:
        raise ValueError(f"invalid reduce type {reduce_type!r}; expected one of {_REDUCE_TYPES}")


def _check_groups(groups: Any, what: str) -> None:
    if groups:
        members = sorted(r for g in groups for r in g)
        if members != [0]:
            raise ValueError(
                f"{what}: replica groups {groups} name replicas other than 0, but lazyxla runs "
                "one replica"
            )


def _results(
    inputs: torch.Tensor | list[torch.Tensor], out: list[torch.Tensor], no_grad: bool = True
) -> torch.Tensor | list[torch.Tensor]:
    """A reduction's results as `all_reduce` returns them: a new tensor for a tensor, or written
    into the list's tensors (in place) for a list."""
    if isinstance(inputs, torch.Tensor):
        return out[0]
    with torch.no_grad() if no_grad else contextlib.nullcontext():
        for t, o in zip(inputs, out):
            t.copy_(o)
    return inputs


def _scaled(t: torch.Tensor, scale: float) -> torch.Tensor:
    return t * scale if scale != 1.0 else t.clone()


def all_reduce(
    reduce_type: str,
    inputs: torch.Tensor | list[torch.Tensor],
    scale: float = 1.0,
    groups: Any = None,
    pin_layout: bool = True,
) -> torch.Tensor | list[torch.Tensor]:
    """Reduce over replicas, then multiply by `scale`; over one replica, `inputs * scale`.

    A tensor gives a new tensor; a list of tensors is reduced in place and returned.
    """
    del pin_layout
    _check_reduce_type(reduce_type)
    tensors = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    mesh = manual.in_manual_region(tensors)
    if mesh is not None:  # SPMD manual region: a real collective over mesh axes
        out = [manual.all_reduce(t, mesh, reduce_type, scale, groups) for t in tensors]
        return _results(inputs, out, no_grad=False)
    from . import data_parallel

    if data_parallel.current() is not None:  # Note [DataParallel replicas]
        return _results(inputs, data_parallel.all_reduce(reduce_type, tensors, scale, groups))
    if collectives.active() and torch.compiler.is_compiling() and not groups:
        # Under dynamo: torch's functional collective, which it traces into the graph (its
        # lazyxla kernel records the collective when the graph runs), as torch_xla does.
        out = [torch.ops._c10d_functional.all_reduce(t, reduce_type, "") for t in tensors]
        out = [torch.ops._c10d_functional.wait_tensor(o) for o in out]
        out = [o * scale if scale != 1.0 else o for o in out]
        return _results(inputs, out, no_grad=False)
    if collectives.active():  # Note [Cross-process collectives]
        return _results(inputs, collectives.all_reduce(tensors, reduce_type, scale, groups))
    _check_groups(groups, "all_reduce")
    if isinstance(inputs, torch.Tensor):
        return _scaled(inputs, scale)
    if scale != 1.0:
        with torch.no_grad():
            for t in inputs:
                t.mul_(scale)
    return inputs


def all_gather(
    value: torch.Tensor,
    dim: int = 0,
    groups: Any = None,
    output: torch.Tensor | None = None,
    pin_layout: bool = True,
) -> torch.Tensor:
    """Concatenate every replica's `value` along `dim`; over one replica, a copy of `value`."""
    _refuse_in_replica("all_gather")
    del pin_layout
    mesh = manual.in_manual_region([value])
    if mesh is not None:
        result = manual.all_gather(value, mesh, dim, groups)
    elif collectives.active():
        result = collectives.all_gather(value, dim, groups)
    else:
        _check_groups(groups, "all_gather")
        result = torch.cat([value], dim=dim)
    if output is None:
        return result
    _write_out(output, result)
    return output


def _write_out(output: torch.Tensor, result: torch.Tensor) -> None:
    """A collective's `output=` tensor takes the result, as torch_xla's `_out` entry points
    set it: a copy when the shapes agree, else the output becomes the result (its shape too)."""
    with torch.no_grad():
        if output.shape == result.shape:
            output.copy_(result)
        else:
            output.data = result


def reduce_scatter(
    reduce_type: str,
    input: torch.Tensor | list[torch.Tensor],
    scale: float,
    scatter_dim: int,
    shard_count: int,
    groups: Any = None,
    output: torch.Tensor | list[torch.Tensor] | None = None,
    pin_layout: bool = True,
) -> torch.Tensor | list[torch.Tensor]:
    """Reduce over replicas, scale, and keep this replica's shard of `scatter_dim`.

    Over one replica (`shard_count` must be 1) that is `input * scale`.
    """
    _refuse_in_replica("reduce_scatter")
    del pin_layout
    _check_reduce_type(reduce_type)
    single = isinstance(input, torch.Tensor)
    inputs = [input] if single else list(input)
    mesh = manual.in_manual_region(inputs)
    if mesh is not None and single:
        results = [manual.reduce_scatter(input, mesh, reduce_type, scale, scatter_dim, groups)]
    elif collectives.active():
        results = [
            collectives.reduce_scatter(t, reduce_type, scale, scatter_dim, shard_count, groups)
            for t in inputs
        ]
    else:
        _check_groups(groups, "reduce_scatter")
        if shard_count != 1:
            raise ValueError(
                f"reduce_scatter: shard_count={shard_count} must equal the number of replicas (1)"
            )
        results = [_scaled(t, scale) for t in inputs]
    if output is None:
        return results[0] if single else results
    for o, r in zip([output] if single else output, results, strict=True):
        _write_out(o, r)
    return output


def all_gather_bucketized(
    input_list: list[torch.Tensor],
    dim: int = 0,
    groups: Any = None,
    output: list[torch.Tensor] | None = None,
    pin_layout: bool = False,
    bucket_cap_mb: int = 160,
) -> list[torch.Tensor]:
    """`all_gather` of each tensor of `input_list`. torch_xla fills buckets of `bucket_cap_mb`
    to coalesce the collectives; here they are all in the step's graph, where XLA combines them."""
    if pin_layout:
        raise RuntimeError("For xm.all_gather_bucketized, pin_layout=True is not yet supported.")
    results = [all_gather(t, dim, groups) for t in input_list]
    if output is None:
        return results
    for o, r in zip(output, results, strict=True):
        _write_out(o, r)
    return output


def reduce_scatter_bucketized(
    reduce_type: str,
    input_list: torch.Tensor | list[torch.Tensor],
    scale: float,
    scatter_dim: int,
    shard_count: int,
    groups: Any = None,
    output: torch.Tensor | list[torch.Tensor] | None = None,
    pin_layout: bool = False,
    bucket_cap_mb: int = 160,
) -> torch.Tensor | list[torch.Tensor]:
    """`reduce_scatter` of each tensor of `input_list` (buckets: see `all_gather_bucketized`)."""
    if pin_layout:
        raise RuntimeError(
            "For xm.reduce_scatter_bucketized, pin_layout=True is not yet supported."
        )
    return reduce_scatter(reduce_type, input_list, scale, scatter_dim, shard_count, groups, output)


def all_to_all(
    value: torch.Tensor,
    split_dimension: int,
    concat_dimension: int,
    split_count: int,
    groups: Any = None,
    pin_layout: bool = True,
) -> torch.Tensor:
    """Split `value` among replicas and concatenate what each receives; one replica: a copy."""
    _refuse_in_replica("all_to_all")
    del pin_layout
    mesh = manual.in_manual_region([value])
    if mesh is not None:
        return manual.all_to_all(value, mesh, split_dimension, concat_dimension, groups)
    if collectives.active():
        return collectives.all_to_all(value, split_dimension, concat_dimension, split_count, groups)
    _check_groups(groups, "all_to_all")
    if split_count != 1:
        raise ValueError(
            f"all_to_all: split_count={split_count} must equal the number of replicas (1)"
        )
    return value.clone()


def broadcast_master_param(model: torch.nn.Module) -> None:
    """Overwrite every replica's parameters and buffers with the master's (ordinal 0), then
    run the step (torch_xla's `xm.broadcast_master_param`)."""
    collective_broadcast([*model.parameters(), *model.buffers()])
    mark_step()


def collective_broadcast(
    tensors: Sequence[torch.Tensor],
    root_ordinal: int = 0,
    groups: Any = None,
    pin_layout: bool = True,
) -> None:
    """Overwrite `tensors` (in place) on every replica with their values on `root_ordinal`.

    Every replica records the same graph: a multiply by a device-data 1 (root) or 0 (others),
    then a sum over the replicas.
    """
    _refuse_in_replica("collective_broadcast")
    del pin_layout
    if not collectives.active():
        _check_groups(groups, "collective_broadcast")
        if root_ordinal != 0:
            raise ValueError(f"collective_broadcast: root {root_ordinal} is not a replica (0)")
        return
    me = runtime_api.global_ordinal()
    with torch.no_grad():
        for t in tensors:
            keep = torch.tensor(1 if me == root_ordinal else 0, dtype=t.dtype).to(t.device)
            t.mul_(keep)
        all_reduce(REDUCE_SUM, list(tensors), groups=groups)


def send(value: torch.Tensor, channel_id: int) -> torch.Tensor:
    """torch_xla's XLA `Send` by channel id: not available (see the error)."""
    raise NotImplementedError(
        "xm.send/xm.recv pair XLA Send/Recv ops by channel id inside one compiled program; "
        "lazyxla's processes run separate programs. Use torch.distributed.send/recv on the "
        "'xla' process group (dist.init_process_group('xla', init_method='xla://')), or "
        "xm.collective_permute(t, pairs) when every process takes part"
    )


def recv(output: torch.Tensor, channel_id: int) -> torch.Tensor:
    """torch_xla's XLA `Recv` by channel id: not available (see `send`)."""
    return send(output, channel_id)


def collective_permute(value: torch.Tensor, pairs: Sequence[Sequence[int]]) -> torch.Tensor:
    """Send `value` from replica `src` to `dst` for each `[src, dst]` in `pairs`.

    A replica that receives nothing gets zeros, as in XLA. With one replica the only valid pair is
    `[0, 0]`.
    """
    _refuse_in_replica("collective_permute")
    mesh = manual.in_manual_region([value])
    if mesh is not None:
        return manual.collective_permute(value, mesh, pairs)
    if collectives.active():
        return collectives.collective_permute(value, pairs)
    for pair in pairs:
        if any(r != 0 for r in pair):
            raise ValueError(
                f"collective_permute: pair {list(pair)} names a replica other than 0, but lazyxla "
                "runs one replica"
            )
    return value.clone() if pairs else torch.zeros_like(value)
