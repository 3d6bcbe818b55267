"""SPMD: torch_xla's Mesh / partition specs, lowered to JAX `NamedSharding`s over a jax `Mesh`.

# Note [Sharding]
A torch_xla `Mesh(device_ids, mesh_shape, axis_names)` becomes a jax `Mesh` over the same devices in
the same order; a partition spec (ints, axis names, tuples of them, None) becomes a `PartitionSpec`
of axis names, hence a `NamedSharding`. `mark_sharding` records the annotation on the tensor's
storage state and
- for device data, reshards the array now (`jax.device_put`), so the sharding is part of the data
  leaf's descriptor and therefore of the graph key (see Note [Graph hashing]); data still on the
  host (SPMD's virtual device, Note [SPMD virtual device] in tensor.py) is uploaded straight into
  its shards;
- for a pending value, records an `xla::mark_sharding` node lowered to `with_sharding_constraint`.
A sync constrains every annotated root to its sharding, so parameters keep their sharding step after
step; XLA's partitioner (Shardy/GSPMD) propagates everything else. torch_xla's V1 sharding strings
(`{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}`) are produced only for display, from the
HloSharding of the NamedSharding with tile positions mapped through the mesh's device order.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import torch
from jax._src.sharding_impls import GSPMDSharding
from jax.sharding import NamedSharding, PartitionSpec

from . import metrics, runtime
from .ir import Ref, TensorSpec, device_data
from .tensor import DEVICE_TYPE, HostState, new_tensor, read, state, write


class ShardingType(enum.IntEnum):
    """torch_xla's sharding types (values match `torch_xla._XLAC.OpSharding`)."""

    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6


_spmd = False


def use_spmd(auto: bool = False) -> None:
    """Enter SPMD mode: device data is replicated over all devices (torch_xla's virtual device;
    a CPU tensor moved to the device from then on waits on the host until it is sharded or used,
    Note [SPMD virtual device]).

    Data already on the device moves now, once, so one graph never mixes device sets. Work
    still pending runs first, on the one device it was recorded for: its graphs read the
    single-device data, and a later graph joining them with sharded data could not run.
    """
    global _spmd
    os.environ["XLA_USE_SPMD"] = "1"  # what torch_xla's `is_spmd()` reads (runtime_api)
    if _spmd:
        return
    from . import analysis, graph

    graph.sync_states(None, wait=True, cause=analysis.ENTER_SPMD)
    _spmd = True
    metrics.mode_renames["ExecuteTime"] = "ExecuteReplicatedTime"  # as torch_xla names it
    from .tensor import live_states

    replicated = _all_devices_replicated()
    for s in live_states():
        node = s.value[0]
        if node.op == "xla::device_data" and s.base is None and s.sharding is None:
            if node.data.is_deleted():  # a donated buffer or a placeholder: no data to move
                from .op_builder import made_as_placeholder, placeholder_array

                if not made_as_placeholder(node.data):
                    continue
                arr = placeholder_array(s.spec.shape, s.spec.dtype, replicated)
            else:
                arr = jax.device_put(node.data, replicated)
            s.value = (device_data(arr, s.spec, sharding=sharding_key(replicated, arr.ndim)), 0)
            s.version += 1  # its views re-derive from the moved data when next read


def is_spmd() -> bool:
    return _spmd


def _leave_spmd_for_tests() -> None:
    """Tests only: leave SPMD mode so later tests in the process run single-device."""
    global _spmd
    _spmd = False
    os.environ.pop("XLA_USE_SPMD", None)
    metrics.mode_renames.pop("ExecuteTime", None)


@functools.cache
def _all_devices_replicated() -> Any:
    # Note [Implicit replication]: a GSPMDSharding, not a NamedSharding over a one-axis mesh of
    # all devices. jax's jit gives unconstrained outputs the mesh of the first NamedSharding
    # among the inputs; from a one-axis mesh a 2-D tiling such as [4,2] cannot be expressed and
    # compiling fails (IndivisibleError, a training step with weights sharded over a (4, 2)
    # mesh). Without a NamedSharding here, outputs take the user's mesh.
    return GSPMDSharding.get_replicated(list(runtime.jax_devices()))


def _named(arr: jax.Array) -> jax.Array:
    """`arr` with a NamedSharding (jax reshards to another device order only from one): implicit
    replication over a one-axis mesh of all devices, the same layout, no copy."""
    if not isinstance(arr.sharding, GSPMDSharding) or not arr.sharding.is_fully_replicated:
        return arr
    devs = np.array(list(arr.sharding._device_assignment))
    named = NamedSharding(jax.sharding.Mesh(devs, ("_all",)), PartitionSpec())
    pieces = [sh.data for sh in arr.addressable_shards]
    return jax.make_array_from_single_device_arrays(arr.shape, named, pieces)


# Note [Device order]
# jax.jit needs every argument and sharding constraint of one program on the same device order. A
# mesh over permuted devices (`xs.Mesh([4, 5, 6, 7, 0, 1, 2, 3], ...)`) orders its devices so,
# while implicitly replicated data (uploads) is on all devices in their natural order: a graph
# mixing the two failed to compile ("incompatible devices"). Replicated data is the same in any
# order, so before a graph runs its replicated inputs are re-expressed on the order of the graph's
# sharded inputs or constraints: the same per-device buffers, no copy (GSPMDSharding, as in Note
# [Implicit replication]).


def _order_of(sh: Any) -> tuple | None:
    return None if sh is None or sh.is_fully_replicated else tuple(sh._device_assignment)


def align_device_order(data: list[jax.Array], nodes: list[Any], out_shardings: tuple) -> list:
    """`data` with its replicated arrays on the graph's device order (Note [Device order])."""
    order = next((o for o in (_order_of(a.sharding) for a in data) if o is not None), None)
    if order is None:
        named = [n.args[1] for n in nodes if n.op == "xla::mark_sharding"]
        order = next((o for o in map(_order_of, (*named, *out_shardings)) if o is not None), None)
    if order is None:
        return data
    out = []
    for a in data:
        sh = a.sharding
        if sh.is_fully_replicated and len(sh.device_set) == len(order):
            if tuple(sh._device_assignment) != order:
                placed = GSPMDSharding.get_replicated(list(order))
                pieces = [x.data for x in a.addressable_shards]
                a = jax.make_array_from_single_device_arrays(a.shape, placed, pieces)
        out.append(a)
    return out


def upload_placement() -> NamedSharding | None:
    """Where an upload goes (Note [Host and device transfer]): the default device, or in SPMD mode
    every device, replicated."""
    return _all_devices_replicated() if _spmd else None


def output_sharding(arr: jax.Array) -> Any:
    """The descriptor part of an executable's output: its sharding, in SPMD mode."""
    return sharding_key(arr.sharding, arr.ndim) if _spmd else None


def sharding_key(sharding: Any, ndim: int) -> Any:
    """A device-data node's sharding as it enters the graph key: canonical, so equivalent
    shardings (the NamedSharding an input was given, the GSPMDSharding XLA hands back for the
    same layout) are one key and the executable is reused."""
    if sharding is None:
        return None
    return (sharding._to_xla_hlo_sharding(ndim), sharding._device_assignment)


class Mesh:
    """The logical device topology, as torch_xla's `xs.Mesh`.

    Args:
        device_ids: device ids in the order the mesh is filled (C order).
        mesh_shape: the size of each mesh axis.
        axis_names: optional names of the axes.

    Example:
        >>> mesh = Mesh(np.arange(8), (4, 2), ("fsdp", "tensor"))
        >>> mesh.get_logical_mesh()
        array([[0, 1], [2, 3], [4, 5], [6, 7]])
    """

    def __init__(
        self,
        device_ids: np.ndarray | Sequence[int],
        mesh_shape: tuple[int, ...],
        axis_names: tuple[str, ...] | None = None,
    ) -> None:
        device_ids = np.asarray(device_ids)
        mesh_shape = tuple(int(s) for s in mesh_shape)
        if axis_names is not None:
            axis_names = tuple(axis_names)
            if len(mesh_shape) != len(axis_names):
                raise AssertionError(
                    f"Number of axis names ({len(axis_names)}) must match mesh dimensions "
                    f"({len(mesh_shape)}): mesh_shape {mesh_shape}, axis_names {axis_names}"
                )
            if len(set(axis_names)) != len(axis_names):
                raise AssertionError(f"Axis names must be unique, got: {axis_names}")
        if len(device_ids) != np.prod(mesh_shape):
            raise AssertionError(
                f"Number of device IDs ({len(device_ids)}) must match mesh size "
                f"({int(np.prod(mesh_shape))}): {len(device_ids)} device ids cannot fill a mesh of "
                f"shape {mesh_shape}"
            )
        if len(device_ids) != len(np.unique(device_ids)):
            raise AssertionError(f"Device IDs must be unique, got: {device_ids.tolist()}")
        self.device_ids = device_ids
        self.mesh_shape = mesh_shape
        self.axis_names = axis_names
        if not all(0 <= d < self.size() for d in device_ids):
            raise AssertionError(
                f"Device IDs must be less than mesh size ({self.size()}) and not negative, got: "
                f"{device_ids.tolist()}"
            )

    def size(self) -> int:
        return int(np.prod(self.mesh_shape))

    def shape(self) -> OrderedDict:
        names = self.axis_names if self.axis_names is not None else range(len(self.mesh_shape))
        return OrderedDict(zip(names, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        return self.device_ids.reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str) -> int | None:
        if self.axis_names is None or name not in self.axis_names:
            return None
        return self.axis_names.index(name)

    @property
    def jax_axis_names(self) -> tuple[str, ...]:
        return self.axis_names or tuple(f"axis{i}" for i in range(len(self.mesh_shape)))

    @functools.cached_property
    def jax_mesh(self) -> jax.sharding.Mesh:
        devices = runtime.jax_devices()
        if self.size() != len(devices):
            raise AssertionError(f"{self.mesh_shape} is not mappable over {len(devices)} devices.")
        arr = np.array([devices[i] for i in self.device_ids]).reshape(self.mesh_shape)
        return jax.sharding.Mesh(arr, self.jax_axis_names)

    def translate(self, partition_spec: tuple) -> tuple:
        """A partition spec with names resolved to mesh axis indices (torch_xla's checks)."""
        out: list[Any] = []
        for p in partition_spec:
            if type(p) is tuple:
                if any(type(x) is tuple for x in p):
                    raise ValueError("Partition spec cannot contain nested tuples")
                out.append(self.translate(p))
            elif p is None or type(p) is int:
                out.append(p)
            elif type(p) is str:
                idx = self.get_axis_name_idx(p)
                if idx is None:
                    raise ValueError(f"Axis name {p} is not defined in the given mesh")
                out.append(idx)
            else:
                raise ValueError(f"Spec type {type(p)} is not supported in partition spec")
        flat = [d for p in out for d in (p if type(p) is tuple else (p,)) if d is not None]
        if not all(0 <= d < len(self.mesh_shape) for d in flat):
            raise ValueError(
                f"partition_spec ({tuple(out)}) contains out of bound index into mesh_shape."
            )
        if len(flat) != len(set(flat)):
            raise ValueError(
                "Each device mesh dimension should appear at most once in partition_spec "
                f"{tuple(out)}."
            )
        return tuple(out)

    def named_sharding(self, partition_spec: tuple) -> NamedSharding:
        """The jax sharding of `partition_spec` over this mesh, made once per spec and mesh
        object, as torch_xla caches its OpShardings (a new one counts `CreateOpSharding`)."""
        spec = self.translate(partition_spec)
        cache = self.__dict__.setdefault("_op_shardings", {})
        named = cache.get(spec)
        if named is None:
            metrics.counter_inc("CreateOpSharding")
            named = cache[spec] = self._make_named(spec)
        return named

    def _make_named(self, spec: tuple) -> NamedSharding:
        names = self.jax_axis_names

        def name(p: Any) -> Any:
            if p is None:
                return None
            if type(p) is tuple:
                return tuple(names[i] for i in p)
            return names[p]

        return NamedSharding(self.jax_mesh, PartitionSpec(*[name(p) for p in spec]))

    def get_op_sharding(self, partition_spec: tuple) -> str:
        """The sharding as torch_xla's OpSharding string (`{devices=[4,2]0,1,...}`)."""
        return hlo_string(self.named_sharding(partition_spec), len(partition_spec))

    def __repr__(self) -> str:
        return f"Mesh(shape={dict(self.shape())}, devices={self.device_ids.tolist()})"


_global_mesh: Mesh | None = None


def set_global_mesh(mesh: Mesh) -> None:
    global _global_mesh
    _global_mesh = mesh


def get_global_mesh() -> Mesh | None:
    return _global_mesh


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    n = len(runtime.jax_devices())
    return Mesh(np.arange(n), (n,), None if axis_name is None else (axis_name,))


# --- display -------------------------------------------------------------------------------------


def _mesh_device_ids(sharding: NamedSharding) -> list[int]:
    return [d.id for d in sharding.mesh.devices.flat]


def hlo_string(sharding: Any, ndim: int) -> str:
    """torch_xla's V1 OpSharding text for a jax sharding of a rank-`ndim` array."""
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return ""
    hlo = sharding._to_xla_hlo_sharding(ndim)
    if hlo.is_manual():
        return "{manual}"
    if hlo.is_replicated():
        return "{replicated}"
    if hlo.is_maximal():
        return f"{{maximal device={hlo.tile_assignment_devices()[0]}}}"
    dims = hlo.tile_assignment_dimensions()
    positions = hlo.tile_assignment_devices()
    ids = _mesh_device_ids(sharding) if isinstance(sharding, NamedSharding) else None
    devs = [ids[p] for p in positions] if ids is not None else list(positions)
    if hlo.replicate_on_last_tile_dim():
        # The devices of one replication group (the last tile dim) hold the same tile: torch_xla
        # prints each group sorted (its OpSharding is built from the mesh's groups, in id order).
        g = dims[-1]
        devs = [d for i in range(0, len(devs), g) for d in sorted(devs[i : i + g])]
    text = "{devices=[" + ",".join(map(str, dims)) + "]" + ",".join(map(str, devs))
    if hlo.replicate_on_last_tile_dim():
        text += " last_tile_dim_replicate"
    return text + "}"


def _sharding_of(t: torch.Tensor) -> Any:
    s = state(t)
    if s.sharding is MANUAL:
        return None
    if s.sharding is not None:
        return s.sharding.named
    if type(s) is HostState:  # on the host: no sharding yet (Note [SPMD virtual device])
        return None
    node = read(s)[0]
    data = node.data if node.op == "xla::device_data" else None
    return getattr(data, "sharding", None)


MANUAL = "manual"  # state.sharding of a manual region's local shard (see Note [Manual sharding])


def sharding_spec(t: torch.Tensor) -> str:
    """The tensor's sharding as torch_xla prints it; '' when it has none (single device)."""
    if state(unwrap(t)).sharding is MANUAL:
        return "{manual}"
    sh = _sharding_of(unwrap(t))
    if sh is None:
        return ""
    if state(unwrap(t)).sharding is None:
        # As torch_xla: data uploaded unannotated has no sharding (SPMD mode's implicit
        # replication is not one), but what an SPMD execution returns carries the sharding XLA
        # gave it, `{replicated}` included (on one device too).
        if sh is _all_devices_replicated():
            return ""
        if _spmd and isinstance(sh, jax.sharding.SingleDeviceSharding):
            return "{replicated}"
    return hlo_string(sh, t.dim())


def sharding_type(t: torch.Tensor) -> ShardingType | None:
    spec = sharding_spec(t)
    if not spec:
        return None
    if spec == "{replicated}":
        return ShardingType.REPLICATED
    if spec == "{manual}":
        return ShardingType.MANUAL
    if "last_tile_dim_replicate" in spec:
        return ShardingType.PARTIAL
    return ShardingType.TILED


# --- annotation ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ShardingAnnotation:
    mesh: Mesh
    partition_spec: tuple
    named: NamedSharding


def _constraint_rule(x: Any, sharding: NamedSharding) -> Any:
    return jax.lax.with_sharding_constraint(x, sharding)


def _validate(t: torch.Tensor, mesh: Mesh, partition_spec: tuple) -> NamedSharding:
    n = len(runtime.jax_devices())
    if mesh.size() != n:
        raise AssertionError(f"{mesh.mesh_shape} is not mappable over {n} devices.")
    if len(t.shape) != len(partition_spec):
        raise AssertionError(
            f"Partition spec length ({len(partition_spec)}) should be equal to the input rank "
            f"({len(t.shape)})."
        )
    return mesh.named_sharding(tuple(partition_spec))


def _divides(named: NamedSharding, shape: tuple[int, ...]) -> bool:
    try:
        named.shard_shape(shape)
    except ValueError:
        return False
    return True


def annotate(t: torch.Tensor, ann: ShardingAnnotation | None, named: NamedSharding) -> None:
    """Give `t` the sharding `named` (data is resharded now, pending values get a constraint)."""
    s = state(t)
    spec = s.spec
    if type(s) is HostState and _divides(named, spec.shape):
        # Still on the host: uploaded straight into its shards (Note [SPMD virtual device]).
        metrics.counter_inc("VirtualDeviceUsage")
        from .transfer import resolve_host

        resolve_host(s, named)
        s.sharding = ann
        return
    node, k = read(s)
    if node.op == "xla::device_data" and s.base is None and _divides(named, spec.shape):
        from .op_builder import made_as_placeholder, placeholder_array

        if made_as_placeholder(node.data):  # no data to move (Note [Placeholder tensors])
            arr = placeholder_array(spec.shape, spec.dtype, named)
        else:
            with metrics.timed("TransferToDeviceTime"):
                arr = jax.device_put(_named(node.data), named)
        s.ir_data = device_data(arr, spec, sharding=sharding_key(named, arr.ndim))
        s.value = (s.ir_data, 0)
    else:
        # A pending value, or an uneven split (jax arrays hold only even shardings; XLA pads
        # inside the graph): the annotation becomes a sharding constraint in the graph.
        from .dispatch import emit

        write(s, emit("xla::mark_sharding", _constraint_rule, ((node, k),), (Ref(0), named), spec))
    s.sharding = ann


def clone_keeps_sharding(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """`clone`'s kernel, whose result keeps its input's sharding annotation, as torch_xla's clone
    (and so `copy.deepcopy`) keeps the sharding spec."""

    def clone(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = kernel(x, *args, **kwargs)
        ann = state(x).sharding
        if isinstance(ann, ShardingAnnotation):
            annotate(out, ann, ann.named)
        return out

    return clone


def mark_sharding(t: torch.Tensor, mesh: Mesh, partition_spec: tuple) -> XLAShardedTensor:
    """Annotate `t` (in place) with `partition_spec` over `mesh`; returns it as XLAShardedTensor.

    Args:
        t: a lazyxla tensor (or XLAShardedTensor).
        mesh: the device mesh.
        partition_spec: one entry per tensor dim: a mesh axis index or name, a tuple of them (the
            dim is split over several mesh axes), or None (replicated along that dim).

    Example:
        >>> xs.mark_sharding(linear.weight, mesh, ("tensor", "fsdp"))
    """
    t = unwrap(t)
    named = _validate(t, mesh, tuple(partition_spec))  # raises before anything changes
    ann = ShardingAnnotation(mesh, mesh.translate(tuple(partition_spec)), named)
    annotate(t, ann, named)
    out = XLAShardedTensor.wrap(t)
    out.mesh_shape, out.partition_spec = mesh.mesh_shape, tuple(partition_spec)
    return out


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Drop `t`'s sharding annotation (its data becomes replicated over the mesh)."""
    t = unwrap(t)
    s = state(t)
    if s.sharding is not None:
        mesh = s.sharding.named.mesh
        whole = _spmd and mesh.devices.size == len(runtime.jax_devices())
        # Over every device: the placement of unannotated uploads, so it shows no sharding.
        annotate(
            t, None, _all_devices_replicated() if whole else NamedSharding(mesh, PartitionSpec())
        )
        s.sharding = None
    return t


@dataclasses.dataclass
class ShardingSpec:
    """A reusable (mesh, partition spec) pair; `minibatch` marks per-host batch shards."""

    mesh: Mesh
    partition_spec: tuple
    minibatch: bool = False

    def __post_init__(self) -> None:
        self.mesh.translate(tuple(self.partition_spec))

    def can_apply(self, t: torch.Tensor) -> bool:
        return len(t.shape) == len(self.partition_spec)

    def apply(self, t: torch.Tensor) -> XLAShardedTensor:
        return mark_sharding(t, self.mesh, self.partition_spec)

    def global_batch(self, t: torch.Tensor, device: Any = None) -> torch.Tensor:
        """`t` sharded by this spec. With several processes and `minibatch=True`, `t` (on the
        CPU) is this process's rows of the batch: the result is a new tensor, the global batch
        of every process's rows (`jax.make_array_from_process_local_data`)."""
        from . import distributed

        if not (self.minibatch and distributed.process_count() > 1):
            if t.device.type == "cpu":
                t = t.to(device)
            self.apply(t)
            return t
        local = t if t.device.type == "cpu" else unwrap(t).cpu()
        part = self.mesh.translate(tuple(self.partition_spec))
        named = self.mesh.named_sharding(part)
        arr = jax.make_array_from_process_local_data(named, runtime.to_numpy(local))
        spec = TensorSpec(tuple(arr.shape), local.dtype)
        out = new_tensor((device_data(arr, spec, sharding=sharding_key(named, arr.ndim)), 0), spec)
        state(out).sharding = ShardingAnnotation(self.mesh, part, named)
        return out


_V1 = re.compile(r"^\{devices=\[([\d,]+)\]([\d,]+)( last_tile_dim_replicate)?\}$")


def parse_v1(text: str) -> tuple[list[int], list[int], int] | None:
    """(tile dims, devices, replication group size) of a torch_xla V1 tiled sharding string such
    as `{devices=[2,1,4]0,...,7 last_tile_dim_replicate}`; None if `text` is not one."""
    m = _V1.fullmatch(text)
    if m is None:
        return None
    dims = [int(d) for d in m.group(1).split(",")]
    devs = [int(d) for d in m.group(2).split(",")]
    return dims[:-1] if m.group(3) else dims, devs, dims[-1] if m.group(3) else 1


def global_tensor_from_cpu_shards(
    shards: Sequence[torch.Tensor], op_sharding: str, global_shape: Sequence[int] | None = None
) -> torch.Tensor:
    """torch_xla's `_XLAC._global_tensor_from_cpu_shards`: the global tensor whose shards (one per
    device, by device id) are `shards` under `op_sharding` (the `Mesh.get_op_sharding` string);
    `global_shape` (default: the shards' union) may cut the last tiles short, as padding."""
    n = len(runtime.jax_devices())
    if len(shards) != n:
        raise RuntimeError(f"expected {n} shards, one per device, got {len(shards)}")
    shape = tuple(shards[0].shape)
    if any(tuple(t.shape) != shape for t in shards):
        raise RuntimeError("all shards must have the same shape")
    if op_sharding == "{replicated}":
        dims, devs = [1] * len(shape), list(range(n))
        groups = 1
    else:
        parsed = parse_v1(op_sharding)
        if parsed is None:
            raise RuntimeError(f"unsupported sharding {op_sharding!r} for shards")
        dims, devs, groups = parsed
        if len(dims) != len(shape):
            raise RuntimeError(f"sharding {op_sharding} does not fit shards of rank {len(shape)}")
    full = tuple(s * d for s, d in zip(shape, dims))
    want = full if global_shape is None else tuple(global_shape)
    # torch_xla's check: the shard shape of `want` under the sharding is the shards' shape
    bad = len(want) != len(full) or any(-(-g // d) != s for g, d, s in zip(want, dims, shape))
    if bad:
        raise RuntimeError(
            f"global shape {list(want)} does not fit shards of shape {list(shape)} under "
            f"{op_sharding} (the shards cover {list(full)})"
        )
    out = torch.empty(full, dtype=shards[0].dtype)
    for pos, dev in enumerate(devs):
        tile = np.unravel_index(pos // groups, dims) if dims else ()
        where = tuple(slice(c * s, (c + 1) * s) for c, s in zip(tile, shape))
        out[where] = shards[dev]
    return out[tuple(slice(0, g) for g in want)].contiguous().to(DEVICE_TYPE)


def upload_batch_tensor(t: torch.Tensor, spec: ShardingSpec | None, device: Any) -> torch.Tensor:
    """One CPU tensor of a batch on `device`, as torch_xla's `send_cpu_data_to_device` puts it:
    sharded by `spec` when the spec fits its rank; otherwise unannotated, or in SPMD mode
    annotated replicated (torch_xla's SPMD uploads carry a `{replicated}` sharding)."""
    if spec is not None and spec.can_apply(t):
        return spec.global_batch(t, device)
    out = t.to(device)
    if _spmd:
        mark_sharding(out, get_1d_mesh(), (None,) * out.dim())
    return out


def spec_of(t: torch.Tensor) -> TensorSpec:
    return state(t).spec


# Note [Sharding inside traced functions]
# `mark_sharding_with_gradients` goes through the custom op `lazyxla::aot_mark_sharding`
# (torch_xla's `xla::aot_mark_sharding`), so AOTAutograd (a scan body, `scan_layers`) can trace
# it on fake tensors: the op stays in the FX graph, and when the graph is replayed on lazy tensors
# (the loop body's placeholders) it becomes a sharding constraint inside the loop. Its arguments
# must be strings, so the mesh is named by `mesh_key` (the same mesh gives the same key).
_MESHES: dict[str, Mesh] = {}


def mesh_key(mesh: Mesh) -> str:
    """A string naming `mesh` in a custom op's arguments (custom ops take no Python objects)."""
    key = repr((mesh.device_ids.tolist(), mesh.mesh_shape, mesh.axis_names))
    _MESHES.setdefault(key, mesh)
    return key


def mesh_from_key(key: str) -> Mesh:
    """The mesh `mesh_key` named."""
    return _MESHES[key]


@torch.library.custom_op("lazyxla::aot_mark_sharding", mutates_args=())
def _aot_mark_sharding(t: torch.Tensor, mesh: str, partition_spec: str) -> torch.Tensor:
    import ast

    out = t.clone()
    mark_sharding(out, mesh_from_key(mesh), ast.literal_eval(partition_spec))
    return out


_aot_mark_sharding.register_fake(lambda t, mesh, partition_spec: torch.empty_like(t))


class _ShardWithGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, mesh: Mesh, spec: tuple) -> torch.Tensor:
        ctx.mesh, ctx.spec = mesh, spec
        return _aot_mark_sharding(t, mesh_key(mesh), repr(tuple(spec)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return _aot_mark_sharding(grad, mesh_key(ctx.mesh), repr(tuple(ctx.spec))), None, None


def mark_sharding_with_gradients(
    t: torch.Tensor, mesh: Mesh, partition_spec: tuple
) -> torch.Tensor:
    """`mark_sharding` whose annotation also applies to the gradient in the backward pass.

    Unlike `mark_sharding` this is not in place: use the returned tensor.
    """
    t = unwrap(t)
    _validate(t, mesh, tuple(partition_spec))
    return _ShardWithGradients.apply(t, mesh, tuple(partition_spec))


# Re-exported (at the end: sharded_tensor.py imports the names above; see its docstring)
from .sharded_tensor import XLAShard as XLAShard  # noqa: E402
from .sharded_tensor import XLAShardedTensor as XLAShardedTensor  # noqa: E402
from .sharded_tensor import shard_slices as shard_slices  # noqa: E402
from .sharded_tensor import unwrap as unwrap  # noqa: E402
from .sharded_tensor import wrap_if_sharded as wrap_if_sharded  # noqa: E402
