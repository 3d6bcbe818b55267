"""Manual sharding regions, lowered to `jax.shard_map`, and the collectives used inside them.

# Note [Manual sharding]
`enable_manual_sharding(t, spec)` shards `t` and returns its *local shard* as a new lazy tensor (an
`xla::full_to_shard` node). Ops on it record as usual, with local shapes; collectives
(`xm.all_reduce`, ...) on such values record collective nodes over mesh axes.
`disable_manual_sharding(t, spec, full_shape)` closes the region: it walks the IR back from `t` to
the region's entries (the `full_to_shard` nodes) and leaves (device data, lifted scalars), and
replaces the region by one `xla::shard_map` node whose inputs are the entries' full tensors and the
leaves (replicated). Its rule interprets the region with the same `Program` as a whole graph,
inside `jax.shard_map`; its static arguments carry the region's structural key, so the graph cache
tells regions apart (see Note [Graph hashing]). Closing nothing and syncing an open region is an
error that says so; a sync of every live tensor leaves an open region's tensors pending (with a
warning) and runs the rest. torch_xla's low-level entry points map onto the same region:
`_XLAC._spmd_full_to_shard_shape` opens one from a `mark_sharding` annotation,
`xs._mark_manual_sharding` marks a value as a local shard, and `_XLAC._spmd_shard_to_full_shape`
closes it (a value marked manual outside any region is every device's shard).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import torch
from jax.sharding import PartitionSpec

from . import sharding as xs
from .dispatch import emit
from .ir import DEVICE_DATA, SCALAR, Node, Ref, TensorSpec, post_order, structure_key
from .lower import Program
from .tensor import new_tensor, read, state

FULL_TO_SHARD = "xla::full_to_shard"
_regions_opened = 0  # collectives look for a region only once one was ever opened
# Regions opened since a full sync last found none left open: a full sync walks the pending graph
# for open regions only while this is nonzero (`without_open_regions`).
_regions_unsynced = 0


class ManualRegionError(RuntimeError):
    pass


def _open_region_rule(x: Any, *statics: Any) -> Any:
    raise ManualRegionError(
        "a manual sharding region was never closed: call "
        "xs.disable_manual_sharding(t, partition_spec, full_shape) on its outputs before the sync"
    )


def _local_shape(shape: tuple[int, ...], mesh: xs.Mesh, spec: tuple) -> tuple[int, ...]:
    sizes = mesh.mesh_shape
    out = []
    for n, p in zip(shape, spec):
        if p is None:
            out.append(n)
            continue
        k = int(np.prod([sizes[i] for i in (p if type(p) is tuple else (p,))]))
        if n % k:
            raise ValueError(f"dim of size {n} cannot be split evenly into {k} manual shards")
        out.append(n // k)
    return tuple(out)


def _pspec(mesh: xs.Mesh, spec: tuple) -> PartitionSpec:
    return mesh.named_sharding(spec).spec


def enable_manual_sharding(
    t: torch.Tensor, partition_spec: tuple, *, mesh: xs.Mesh | None = None
) -> xs.XLAShardedTensor:
    """Shard `t` and return its local shard; ops on it are per-device until disabled."""
    mesh = mesh or xs.get_global_mesh()
    if mesh is None:
        raise ValueError("enable_manual_sharding needs a mesh: pass mesh= or set_global_mesh")
    t = xs.unwrap(xs.mark_sharding(t, mesh, partition_spec))
    return xs.XLAShardedTensor.wrap(_open(t, mesh, mesh.translate(tuple(partition_spec))))


def _open(t: torch.Tensor, mesh: xs.Mesh, spec: tuple) -> torch.Tensor:
    """The local shard of `t` (sharded by `spec` over `mesh`): a manual region's entry."""
    local = TensorSpec(_local_shape(tuple(t.shape), mesh, spec), t.dtype)
    value = emit(FULL_TO_SHARD, _open_region_rule, (read(state(t)),), (Ref(0), mesh, spec), local)
    out = new_tensor(value, local)
    state(out).sharding = xs.MANUAL
    global _regions_opened, _regions_unsynced
    _regions_opened += 1
    _regions_unsynced += 1
    return out


_REGION_LEAVES = (FULL_TO_SHARD, DEVICE_DATA, SCALAR)


def without_open_regions(states: list[Any]) -> list[Any]:
    """`states` less those inside a manual region not closed yet, for a sync of every live tensor:
    a local shard has no global value until `disable_manual_sharding` (or
    `_spmd_shard_to_full_shape`) closes its region, so the sync leaves it pending (a read of it
    raises, naming the missing step) and runs the rest."""
    global _regions_unsynced
    if not _regions_unsynced:
        return states
    memo: dict[int, bool] = {}

    def inside(root: Node) -> bool:
        order = post_order([root], stop=lambda n: id(n) in memo or n.op in _REGION_LEAVES)
        for n in order:
            if id(n) not in memo:
                memo[id(n)] = n.op == FULL_TO_SHARD or any(memo[id(x)] for x, _ in n.inputs)
        return memo[id(root)]

    kept = [s for s in states if not inside(s.value[0])]
    if len(kept) == len(states):
        # This sync runs every pending region (a failed or stale state is not pending): none is
        # left open, so later syncs skip the walk until a region opens again.
        _regions_unsynced = 0
    else:
        warnings.warn(
            f"sync: {len(states) - len(kept)} tensor(s) inside a manual sharding region that was "
            "never closed stay pending; close it with xs.disable_manual_sharding (or "
            "_XLAC._spmd_shard_to_full_shape) to compute them",
            stacklevel=3,
        )
    return kept


def _region(root: tuple[Node, int]) -> tuple[list[Node], list[Node]]:
    """Post-order of the region ending at `root`, and its leaves (entries, data, scalars)."""
    order = post_order([root[0]], stop=lambda n: n.op in _REGION_LEAVES)
    leaves = [n for n in order if n.op in _REGION_LEAVES]
    if not any(n.op == FULL_TO_SHARD for n in leaves):
        raise ValueError("disable_manual_sharding: the tensor does not come from a manual region")
    return order, leaves


def disable_manual_sharding(
    t: torch.Tensor,
    partition_spec: tuple,
    full_shape: Sequence[int],
    *,
    mesh: xs.Mesh | None = None,
) -> xs.XLAShardedTensor:
    """Close the manual region producing `t`: the result is the full tensor, sharded by spec."""
    mesh = mesh or xs.get_global_mesh()
    if mesh is None:
        raise ValueError("disable_manual_sharding needs a mesh: pass mesh= or set_global_mesh")
    return _close(xs.unwrap(t), mesh, tuple(partition_spec), full_shape)


def _close(
    t: torch.Tensor, mesh: xs.Mesh, partition_spec: tuple, full_shape: Sequence[int]
) -> xs.XLAShardedTensor:
    """The full tensor of the manual region's local shard `t`, sharded over `mesh`."""
    spec = mesh.translate(partition_spec)
    full = TensorSpec(tuple(full_shape), t.dtype)
    if _local_shape(full.shape, mesh, spec) != tuple(t.shape):
        raise ValueError(
            f"a local shard of shape {tuple(t.shape)} does not tile full_shape "
            f"{tuple(full_shape)} under partition spec {tuple(partition_spec)}"
        )
    root = read(state(t))
    order, leaves = _region(root)
    pos = {id(n): i for i, n in enumerate(order)}
    program = Program(order, pos, [(pos[id(root[0])], root[1])], leaf_ids={id(n) for n in leaves})
    inputs: list[tuple[Node, int]] = []
    in_specs: list[PartitionSpec] = []
    for leaf in leaves:
        if leaf.op == FULL_TO_SHARD:
            inputs.append(leaf.inputs[0])
            in_specs.append(_pspec(mesh, leaf.args[2]))
        else:
            inputs.append((leaf, 0))
            in_specs.append(PartitionSpec())
    out_spec = _pspec(mesh, spec)
    body = program.function()
    jmesh = mesh.jax_mesh

    def rule(*arrays: Any, **_: Any) -> Any:
        fn = jax.shard_map(
            lambda *xs_: body(list(xs_), [])[0],
            mesh=jmesh,
            in_specs=tuple(in_specs),
            out_specs=out_spec,
            check_vma=False,
        )
        return fn(*arrays[: len(inputs)])

    # Entries are keyed by their descriptor (it holds the mesh and spec), other leaves by spec.
    key = (structure_key(order, (DEVICE_DATA, SCALAR)), tuple(in_specs), out_spec, jmesh)
    args = (*(Ref(i) for i in range(len(inputs))), key)
    node = Node("xla::shard_map", rule, tuple(inputs), args, (), (full,))
    out = new_tensor((node, 0), full)
    return xs.mark_sharding(out, mesh, partition_spec)


# --- torch_xla's low-level manual sharding entry points (`_XLAC._spmd_full_to_shard_shape`, ...) --


class OpSharding:
    """torch_xla's `_XLAC.OpSharding(tile_assignment, group_assignment, replication_groups,
    sharding_type)`; lazyxla reads only its type (replicated or manual) from it: tiled shardings
    are given as `Mesh.get_op_sharding` strings."""

    def __init__(
        self,
        tile_assignment: Sequence[Any],
        group_assignment: Sequence[Any],
        replication_groups: Sequence[Any],
        sharding_type: int,
    ) -> None:
        self.tile_assignment = list(tile_assignment)
        self.group_assignment = list(group_assignment)
        self.replication_groups = list(replication_groups)
        self.sharding_type = xs.ShardingType(int(sharding_type))

    def __repr__(self) -> str:
        return f"OpSharding(type={self.sharding_type.name})"


def mark_manual_sharding(t: torch.Tensor) -> xs.XLAShardedTensor:
    """torch_xla's `xs._mark_manual_sharding`: `t`, a value computed inside a manual region, is
    marked as a local shard (sharding `{manual}`), ready for `_spmd_shard_to_full_shape`."""
    t = xs.unwrap(t)
    s = state(t)
    if read(s)[0].op == DEVICE_DATA:
        raise RuntimeError(
            "_mark_manual_sharding: the tensor is device data, not a value computed in a manual "
            "region; open one with _XLAC._spmd_full_to_shard_shape (or xs.enable_manual_sharding)"
        )
    s.sharding = xs.MANUAL
    return xs.XLAShardedTensor.wrap(t)


def xlac_mark_manual_sharding(t: torch.Tensor, sharding: OpSharding) -> None:
    """torch_xla's `_XLAC._mark_manual_sharding(t, OpSharding(..., MANUAL))`."""
    if not (isinstance(sharding, OpSharding) and sharding.sharding_type == xs.ShardingType.MANUAL):
        raise RuntimeError(
            f"_mark_manual_sharding takes OpSharding([], [], [], ShardingType.MANUAL), got "
            f"{sharding!r}"
        )
    mark_manual_sharding(t)


def full_to_shard_shape(t: torch.Tensor) -> torch.Tensor:
    """torch_xla's `_XLAC._spmd_full_to_shard_shape`: the local shard of `t` under the sharding
    `mark_sharding` gave it (a manual region's entry, see Note [Manual sharding])."""
    t = xs.unwrap(t)
    ann = state(t).sharding
    if not isinstance(ann, xs.ShardingAnnotation):
        raise RuntimeError(
            "_spmd_full_to_shard_shape: the tensor has no sharding annotation; call "
            "xs.mark_sharding(t, mesh, partition_spec) first"
        )
    return _open(t, ann.mesh, ann.partition_spec)


def _mesh_of_sharding(sharding: Any, ndim: int, entry: xs.Mesh | None) -> tuple[xs.Mesh, tuple]:
    """(mesh, partition spec) of a torch_xla sharding (OpSharding or V1 string) of a rank-`ndim`
    result, over the region's entry mesh if it has one (one shard_map has one mesh)."""
    text = sharding
    if isinstance(sharding, OpSharding):
        if sharding.sharding_type != xs.ShardingType.REPLICATED:
            raise NotImplementedError(
                f"_spmd_shard_to_full_shape takes a replicated OpSharding or a tiled sharding as "
                f"a Mesh.get_op_sharding string, got {sharding}"
            )
        text = "{replicated}"
    if text == "{replicated}":
        return entry or xs.get_1d_mesh(), (None,) * ndim
    parsed = xs.parse_v1(str(text))
    if parsed is None or len(parsed[0]) != ndim:
        raise RuntimeError(
            f"_spmd_shard_to_full_shape: {text!r} is not a tiled sharding of a rank-{ndim} "
            "tensor; pass mesh.get_op_sharding(partition_spec)"
        )
    if entry is None:  # the mesh the string describes: tile dims, then the replication group
        dims, devs, group = parsed
        return xs.Mesh(devs, (*dims, group)), tuple(range(ndim))
    for spec in itertools.product(*[[None, *range(len(entry.mesh_shape))] for _ in range(ndim)]):
        try:
            named = entry._make_named(entry.translate(spec))  # uncached: no CreateOpSharding
        except ValueError:  # a mesh axis used twice
            continue
        if xs.hlo_string(named, ndim) == text:
            return entry, spec
    raise NotImplementedError(
        f"_spmd_shard_to_full_shape: the sharding {text} is not one over the manual region's mesh "
        f"{entry}; lazyxla lowers a region to one shard_map, over one mesh"
    )


def shard_to_full_shape(
    t: torch.Tensor, sharding: Any, full_shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """torch_xla's `_XLAC._spmd_shard_to_full_shape`: close the manual region whose local shard
    `t` (marked with `_mark_manual_sharding`) is; the full tensor, sharded by `sharding`."""
    t = xs.unwrap(t)
    if state(t).sharding is not xs.MANUAL:
        raise RuntimeError(
            "_spmd_shard_to_full_shape: the tensor is not a manual shard; mark it with "
            "xs._mark_manual_sharding(t) inside a region opened by _spmd_full_to_shard_shape"
        )
    if dtype != t.dtype:
        raise RuntimeError(f"_spmd_shard_to_full_shape: dtype {dtype} is not the shard's {t.dtype}")
    entry = manual_mesh(t)
    mesh, spec = _mesh_of_sharding(sharding, len(full_shape), entry)
    if entry is None:
        return xs.unwrap(_close_replicated(t, mesh, spec, full_shape))
    return xs.unwrap(_close(t, mesh, spec, full_shape))


def _identity(x: Any) -> Any:
    return x


def _close_replicated(
    t: torch.Tensor, mesh: xs.Mesh, spec: tuple, full_shape: Sequence[int]
) -> xs.XLAShardedTensor:
    """A value marked manual outside any region (no `_spmd_full_to_shard_shape` before it): a
    global, replicated value, so every device's local shard is the whole of `t`. The full tensor
    is those shards laid out by `spec` (torch_xla's SPMDShardToFullShape of such a value)."""
    full = TensorSpec(tuple(full_shape), t.dtype)
    if _local_shape(full.shape, mesh, spec) != tuple(t.shape):
        raise ValueError(
            f"a local shard of shape {tuple(t.shape)} does not tile full_shape "
            f"{tuple(full_shape)} under {spec} over {mesh}"
        )
    jmesh, out_spec = mesh.jax_mesh, _pspec(mesh, spec)

    def rule(x: Any, key: Any) -> Any:
        fn = jax.shard_map(
            _identity, mesh=jmesh, in_specs=(PartitionSpec(),), out_specs=out_spec, check_vma=False
        )
        return fn(x)

    node = Node(
        "xla::shard_map",
        rule,
        (read(state(t)),),
        (Ref(0), ("identity", out_spec, jmesh)),
        (),
        (full,),
    )
    return xs.mark_sharding(new_tensor((node, 0), full), mesh, spec)


# --- collectives inside a manual region -----------------------------------------------------------


def manual_mesh(t: torch.Tensor) -> xs.Mesh | None:
    """The mesh of the manual region `t` belongs to, or None outside any region."""
    stack = [read(state(t))[0]]
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op == FULL_TO_SHARD:
            return n.args[1]
        stack.extend(x for x, _ in n.inputs)
    return None


def axes_for_groups(mesh: xs.Mesh, groups: Sequence[Sequence[int]] | None) -> tuple[str, ...]:
    """The mesh axes whose replica groups are `groups` (all axes when None)."""
    names = mesh.jax_axis_names
    if not groups:
        return names
    want = {frozenset(g) for g in groups}
    logical = mesh.get_logical_mesh()
    r = len(names)
    for k in range(1, r + 1):
        for axes in itertools.combinations(range(r), k):
            rest = [d for d in range(r) if d not in axes]
            moved = np.transpose(logical, rest + list(axes)).reshape(
                -1, int(np.prod([logical.shape[a] for a in axes]))
            )
            if {frozenset(row.tolist()) for row in moved} == want:
                return tuple(names[a] for a in axes)
    raise ValueError(
        f"replica groups {groups} do not match any set of axes of mesh {mesh.mesh_shape}; "
        "groups must be the devices varying along whole mesh axes"
    )


_REDUCERS = {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}


def _all_reduce_rule(x: Any, reduce_type: str, axes: tuple, scale: float) -> Any:
    if reduce_type not in _REDUCERS:
        raise NotImplementedError(f"all_reduce {reduce_type!r} inside a manual region")
    out = _REDUCERS[reduce_type](x, axes)
    return out * scale if scale != 1.0 else out


def _all_gather_rule(x: Any, dim: int, axes: tuple) -> Any:
    return jax.lax.all_gather(x, axes, axis=dim, tiled=True)


def _reduce_scatter_rule(x: Any, dim: int, axes: tuple, scale: float) -> Any:
    out = jax.lax.psum_scatter(x, axes, scatter_dimension=dim, tiled=True)
    return out * scale if scale != 1.0 else out


def _all_to_all_rule(x: Any, split: int, concat: int, axes: tuple) -> Any:
    return jax.lax.all_to_all(x, axes, split, concat, tiled=True)


def _permute_rule(x: Any, axes: tuple, perm: tuple) -> Any:
    return jax.lax.ppermute(x, axes, perm)


def _collective(name: str, rule: Any, t: torch.Tensor, statics: tuple, spec: TensorSpec) -> Any:
    v = emit(name, rule, (read(state(t)),), (Ref(0), *statics), spec)
    return new_tensor(v, spec)


def all_reduce(t: torch.Tensor, mesh: xs.Mesh, reduce_type: str, scale: float, groups: Any) -> Any:
    axes = axes_for_groups(mesh, groups)
    spec = state(t).spec
    return _collective(
        "xla::all_reduce", _all_reduce_rule, t, (reduce_type, axes, float(scale)), spec
    )


def all_gather(t: torch.Tensor, mesh: xs.Mesh, dim: int, groups: Any) -> Any:
    axes = axes_for_groups(mesh, groups)
    dim = dim % t.dim()
    n = int(np.prod([dict(zip(mesh.jax_axis_names, mesh.mesh_shape))[a] for a in axes]))
    shape = list(t.shape)
    shape[dim] *= n
    return _collective(
        "xla::all_gather", _all_gather_rule, t, (dim, axes), TensorSpec(tuple(shape), t.dtype)
    )


def reduce_scatter(
    t: torch.Tensor, mesh: xs.Mesh, reduce_type: str, scale: float, dim: int, groups: Any
) -> Any:
    if reduce_type != "sum":
        raise NotImplementedError(f"reduce_scatter {reduce_type!r} inside a manual region")
    axes = axes_for_groups(mesh, groups)
    dim = dim % t.dim()
    n = int(np.prod([dict(zip(mesh.jax_axis_names, mesh.mesh_shape))[a] for a in axes]))
    shape = list(t.shape)
    shape[dim] //= n
    return _collective(
        "xla::reduce_scatter",
        _reduce_scatter_rule,
        t,
        (dim, axes, float(scale)),
        TensorSpec(tuple(shape), t.dtype),
    )


def all_to_all(t: torch.Tensor, mesh: xs.Mesh, split: int, concat: int, groups: Any) -> Any:
    axes = axes_for_groups(mesh, groups)
    n = int(np.prod([dict(zip(mesh.jax_axis_names, mesh.mesh_shape))[a] for a in axes]))
    shape = list(t.shape)
    shape[split % t.dim()] //= n
    shape[concat % t.dim()] *= n
    return _collective(
        "xla::all_to_all",
        _all_to_all_rule,
        t,
        (split % t.dim(), concat % t.dim(), axes),
        TensorSpec(tuple(shape), t.dtype),
    )


def collective_permute(t: torch.Tensor, mesh: xs.Mesh, pairs: Sequence[Sequence[int]]) -> Any:
    ids = mesh.device_ids.tolist()
    perm = tuple((ids.index(a), ids.index(b)) for a, b in pairs)
    return _collective(
        "xla::collective_permute", _permute_rule, t, (mesh.jax_axis_names, perm), state(t).spec
    )


def in_manual_region(tensors: Sequence[torch.Tensor]) -> xs.Mesh | None:
    """The mesh of the manual region any of `tensors` belongs to, or None."""
    if not _regions_opened:
        return None
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "jax":
            m = manual_mesh(t)
            if m is not None:
                return m
    return None
