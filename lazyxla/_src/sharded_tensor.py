"""torch_xla's `XLAShardedTensor`: a lazyxla tensor seen with its sharding, its per-device
`XLAShard`s on the CPU, and the wrapping of op results.

sharding.py re-exports every public name here (`from .sharding import XLAShardedTensor` is how the
rest of lazyxla and torch_xla's alias reach them), and imports this module at its end: importing
lazyxla imports sharding.py first, so this module finds sharding.py's names defined.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import torch
from jax.sharding import NamedSharding

from . import runtime
from .sharding import (
    Mesh,
    ShardingAnnotation,
    ShardingType,
    _mesh_device_ids,
    _sharding_of,
    annotate,
    mark_sharding,
    sharding_spec,
    sharding_type,
)
from .tensor import DEVICE_TYPE, read, state


def shard_slices(indices: Any, shape: Sequence[int]) -> list[slice]:
    """An `XLAShard.indices` as one slice per dim (a replicated shard's `...` is the whole)."""
    if indices is Ellipsis:
        return [slice(0, n, 1) for n in shape]
    return list(indices)


@dataclasses.dataclass
class XLAShard:
    """One device's piece of a sharded tensor, on the CPU. `indices` is where it sits in the
    global tensor: a list of slices, one per dim, or `...` (Ellipsis) for a replicated shard,
    as torch_xla's. `data` of an uneven split's last tiles is zero-padded to the common shard
    shape; `unpadded_data` is its real part (a view, as torch_xla's)."""

    data: torch.Tensor
    indices: Any
    replica_id: int
    device: str

    @property
    def shard_device(self) -> str:
        """The device the shard came from (torch_xla's name for `device`)."""
        return self.device

    def _unpadded(self) -> Any:
        if self.indices is Ellipsis:
            return Ellipsis
        return tuple(slice(0, i.stop - i.start) for i in self.indices)

    @property
    def unpadded_data(self) -> torch.Tensor:
        return self.data[self._unpadded()]

    @unpadded_data.setter
    def unpadded_data(self, t: torch.Tensor) -> None:
        self.data[self._unpadded()] = t


class XLAShardedTensor(torch.Tensor):
    """A lazyxla tensor seen with its sharding (torch_xla's `XLAShardedTensor`).

    It aliases the global tensor (same storage, same lazy value, so reads and in-place writes are
    shared); `global_tensor` is the original tensor, with its autograd identity. As torch_xla's,
    an op on XLAShardedTensors returns XLAShardedTensors (`model(xst)` is one, and its
    `global_tensor` is the op's own result, on the autograd graph).
    """

    _global: torch.Tensor

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
            if func in torch.overrides.get_default_nowrap_functions():
                return out
            given = {id(a) for a in torch.utils._pytree.tree_leaves((args, kwargs))}

            def wrap(t: torch.Tensor) -> torch.Tensor:
                return t if id(t) in given else _wrap_result(t)

            return torch.utils._pytree.tree_map_only(torch.Tensor, wrap, out)

    def __deepcopy__(self, memo: dict) -> XLAShardedTensor:
        """A copy of the global tensor (its sharding kept), seen as an XLAShardedTensor."""
        import copy

        if id(self) in memo:
            return memo[id(self)]
        out = XLAShardedTensor.wrap(copy.deepcopy(self.global_tensor, memo))
        for k in ("_mesh_shape", "_partition_spec"):
            if k in self.__dict__:
                out.__dict__[k] = self.__dict__[k]
        memo[id(self)] = out
        return out

    @staticmethod
    def wrap(t: torch.Tensor) -> XLAShardedTensor:
        if isinstance(t, XLAShardedTensor):
            return t
        out = torch.Tensor._make_subclass(XLAShardedTensor, t, t.requires_grad)
        out._global = t
        return out

    @property
    def global_tensor(self) -> torch.Tensor:
        return self._global

    @property
    def sharding_spec(self) -> str:
        return sharding_spec(self)

    @property
    def sharding_type(self) -> ShardingType | None:
        return sharding_type(self)

    def _array(self) -> jax.Array:
        from . import graph

        s = state(self)
        graph.sync_states([s])
        return read(s)[0].data

    @property
    def local_shards(self) -> list[XLAShard]:
        """Each device's shard, by device id; uneven splits give zero-padded equal shards whose
        `unpadded_data` is the real part, as torch_xla's do."""
        s = state(self)
        if isinstance(s.sharding, ShardingAnnotation):
            return _tiles(self.global_tensor.cpu(), s.sharding.named)
        arr = self._array()
        shards = sorted(arr.addressable_shards, key=lambda sh: sh.device.id)
        out = []
        for sh in shards:
            data = runtime.device_to_host(sh.data, self.dtype)
            idx: Any = [
                slice(i.start or 0, i.stop if i.stop is not None else n, i.step or 1)
                for i, n in zip(sh.index, self.shape)
            ]
            if arr.sharding.is_fully_replicated:
                idx = Ellipsis
            where = f"{sh.device.platform.upper()}:{sh.device.id}"
            out.append(XLAShard(data, idx, sh.replica_id, where))
        return out

    def load_local_shards_(self, shards: list[XLAShard]) -> None:
        """Replace the data shard by shard (each shard's indices say where it goes). As torch_xla:
        the tensor must be split (tiled or partially replicated), and `shards` must be one per
        device, each of the (padded) shard shape."""
        kind = self.sharding_type
        if kind not in (ShardingType.TILED, ShardingType.PARTIAL):
            raise RuntimeError(
                "load_local_shards_ loads the shards of a tiled or partially replicated tensor; "
                f"this one's sharding is {self.sharding_spec or 'none'}: write the whole tensor "
                "with copy_ instead"
            )
        n = len(runtime.jax_devices())
        if len(shards) != n:
            raise RuntimeError(
                f"load_local_shards_ expects {n} shards, one per device, got {len(shards)}"
            )
        named = _sharding_of(self)
        dims = named._to_xla_hlo_sharding(self.dim()).tile_assignment_dimensions()
        want = tuple(-(-m // d) for m, d in zip(self.shape, dims))
        for sh in shards:
            if tuple(sh.data.shape) != want:
                raise RuntimeError(
                    f"load_local_shards_: the shard from {sh.device} has shape "
                    f"{tuple(sh.data.shape)}, the sharding's shards have shape {want}"
                )
        full = self.global_tensor.cpu()
        for sh in shards:
            full[tuple(shard_slices(sh.indices, full.shape))] = sh.unpadded_data
        s = state(self)
        named = _sharding_of(self)
        s.value = state(full.to(self.device)).value
        if named is not None:
            annotate(self, s.sharding, named)

    # --- torch_xla's DTensor view of the sharding (mesh_shape, partition_spec, _spec) ----------

    def __new__(
        cls,
        elem: torch.Tensor,
        mesh_shape: tuple[int, ...] | None = None,
        partition_spec: tuple | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> XLAShardedTensor:
        """torch_xla's constructor: `elem` seen as an XLAShardedTensor (sharing its data); with
        `requires_grad=True` it is a new leaf of the autograd graph, as torch_xla's is."""
        elem = unwrap(elem)
        grad = kwargs.get("requires_grad", False)
        out = torch.Tensor._make_subclass(cls, elem.detach() if grad else elem, grad)
        out._global = elem.detach() if grad else elem
        out._mesh_shape, out._partition_spec = mesh_shape, partition_spec
        return out

    @property
    def mesh_shape(self) -> tuple[int, ...] | None:
        given = self.__dict__.get("_mesh_shape")
        if given is not None:
            return given
        s = state(self)
        return s.sharding.mesh.mesh_shape if isinstance(s.sharding, ShardingAnnotation) else None

    @mesh_shape.setter
    def mesh_shape(self, value: tuple[int, ...] | None) -> None:
        self._mesh_shape = value
        self.invalidate_spec_cache()

    @property
    def partition_spec(self) -> tuple | None:
        """The partition spec given to `mark_sharding` (or set by `wrap_as_sharded_tensor`)."""
        return self.__dict__.get("_partition_spec")

    @partition_spec.setter
    def partition_spec(self, value: tuple | None) -> None:
        self._partition_spec = value
        self.invalidate_spec_cache()

    @property
    def _cached_spec(self) -> Any:
        return self.__dict__.get("_spec_cache")

    def invalidate_spec_cache(self) -> None:
        """Forget the cached DTensorSpec (after the mesh shape or partition spec changed)."""
        self.__dict__["_spec_cache"] = None

    @property
    def _spec(self) -> Any:
        """torch_xla's DTensorSpec of this sharding: a DeviceMesh('xla') of the mesh shape over
        device ids 0..n-1, and one placement per mesh dim (Shard of the tensor dim that names it,
        else Replicate); cached until the mesh shape or partition spec changes."""
        if self._cached_spec is not None:
            return self._cached_spec
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
        from torch.distributed.tensor.placement_types import Replicate, Shard

        mesh_shape, spec = self.mesh_shape, self.partition_spec
        if mesh_shape is None or spec is None:
            missing = "mesh_shape" if mesh_shape is None else "partition_spec"
            raise ValueError(
                f"{missing} must be specified to create DTensorSpec. If this tensor was created "
                "through torch operations, it may be auto-wrapped. Use wrap_as_sharded_tensor() "
                f"to set {missing} before accessing _spec."
            )
        ids = torch.arange(len(runtime.jax_devices())).reshape(mesh_shape)
        mesh = DeviceMesh("xla", ids, _init_backend=False)
        placements = tuple(
            next((Shard(d) for d, m in enumerate(spec) if m == mesh_dim), Replicate())
            for mesh_dim in range(len(mesh_shape))
        )
        g = self.global_tensor
        meta = TensorMeta(shape=g.shape, stride=g.stride(), dtype=g.dtype)
        self.__dict__["_spec_cache"] = DTensorSpec(mesh, placements, tensor_meta=meta)
        return self.__dict__["_spec_cache"]

    @property
    def placements(self) -> tuple[Any, ...]:
        """The DTensor placements of this sharding (see `_spec`)."""
        try:
            return self._spec.placements
        except ValueError as e:
            raise ValueError(
                "Placements not available: XLAShardedTensor requires mesh_shape and "
                "partition_spec to be set. Use mark_sharding() to properly initialize sharding "
                "information."
            ) from e

    def redistribute(
        self, device_mesh: Mesh, placements: Sequence[Any], *, async_op: bool = False
    ) -> XLAShardedTensor:
        """This tensor resharded over `device_mesh` by DTensor `placements` (Shard(d): tensor dim
        d split over that mesh dim; Replicate: not split). `async_op=True` reshards a copy."""
        from torch.distributed.tensor.placement_types import Partial, Shard

        if len(placements) != len(device_mesh.mesh_shape):
            raise ValueError(
                f"Number of placements ({len(placements)}) must match mesh dimensions "
                f"({len(device_mesh.mesh_shape)})"
            )
        if any(isinstance(p, Partial) for p in placements):
            raise NotImplementedError(
                "Partial placement is not yet implemented and may have unexpected behavior. "
                "Use Shard or Replicate placements instead."
            )
        g = self.global_tensor
        spec: list[int | None] = [None] * g.dim()
        for mesh_dim, p in enumerate(placements):
            if isinstance(p, Shard):
                if p.dim >= g.dim():
                    raise IndexError(
                        f"Shard dimension {p.dim} is out of bounds for tensor with {g.dim()} "
                        "dimensions"
                    )
                spec[p.dim] = mesh_dim
        target = g.clone() if async_op else g
        return mark_sharding(target, device_mesh, tuple(spec))

    def __repr__(self) -> str:
        return f"XLAShardedTensor({self.global_tensor!r}, sharding={self.sharding_spec!r})"


def _tiles(full: torch.Tensor, named: NamedSharding) -> list[XLAShard]:
    """torch_xla's shards of `full` under `named`, from the tile assignment."""
    hlo = named._to_xla_hlo_sharding(full.dim())
    ids = _mesh_device_ids(named)
    if hlo.is_replicated():
        return [XLAShard(full.clone(), Ellipsis, i, f"CPU:{d}") for i, d in enumerate(sorted(ids))]
    dims = list(hlo.tile_assignment_dimensions())
    devs = [ids[p] for p in hlo.tile_assignment_devices()]
    coords = np.unravel_index(np.arange(len(devs)), dims)
    out = []
    for flat, d in sorted(enumerate(devs), key=lambda x: x[1]):
        c = [int(coords[k][flat]) for k in range(len(dims))]
        replica = c[-1] if hlo.replicate_on_last_tile_dim() else 0
        idx, pad = [], []
        for i, n in enumerate(full.shape):
            size = -(-n // dims[i])
            start = min(c[i] * size, n)
            stop = min(start + size, n)
            idx.append(slice(start, stop, 1))
            pad.append(size - (stop - start))
        real = full[tuple(idx)].clone()
        padded = real
        if any(pad):
            widths = [w for p in reversed(pad) for w in (0, p)]
            padded = torch.nn.functional.pad(real, widths)
        out.append(XLAShard(padded, idx, replica, f"CPU:{d}"))
    return out


def _wrap_result(t: torch.Tensor) -> torch.Tensor:
    """An op's lazy tensor result as an XLAShardedTensor (an alias on the autograd graph)."""
    if type(t) is not torch.Tensor or t.device.type != DEVICE_TYPE:
        return t
    if t.requires_grad:
        out = _AsSharded.apply(t)
    else:
        out = torch.Tensor._make_subclass(XLAShardedTensor, t, False)
    out._global = t
    return out


class _AsSharded(torch.autograd.Function):
    """`t` seen as an XLAShardedTensor (same storage), on the autograd graph: the gradient
    passes through unchanged."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        return torch.Tensor._make_subclass(XLAShardedTensor, t, False)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def unwrap(t: torch.Tensor) -> torch.Tensor:
    return t._global if isinstance(t, XLAShardedTensor) else t


def wrap_if_sharded(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and not isinstance(x, XLAShardedTensor):
        if x.device.type == "jax" and sharding_type(x) is not None:
            return XLAShardedTensor.wrap(x)
    return x
