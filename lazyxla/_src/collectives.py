"""Collectives across processes: recorded into the graph, lowered to XLA's collectives.

# Note [Cross-process collectives]
With several processes (Note [Processes]) outside SPMD mode, each process records and runs its own
graphs on its own device, as torch_xla's replicas do. `xm.all_reduce` and friends record a node
(`xla::all_reduce`, ... torch_xla's IR names) whose rule is the `jax.lax` collective over the
axis `REPLICAS`. A graph that holds such a node runs as one program over every process's device:
`jit(shard_map(program, mesh=replica_mesh(), in_specs=P(), out_specs=P()))`, each process
passing its own arrays as the single shard of a "replicated" global array and reading its own
result back. `P()` only names the per-device view: with `check_vma=False` nothing assumes the
shards are equal, and no data moves except through the collectives; this is pmap's model, on the
current API, with no reshape of any input or output. A graph without collectives still runs on
its process alone.

Collectives run in the order they were recorded, on every process: XLA may otherwise start two
independent collectives in either order, and processes that pick different orders deadlock.
As torch_xla threads a token through its collectives, each collective node takes the previous
one's token (a 0-d output made ready with its results by `lax.optimization_barrier`) and waits on
it. The token is a live tensor, so each step's graph carries it on to the next.

As in torch_xla, every process must run the same collectives in the same order, and a graph with
a collective must be the same graph on every process (XLA compiles it per process; collectives
that do not match hang until the coordinator's heartbeat or the launcher stops the run). So a
read of one tensor (`loss.item()`) on one process only must not run a pending collective: read
values after the step's sync.

Replica groups that are not all processes (`groups=[[0, 1], [2, 3]]`) are lowered by gathering
every replica's value and reducing the rows of the caller's group (shard_map has no
`axis_index_groups`): exact, and N times the traffic of a grouped collective; data-parallel
training (no groups) uses the direct collectives.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from . import distributed, runtime
from .ir import Node, Ref, TensorSpec
from .tensor import new_tensor, read, state

REPLICAS = "replicas"


def active() -> bool:
    """True when collectives cross processes (several processes, not SPMD)."""
    if distributed.process_count() <= 1:
        return False
    from . import runtime_api

    return not runtime_api.spmd_mode()


@functools.cache
def replica_mesh() -> Mesh:
    """One device per process (each process's first), in process order: replica r is process r."""
    first: dict[int, jax.Device] = {}
    for d in sorted(runtime.jax_devices(), key=lambda d: (d.process_index, d.id)):
        first.setdefault(d.process_index, d)
    return Mesh(np.array([first[p] for p in sorted(first)]), (REPLICAS,))


def _replicated() -> NamedSharding:
    return NamedSharding(replica_mesh(), PartitionSpec())


def globalize(args: Any) -> Any:
    """This process's arguments as the shards of global arrays (see the Note)."""
    sharding = _replicated()
    dev = runtime.default_device()

    def one(a: Any) -> jax.Array:
        if not isinstance(a, jax.Array):
            a = jax.device_put(a, dev)
        return jax.make_array_from_single_device_arrays(a.shape, sharding, [a])

    return jax.tree_util.tree_map(one, args)


def localize(outs: Sequence[jax.Array]) -> list[jax.Array]:
    """This process's results out of the global outputs."""
    return [o.addressable_data(0) for o in outs]


def across_processes(run: Any) -> Any:
    """`run(data, scalars)` as one program over every process's device (see the Note)."""
    mesh = replica_mesh()
    return lambda *args: jax.shard_map(
        run, mesh=mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec(), check_vma=False
    )(*args)


_compiles = [0]


def check_same_program(lowered: Any) -> None:
    """Raise, on every process, if the processes are about to compile different programs.

    Mismatched collective programs hang until the heartbeat ends the run; comparing digests of
    the programs (one key-value exchange per compile, never per execution) names the cause
    instead.
    """
    import hashlib

    digest = hashlib.sha256(lowered.as_text().encode()).hexdigest()[:16]
    _compiles[0] += 1
    digests = distributed.rendezvous(f"program/{_compiles[0]}", digest.encode())
    if len(set(digests)) > 1:
        groups: dict[bytes, list[int]] = {}
        for r, d in enumerate(digests):
            groups.setdefault(d, []).append(r)
        parts = "; ".join(f"processes {rs} compile {d.decode()}" for d, rs in groups.items())
        raise distributed.DistributedError(
            "the processes built different graphs for a step with collectives, so the collectives "
            f"cannot meet ({parts}). Every process must record the same ops: a graph differs when "
            "a process reads a pending value the others do not (read after the step's sync), "
            "takes another branch, or uses a rank-dependent Python scalar 0 or 1 (baked into the "
            "graph, as in torch_xla; pass such values as tensors)"
        )


# --- rules (traced inside shard_map over REPLICAS) ----------------------------------------------


def _group_table(groups: tuple | None, n: int) -> np.ndarray | None:
    """Row r: the members of replica r's group, in group order (None: one group of all)."""
    if groups is None:
        return None
    table = np.zeros((n, len(groups[0])), np.int32)
    for g in groups:
        for r in g:
            table[r] = g
    return table


def _position(groups: tuple | None, n: int) -> jax.Array:
    """This replica's index within its group."""
    me = jax.lax.axis_index(REPLICAS)
    if groups is None:
        return me
    pos = np.zeros(n, np.int32)
    for g in groups:
        for i, r in enumerate(g):
            pos[r] = i
    return jnp.asarray(pos)[me]


def _gather_group(x: jax.Array, groups: tuple | None, n: int) -> jax.Array:
    """The values of this replica's group stacked on a new leading axis."""
    everyone = jax.lax.all_gather(x, REPLICAS)
    table = _group_table(groups, n)
    if table is None:
        return everyone
    return everyone[jnp.asarray(table)[jax.lax.axis_index(REPLICAS)]]


def _reduce_rows(rows: jax.Array, reduce_type: str) -> jax.Array:
    if reduce_type == "sum":
        return jnp.sum(rows, axis=0, dtype=rows.dtype)
    if reduce_type == "mul":
        return jnp.prod(rows, axis=0, dtype=rows.dtype)
    if reduce_type == "min":
        return jnp.min(rows, axis=0)
    if reduce_type == "max":
        return jnp.max(rows, axis=0)
    if rows.dtype == jnp.bool_:
        return jnp.all(rows, axis=0) if reduce_type == "and" else jnp.any(rows, axis=0)
    op = jax.lax.bitwise_and if reduce_type == "and" else jax.lax.bitwise_or
    init = np.array(-1 if reduce_type == "and" else 0).astype(rows.dtype)
    return jax.lax.reduce(rows, init, op, (0,))


_DIRECT = {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}


def _reduce(x: jax.Array, reduce_type: str, groups: tuple | None, n: int) -> jax.Array:
    direct = _DIRECT.get(reduce_type)
    if groups is None and direct is not None and x.dtype != jnp.bool_:
        return direct(x, REPLICAS)
    return _reduce_rows(_gather_group(x, groups, n), reduce_type)


def _scale(x: jax.Array, scale: float) -> jax.Array:
    return x if scale == 1.0 else (x * scale).astype(x.dtype)


def _all_reduce_rule(*xs: Any, reduce_type: str, groups: Any, scale: float, n: int) -> list:
    return [_scale(_reduce(x, reduce_type, groups, n), scale) for x in xs]


def _all_gather_rule(x: jax.Array, dim: int, groups: Any, n: int) -> jax.Array:
    if groups is None:
        return jax.lax.all_gather(x, REPLICAS, axis=dim, tiled=True)
    rows = _gather_group(x, groups, n)  # (G, *x.shape)
    return jnp.concatenate(list(rows), axis=dim)


def _reduce_scatter_rule(
    x: jax.Array, reduce_type: str, scale: float, dim: int, groups: Any, n: int
) -> jax.Array:
    if groups is None and reduce_type == "sum":
        out = jax.lax.psum_scatter(x, REPLICAS, scatter_dimension=dim, tiled=True)
        return _scale(out, scale)
    full = _reduce(x, reduce_type, groups, n)
    k = n if groups is None else len(groups[0])
    size = x.shape[dim] // k
    shard = jax.lax.dynamic_slice_in_dim(full, _position(groups, n) * size, size, axis=dim)
    return _scale(shard, scale)


def _all_to_all_rule(x: jax.Array, split: int, concat: int, groups: Any, n: int) -> jax.Array:
    if groups is None:
        return jax.lax.all_to_all(x, REPLICAS, split, concat, tiled=True)
    rows = _gather_group(x, groups, n)  # (G, *x.shape): each member's whole value
    k = rows.shape[0]
    size = x.shape[split] // k
    start = _position(groups, n) * size
    chunks = [jax.lax.dynamic_slice_in_dim(r, start, size, axis=split) for r in rows]
    return jnp.concatenate(chunks, axis=concat)


def _permute_rule(x: jax.Array, pairs: tuple) -> jax.Array:
    return jax.lax.ppermute(x, REPLICAS, perm=pairs)


# --- recording ------------------------------------------------------------------------------------

REDUCE_TYPES = ("sum", "mul", "and", "or", "min", "max")
OPS = frozenset(
    ("xla::all_reduce", "xla::all_gather", "xla::reduce_scatter", "xla::all_to_all")
    + ("xla::collective_permute",)
)


# `Node.meta` of a node whose sub-program holds collectives (a replayed dynamo graph).
HOLDS_COLLECTIVES = "holds collectives"


def has_collectives(nodes: Sequence[Node]) -> bool:
    return any(n.op in OPS or n.meta == HOLDS_COLLECTIVES for n in nodes)


def swap_token(token: torch.Tensor | None) -> torch.Tensor | None:
    """Make `token` the ordering token; returns the previous one (None if there was none).
    Traced sub-programs (dynamo graphs) thread the token through as an input and an output."""
    old = _token[0] if _token else None
    _token[:] = [] if token is None else [token]
    return old


def _world() -> int:
    return distributed.process_count()


def check_groups(groups: Any, what: str) -> tuple | None:
    """`groups` as a tuple of tuples (None: all replicas), checked to partition the replicas."""
    n = _world()
    if not groups:
        return None
    gs = tuple(tuple(int(r) for r in g) for g in groups)
    members = sorted(r for g in gs for r in g)
    if members != list(range(n)) or len({len(g) for g in gs}) != 1:
        raise ValueError(
            f"{what}: replica groups {[list(g) for g in gs]} must split the {n} replicas "
            f"(0..{n - 1}) into groups of equal size, each replica in exactly one group"
        )
    return None if len(gs) == 1 and list(gs[0]) == list(range(n)) else gs


def _check_dtype(t: torch.Tensor, reduce_type: str, what: str) -> None:
    if reduce_type in ("and", "or") and (t.is_floating_point() or t.is_complex()):
        raise TypeError(
            f"{what}: reduce type {reduce_type!r} needs integer or bool tensors, got {t.dtype}"
        )


# The ordering token: see "in one order" in the Note.
_TOKEN_SPEC = TensorSpec((), torch.int32)
_token: list[torch.Tensor] = []


def _ordered(*xs: Any, rule: Any, **kw: Any) -> list:
    """`rule(*xs)` after the previous collective (whose token is `xs[-1]`), and a token that is
    ready only once this collective's results are."""
    *rest, token = xs
    xs, _ = jax.lax.optimization_barrier((list(rest), token))
    out = rule(*xs, **kw)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    outs, token = jax.lax.optimization_barrier((outs, jnp.zeros((), jnp.int32)))
    return [*outs, token]


def current_token() -> torch.Tensor:
    return _current_token()


def _current_token() -> torch.Tensor:
    """The token of the last collective; at first, device data (so the first step's graph is
    the same as every later step's, whose token is the previous step's output)."""
    if not _token:
        from .ir import device_data

        arr = runtime.host_to_device(torch.zeros((), dtype=torch.int32))
        _token.append(new_tensor((device_data(arr, _TOKEN_SPEC), 0), _TOKEN_SPEC))
    return _token[0]


def _record(
    name: str, rule: Any, tensors: Sequence[torch.Tensor], kwargs: dict, specs: list
) -> list:
    inputs = tuple(read(state(t)) for t in (*tensors, _current_token()))
    args = tuple(Ref(i) for i in range(len(inputs)))
    kw = tuple(sorted({**kwargs, "rule": rule}.items()))
    node = Node(name, _ordered, inputs, args, kw, (*specs, _TOKEN_SPEC))
    _token[:] = [new_tensor((node, len(specs)), _TOKEN_SPEC)]
    return [new_tensor((node, i), s) for i, s in enumerate(specs)]


def all_reduce(
    tensors: Sequence[torch.Tensor], reduce_type: str, scale: float, groups: Any
) -> list[torch.Tensor]:
    g = check_groups(groups, "all_reduce")
    for t in tensors:
        _check_dtype(t, reduce_type, "all_reduce")
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in tensors]
    kw = dict(reduce_type=reduce_type, groups=g, scale=float(scale), n=_world())
    return _record("xla::all_reduce", _all_reduce_rule, tensors, kw, specs)


def _group_size(g: tuple | None) -> int:
    return _world() if g is None else len(g[0])


def all_gather(t: torch.Tensor, dim: int, groups: Any) -> torch.Tensor:
    g = check_groups(groups, "all_gather")
    dim = dim % max(t.dim(), 1)
    shape = list(t.shape)
    shape[dim] *= _group_size(g)
    spec = TensorSpec(tuple(shape), t.dtype)
    kw = dict(dim=dim, groups=g, n=_world())
    return _record("xla::all_gather", _all_gather_rule, [t], kw, [spec])[0]


def _check_split(t: torch.Tensor, dim: int, count: int, g: Any, what: str, arg: str) -> int:
    """The group size, after checking that `count` is it and that `dim` splits evenly."""
    k = _group_size(g)
    if count != k:
        raise ValueError(
            f"{what}: {arg}={count} must equal the number of replicas in a group ({k})"
        )
    if t.shape[dim] % k:
        raise ValueError(
            f"{what}: dimension {dim} of size {t.shape[dim]} does not split into {k} equal parts"
        )
    return k


def reduce_scatter(
    t: torch.Tensor, reduce_type: str, scale: float, dim: int, shard_count: int, groups: Any
) -> torch.Tensor:
    g = check_groups(groups, "reduce_scatter")
    _check_dtype(t, reduce_type, "reduce_scatter")
    dim = dim % t.dim()
    k = _check_split(t, dim, shard_count, g, "reduce_scatter", "shard_count")
    shape = list(t.shape)
    shape[dim] //= k
    spec = TensorSpec(tuple(shape), t.dtype)
    kw = dict(reduce_type=reduce_type, scale=float(scale), dim=dim, groups=g, n=_world())
    return _record("xla::reduce_scatter", _reduce_scatter_rule, [t], kw, [spec])[0]


def all_to_all(
    t: torch.Tensor, split: int, concat: int, split_count: int, groups: Any
) -> torch.Tensor:
    g = check_groups(groups, "all_to_all")
    split, concat = split % t.dim(), concat % t.dim()
    k = _check_split(t, split, split_count, g, "all_to_all", "split_count")
    shape = list(t.shape)
    shape[split] //= k
    shape[concat] *= k
    spec = TensorSpec(tuple(shape), t.dtype)
    kw = dict(split=split, concat=concat, groups=g, n=_world())
    return _record("xla::all_to_all", _all_to_all_rule, [t], kw, [spec])[0]


def collective_permute(t: torch.Tensor, pairs: Sequence[Sequence[int]]) -> torch.Tensor:
    n = _world()
    ps = tuple((int(a), int(b)) for a, b in pairs)
    srcs, dsts = [a for a, _ in ps], [b for _, b in ps]
    if any(not 0 <= r < n for r in srcs + dsts):
        raise ValueError(
            f"collective_permute: pairs {list(map(list, ps))} name replicas outside 0..{n - 1}"
        )
    if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
        raise ValueError(
            f"collective_permute: pairs {list(map(list, ps))} send from or to a replica twice; "
            "each replica may send once and receive once"
        )
    spec = TensorSpec(tuple(t.shape), t.dtype)
    return _record("xla::collective_permute", _permute_rule, [t], dict(pairs=ps), [spec])[0]


# Note [Point-to-point transfers]
# `dist.send` / `dist.recv` involve two processes only, so they cannot be a node of the step's
# graph, which every process runs (Note [Cross-process collectives]). A transfer runs at once, as
# torch_xla's send/recv sync at once: the tensor is synced, then the sender and the receiver (and
# no other process) run one small program over a mesh of their two devices, a `ppermute` from the
# first to the second; the receiver's result becomes its tensor's data. The program is compiled
# once per (peers, shape, dtype) and counted as the step's compiles are.
P2P = "p2p"


@functools.cache
def _p2p_program(src: int, dst: int) -> tuple[Mesh, Any]:
    devices = replica_mesh().devices
    mesh = Mesh(np.array([devices[src], devices[dst]]), (P2P,))
    spec = PartitionSpec(P2P)
    move = jax.shard_map(
        lambda x: jax.lax.ppermute(x, P2P, [(0, 1)]), mesh=mesh, in_specs=spec, out_specs=spec
    )
    return mesh, jax.jit(move)


def point_to_point(t: torch.Tensor, src: int, dst: int) -> jax.Array | None:
    """Move `t` from process `src` to process `dst`; both call it (the receiver passes a tensor
    of the shape and dtype it expects). Returns the received array on `dst`, None on `src`."""
    from . import graph, metrics

    me = distributed.process_index()
    if src == dst or me not in (src, dst):
        raise ValueError(f"a transfer from process {src} to {dst} called on process {me}")
    s = state(t)
    graph.sync_states([s])
    local = read(s)[0].data
    mesh, move = _p2p_program(src, dst)
    piece = jax.device_put(local[None], runtime.default_device())
    shape = (2, *local.shape)
    arr = jax.make_array_from_single_device_arrays(
        shape, NamedSharding(mesh, PartitionSpec(P2P)), [piece]
    )
    with metrics.timed("ExecuteTime"):
        out = move(arr)
        out.block_until_ready()
    metrics.counter_inc("ExecuteComputation")
    return out.addressable_data(0)[0] if me == dst else None


# --- flat shards (ZeRO-1 and FSDP v1) -------------------------------------------------------------


def padded_flat(t: torch.Tensor, world: int) -> torch.Tensor:
    """`t` flattened and zero-padded to a multiple of `world` elements."""
    flat = t.reshape(-1)
    pad = (-flat.numel()) % world
    return torch.nn.functional.pad(flat, (0, pad)) if pad else flat


def flat_shard(t: torch.Tensor, world: int, rank: int) -> torch.Tensor:
    """Process `rank`'s equal slice of `padded_flat(t, world)`."""
    flat = padded_flat(t, world)
    size = flat.numel() // world
    return flat[rank * size : (rank + 1) * size]


# torch's functional collectives (`torch.ops._c10d_functional`), which dynamo traces: torch_xla's
# `xm.all_reduce` calls them under torch.compile, and its XLA kernels record the collective. On
# lazyxla tensors they record the same node as `xm.all_reduce` (synchronous: wait is identity).
def _functional_all_reduce(t: torch.Tensor, reduce_op: str, group_name: str) -> torch.Tensor:
    return all_reduce([t], reduce_op.lower(), 1.0, None)[0]


def register_functional_collectives() -> None:
    from .dispatch import register_kernel

    ops = torch.ops._c10d_functional
    register_kernel(ops.all_reduce.default, _functional_all_reduce)
    register_kernel(ops.wait_tensor.default, lambda t: t)
