"""Sharded checkpoints through `torch.distributed.checkpoint` (torch_xla's
`experimental.distributed_checkpoint` planners and helpers)."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
from torch.distributed.checkpoint.default_planner import (
    create_default_global_load_plan,
    create_default_global_save_plan,
    create_default_local_load_plan,
    create_default_local_save_plan,
)
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    TensorProperties,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from . import graph, runtime
from .ir import device_data
from .sharding import (
    ShardingType,
    XLAShard,
    XLAShardedTensor,
    output_sharding,
    shard_slices,
    wrap_if_sharded,
)
from .tensor import state, write

# Note [Distributed checkpoint]
# torch.distributed.checkpoint (DCP) stores each tensor as chunks (offsets and sizes in the global
# tensor) under one metadata file: every process writes the chunks it holds and reads the chunks
# its devices need, whatever mesh or process count wrote them, so a checkpoint saved by 4
# processes loads on 2 with another mesh. lazyxla's planners take a tensor's chunks from its jax
# array: a sharded tensor's chunks are its addressable shards, each written once (the shard of
# replica 0; the other replicas hold the same data), and on load each addressable shard is
# assembled on the host from whichever saved chunks overlap it; once all its chunks are in, the
# tensor's value becomes a new array with the same sharding
# (`jax.make_array_from_single_device_arrays`): no gather, no graph, no compile. Unsharded
# tensors (one device, or replicated) go through DCP's default planning, one write of the whole
# tensor (DCP keeps one copy among the processes), read from the array's first local shard, so
# no process waits on a collective that only the writer runs. The planners sync the state dict's
# pending tensors first, in one graph, on every process (all processes call save/load together).


PATH_ITEM = str | int
OBJ_PATH = tuple[PATH_ITEM, ...]
FLATTEN_MAPPING = dict[str, OBJ_PATH]
STATE_DICT_TYPE = dict[str, Any]


@dataclasses.dataclass
class _CpuShards:
    """A sharded tensor's local shards already copied to the host (`_sharded_cpu_state_dict`)."""

    shards: list[XLAShard]
    global_shape: torch.Size


def _is_lazy(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "jax"


def _is_sharded_tensor(x: Any) -> bool:
    """True if `x` is an XLAShardedTensor whose data is split over devices (not replicated)."""
    return isinstance(x, XLAShardedTensor) and x.sharding_type not in (
        None,
        ShardingType.REPLICATED,
    )


def _unwrap_xla_sharded_tensor(x: Any) -> Any:
    return x.global_tensor if isinstance(x, XLAShardedTensor) else x


# --- nested state dicts --------------------------------------------------------------------------


def _is_leaf(value: Any) -> bool:
    return not isinstance(value, Mapping | list) or not value


def _traverse(state_dict: Mapping, visit: Callable[[OBJ_PATH, Any], None]) -> None:
    """Call `visit(path, value)` for each value of nested dicts and lists that holds tensors;
    a container without tensors or `_CpuShards` anywhere in it is one value (DCP pickles it)."""

    def holds_tensors(value: Any) -> bool:
        if isinstance(value, torch.Tensor | _CpuShards):
            return True
        if isinstance(value, Mapping):
            return any(holds_tensors(v) for v in value.values())
        if isinstance(value, list):
            return any(holds_tensors(v) for v in value)
        return False

    def walk(path: OBJ_PATH, value: Any) -> None:
        if _is_leaf(value) or not holds_tensors(value):
            visit(path, value)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk((*path, str(k)), v)
        else:
            for i, v in enumerate(value):
                walk((*path, i), v)

    for key, value in state_dict.items():
        walk((str(key),), value)


def flatten_state_dict(state_dict: STATE_DICT_TYPE) -> tuple[STATE_DICT_TYPE, FLATTEN_MAPPING]:
    """One level of `"a.b.0"` keys for nested dicts and lists, and the path back to each."""
    flat: STATE_DICT_TYPE = {}
    mappings: FLATTEN_MAPPING = {}

    def add(path: OBJ_PATH, value: Any) -> None:
        key = ".".join(map(str, path))
        if key in flat:
            raise ValueError(f"duplicated flatten key {key}")
        flat[key], mappings[key] = value, path

    _traverse(state_dict, add)
    return flat, mappings


def set_element(root: STATE_DICT_TYPE, path: OBJ_PATH, value: Any) -> None:
    """Set `value` at `path` in nested dicts and lists, creating the containers on the way."""
    container: Any = root
    for key, nxt in zip(path[:-1], path[1:], strict=True):
        fresh: Any = {} if isinstance(nxt, str) else []
        if isinstance(container, Mapping):
            container = container.setdefault(key, fresh)
        else:
            container.extend([None] * (key + 1 - len(container)))
            if container[key] is None:
                container[key] = fresh
            container = container[key]
    if isinstance(path[-1], int):
        container.extend([None] * (path[-1] + 1 - len(container)))
    container[path[-1]] = value


def dedup_tensors(all_plans: list[SavePlan]) -> list[SavePlan]:
    """Each write item once among the processes' plans (DCP's deduplication)."""
    return dedup_save_plans(list(all_plans))


# --- shards --------------------------------------------------------------------------------------


def _sync(values: Any) -> None:
    """Run the pending graph of every lazy tensor among `values` (one graph)."""
    states = [state(_unwrap_xla_sharded_tensor(v)) for v in values if _is_lazy(v)]
    if states:
        graph.sync_states(states)


def _array(t: torch.Tensor) -> jax.Array:
    s = state(_unwrap_xla_sharded_tensor(t))
    node, _ = s.value if s.base is None else (None, None)
    if node is None or node.op != "xla::device_data":
        graph.sync_states([s])
        node = state(_unwrap_xla_sharded_tensor(t)).value[0]
    return node.data


def _slices(index: tuple, shape: tuple[int, ...]) -> list[slice]:
    return [slice(i.start or 0, n if i.stop is None else i.stop, 1) for i, n in zip(index, shape)]


def _local_shards(t: torch.Tensor) -> list[jax.Shard]:
    """This process's shards of `t`'s array, by device id."""
    return sorted(_array(t).addressable_shards, key=lambda sh: sh.device.id)


def _written_shards(t: torch.Tensor) -> list[tuple[int, list[slice]]]:
    """(position among the local shards, indices) of the shards this process writes."""
    shape = tuple(t.shape)
    return [
        (k, _slices(sh.index, shape)) for k, sh in enumerate(_local_shards(t)) if sh.replica_id == 0
    ]


def _host(arr: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    """An array's value on the host from a local copy (never a collective)."""
    if not (arr.is_fully_addressable or arr.is_fully_replicated):
        raise ValueError("a sharded array has no single local copy; read its shards instead")
    return runtime.device_to_host(arr.addressable_shards[0].data, dtype)


def _cpu_shards(t: torch.Tensor) -> _CpuShards:
    shape = tuple(t.shape)
    whole = _array(t).sharding.is_fully_replicated  # torch_xla's replicated shards sit at `...`
    shards = [
        XLAShard(
            runtime.device_to_host(sh.data, t.dtype),
            Ellipsis if whole else _slices(sh.index, shape),
            sh.replica_id,
            f"{sh.device.platform.upper()}:{sh.device.id}",
        )
        for sh in _local_shards(t)
    ]
    return _CpuShards(shards, torch.Size(shape))


def _sharded_cpu_state_dict(state_dict: STATE_DICT_TYPE) -> STATE_DICT_TYPE:
    """`state_dict` on the host: sharded tensors as their local shards (`_CpuShards`), other
    tensors as CPU tensors; the structure is kept (async checkpoints write this copy)."""
    flat, spec = torch.utils._pytree.tree_flatten(state_dict)
    _sync(flat)

    def to_cpu(x: Any) -> Any:
        x = wrap_if_sharded(x)
        if _is_sharded_tensor(x):
            return _cpu_shards(x)
        if _is_lazy(x):
            x = _unwrap_xla_sharded_tensor(x)
            return _host(_array(x), x.dtype)
        return x

    return torch.utils._pytree.tree_unflatten([to_cpu(x) for x in flat], spec)


def _split(state_dict: STATE_DICT_TYPE) -> tuple[FLATTEN_MAPPING, dict, dict]:
    """(mappings, sharded, unsharded) of a flattened, synced state dict."""
    flat, mappings = flatten_state_dict(state_dict)
    _sync(flat.values())
    flat = {k: wrap_if_sharded(v) for k, v in flat.items()}
    sharded = {k: v for k, v in flat.items() if _is_sharded_tensor(v) or isinstance(v, _CpuShards)}
    unsharded = {k: _unwrap_xla_sharded_tensor(v) for k, v in flat.items() if k not in sharded}
    return mappings, sharded, unsharded


def _chunk(indices: list[slice]) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(
        offsets=torch.Size(i.start for i in indices),
        sizes=torch.Size(i.stop - i.start for i in indices),
    )


def _write_item(fqn: str, k: int, indices: list[slice], shape, props) -> WriteItem:
    chunk = _chunk(indices)
    return WriteItem(
        index=MetadataIndex(fqn, chunk.offsets, k),
        type=WriteItemType.SHARD,
        tensor_data=TensorWriteData(chunk=chunk, properties=props, size=torch.Size(shape)),
    )


def _properties(dtype: torch.dtype, requires_grad: bool = False) -> TensorProperties:
    return TensorProperties(dtype=dtype, requires_grad=requires_grad)


def _xla_write_items(sharded: dict) -> list[WriteItem]:
    items = []
    for fqn, v in sharded.items():
        if isinstance(v, _CpuShards):
            props = _properties(v.shards[0].data.dtype)
            shape = v.global_shape
            written = [
                (k, shard_slices(sh.indices, shape))
                for k, sh in enumerate(v.shards)
                if sh.replica_id == 0
            ]
        else:
            props = _properties(v.dtype, v.requires_grad)
            written, shape = _written_shards(v), v.shape
        items.extend(_write_item(fqn, k, idx, shape, props) for k, idx in written)
    return items


def _split_coordinator_arg(storage_meta: Any, is_coordinator: bool) -> tuple[Any, bool]:
    # torch_xla's planners take (state_dict, is_coordinator); DCP now passes storage_meta
    # between them: a bool in that place is torch_xla's positional is_coordinator.
    if isinstance(storage_meta, bool):
        return None, storage_meta
    return storage_meta, is_coordinator


class SPMDSavePlanner(SavePlanner):
    """Plans a checkpoint of a state dict holding sharded lazyxla tensors: each process writes its
    own shards (Note [Distributed checkpoint]). Use with `torch.distributed.checkpoint.save`."""

    def __init__(self) -> None:
        self.is_coordinator = False
        self.mappings: FLATTEN_MAPPING | None = None
        self.sharded_state_dict: dict[str, Any] | None = None
        self.unsharded_state_dict: dict[str, Any] | None = None
        self._local_shards: dict[str, list] = {}

    def set_up_planner(
        self, state_dict: STATE_DICT_TYPE, storage_meta: Any = None, is_coordinator: bool = False
    ) -> None:
        _, self.is_coordinator = _split_coordinator_arg(storage_meta, is_coordinator)
        self.mappings, self.sharded_state_dict, self.unsharded_state_dict = _split(state_dict)

    def create_local_plan(self) -> SavePlan:
        cpu_view = {k: _meta(v) for k, v in self.unsharded_state_dict.items()}
        plan = create_default_local_save_plan(cpu_view, self.is_coordinator)
        plan = dataclasses.replace(plan, planner_data=self.mappings)
        plan.items.extend(_xla_write_items(self.sharded_state_dict))
        return plan

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        all_plans = dedup_tensors(all_plans)
        plans, metadata = create_default_global_save_plan(all_plans, rewrite_index_hints=False)
        merged: dict = {}
        for p in plans:
            merged.update(p.planner_data or {})
        return plans, dataclasses.replace(metadata, planner_data=merged)

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        obj = self.lookup_object(write_item.index)
        return self.transform_object(write_item, obj)

    def lookup_object(self, index: MetadataIndex) -> Any:
        if index.fqn in self.unsharded_state_dict:
            obj = self.unsharded_state_dict[index.fqn]
            return _host(_array(obj), obj.dtype) if _is_lazy(obj) else obj
        v = self.sharded_state_dict[index.fqn]
        if index.fqn not in self._local_shards:
            self._local_shards[index.fqn] = list(
                v.shards if isinstance(v, _CpuShards) else _local_shards(v)
            )
        shard = self._local_shards[index.fqn][index.index]
        if shard is None:
            raise RuntimeError(f"write item {index} was already resolved")
        self._local_shards[index.fqn][index.index] = None  # written once; free the host copy
        if isinstance(shard, XLAShard):
            offset = torch.Size(i.start for i in shard_slices(shard.indices, v.global_shape))
            if offset != index.offset:
                raise RuntimeError(f"write item {index} does not match its shard")
            return shard.unpadded_data
        return runtime.device_to_host(shard.data, v.dtype)

    def transform_object(self, write_item: WriteItem, obj: Any) -> Any:
        if write_item.type == WriteItemType.BYTE_IO:
            buf = io.BytesIO()
            torch.save(obj, buf)
            return buf
        return obj


def _meta(v: Any) -> Any:
    """What DCP's default planning sees of a value: lazy tensors as meta tensors of their shape
    (planning needs only shape and dtype; the data is read when the item is written)."""
    if _is_lazy(v):
        return torch.empty(v.shape, dtype=v.dtype, device="meta", requires_grad=v.requires_grad)
    return v


@dataclasses.dataclass
class _Pending:
    """A lazy tensor being loaded: host buffers of its local shards, and elements still unread."""

    tensor: torch.Tensor
    shards: list[jax.Shard]
    buffers: list[torch.Tensor]
    remaining: int


class SPMDLoadPlanner(LoadPlanner):
    """Loads a checkpoint in place into a state dict of (sharded) lazyxla tensors, each process
    reading the chunks its shards need (Note [Distributed checkpoint]). Use with
    `torch.distributed.checkpoint.load`."""

    def __init__(self) -> None:
        self.metadata: Metadata | None = None
        self.is_coordinator = False
        self.original_state_dict: STATE_DICT_TYPE | None = None
        self.mappings: FLATTEN_MAPPING | None = None
        self.sharded_state_dict: dict[str, Any] | None = None
        self.unsharded_state_dict: dict[str, Any] | None = None
        self._pending: dict[str, _Pending] = {}

    def set_up_planner(
        self,
        state_dict: STATE_DICT_TYPE,
        metadata: Metadata | None = None,
        is_coordinator: bool = False,
    ) -> None:
        self.metadata, self.is_coordinator = metadata, is_coordinator
        self.original_state_dict = state_dict
        self.mappings, self.sharded_state_dict, self.unsharded_state_dict = _split(state_dict)
        for fqn, v in self.sharded_state_dict.items():
            if isinstance(v, _CpuShards):
                raise TypeError(
                    f"{fqn!r}: a checkpoint loads into device tensors, not into _CpuShards "
                    "(pass the model's own state_dict())"
                )

    def _check_shapes(self) -> None:
        flat = {**self.unsharded_state_dict, **self.sharded_state_dict}
        for fqn in self.mappings:  # in the state dict's order: the first mismatch is reported
            v = flat[fqn]
            if not isinstance(v, torch.Tensor):
                continue
            md = self.metadata.state_dict_metadata.get(fqn)
            if md is None:
                raise RuntimeError(
                    f"Missing key in checkpoint state_dict: {fqn}. The checkpoint has "
                    f"{sorted(self.metadata.state_dict_metadata)[:8]}..."
                )
            if isinstance(md, TensorStorageMetadata) and tuple(md.size) != tuple(v.shape):
                raise ValueError(
                    f"checkpoint tensor {fqn!r} has shape {tuple(md.size)}, the state dict's has "
                    f"{tuple(v.shape)}: load into a model of the same configuration"
                )

    def create_local_plan(self) -> LoadPlan:
        self._check_shapes()
        cpu_view = {k: _meta(v) for k, v in self.unsharded_state_dict.items()}
        plan = create_default_local_load_plan(cpu_view, self.metadata)
        for fqn, t in self.sharded_state_dict.items():
            shape = tuple(t.shape)
            chunks = [_chunk(_slices(sh.index, shape)) for sh in _local_shards(t)]
            md = self.metadata.state_dict_metadata[fqn]
            plan.items.extend(create_read_items_for_chunk_list(fqn, md, chunks))
        return plan

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return create_default_global_load_plan(global_plan)

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        path = self.mappings[read_item.dest_index.fqn]
        set_element(self.original_state_dict, path, torch.load(value, weights_only=False))

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        tensor = self.lookup_tensor(read_item.dest_index)
        return self.transform_tensor(read_item, tensor)

    def _start(self, fqn: str, t: torch.Tensor, sharded: bool) -> _Pending:
        shards = _local_shards(t) if sharded else [None]
        shapes = [tuple(sh.data.shape) for sh in shards] if sharded else [tuple(t.shape)]
        buffers = [torch.empty(s, dtype=t.dtype) for s in shapes]
        p = _Pending(t, shards, buffers, sum(b.numel() for b in buffers))
        self._pending[fqn] = p
        return p

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        fqn = index.fqn
        sharded = fqn in self.sharded_state_dict
        t = self.sharded_state_dict[fqn] if sharded else self.unsharded_state_dict[fqn]
        if not _is_lazy(t):
            return t  # a CPU tensor of the state dict: loaded in place by the reader
        p = self._pending.get(fqn) or self._start(fqn, t, sharded)
        return p.buffers[index.index if sharded else 0]

    def transform_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> torch.Tensor:
        return narrow_tensor_by_index(tensor, read_item.dest_offsets, read_item.lengths)

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        fqn = read_item.dest_index.fqn
        p = self._pending.get(fqn)
        if p is None:
            return
        p.remaining -= int(np.prod(read_item.lengths))
        if p.remaining < 0:
            raise RuntimeError(f"more data was read for {fqn!r} than its shards hold")
        if p.remaining == 0:
            del self._pending[fqn]
            _assign(p)


def _assign(p: _Pending) -> None:
    """Give a loaded tensor its new value: an array with the old one's sharding, built from the
    host buffers of its local shards."""
    t = _unwrap_xla_sharded_tensor(p.tensor)
    old = _array(t)
    if p.shards[0] is None:
        pieces = [
            jax.device_put(runtime.to_numpy(p.buffers[0]), sh.device)
            for sh in old.addressable_shards
        ]
    else:
        pieces = [
            jax.device_put(runtime.to_numpy(buf), sh.device)
            for sh, buf in zip(p.shards, p.buffers, strict=True)
        ]
    arr = jax.make_array_from_single_device_arrays(old.shape, old.sharding, pieces)
    s = state(t)
    write(s, (device_data(arr, s.spec, sharding=output_sharding(arr)), 0))
