"""torch.distributed's `xla` backend and `xla://` init method over lazyxla's collectives.

`dist.init_process_group("xla", init_method="xla://")` in a process started by
`torch_xla.launch` (or torchrun) gives a process group whose collectives record lazyxla's
cross-process collectives (Note [Cross-process collectives]): they run with the step's graph, so
`DistributedDataParallel`'s gradient all-reduces are part of the compiled step. `xla://` needs no
address: the store's port is exchanged through JAX's coordinator (so `init_process_group("gloo",
init_method="xla://")` works too, for host-side collectives).
"""

from __future__ import annotations

import datetime
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from . import collectives, distributed

_REDUCE_OPS = (
    (dist.ReduceOp.SUM, "sum"),
    (dist.ReduceOp.PRODUCT, "mul"),
    (dist.ReduceOp.MIN, "min"),
    (dist.ReduceOp.MAX, "max"),
    (dist.ReduceOp.BAND, "and"),
    (dist.ReduceOp.BOR, "or"),
)


def _reduce_type(op: Any) -> str:
    """xm's name of a c10d ReduceOp (which compares equal to its RedOpType, but does not hash
    like it)."""
    for rop, name in _REDUCE_OPS:
        if op == rop:
            return name
    raise NotImplementedError(
        f"the xla process group has no {op} reduction (it has SUM, PRODUCT, MIN, MAX, BAND, "
        "BOR, AVG)"
    )


def _from_array(arr: Any, like: torch.Tensor) -> torch.Tensor:
    """A lazy tensor holding device array `arr` (with `like`'s dtype)."""
    from .ir import TensorSpec, device_data
    from .tensor import new_tensor

    spec = TensorSpec(tuple(arr.shape), like.dtype)
    return new_tensor((device_data(arr, spec), 0), spec)


def _done(result: Any) -> Any:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(fut)


_store: list[Any] = []


def _tcp_store(timeout: datetime.timedelta) -> Any:
    """One `TCPStore` for the job, hosted by process 0 on a free port of the coordinator's host;
    the port reaches the others through the coordinator's key-value store (no port to choose)."""
    if _store:
        return _store[0]
    host = distributed.coordinator_host()
    n, me = distributed.process_count(), distributed.process_index()
    if me == 0:
        store = dist.TCPStore(host, 0, n, is_master=True, timeout=timeout, wait_for_workers=False)
        port = distributed.rendezvous("c10d-store", str(store.port).encode())[0]
    else:
        port = distributed.rendezvous("c10d-store", b"")[0]
        store = dist.TCPStore(host, int(port), n, is_master=False, timeout=timeout)
    _store.append(store)
    return store


def _rendezvous_handler(url: str, timeout: Any = None, **kwargs: Any) -> Any:
    """`xla://`: rank and world size from the launch (Note [Processes]), and a store."""
    distributed.ensure_initialized()
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(minutes=5)
    yield (_tcp_store(timeout), distributed.process_index(), distributed.process_count())


class ProcessGroupXla(ProcessGroup):
    """A process group whose collectives are recorded into lazyxla's graph."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Any) -> None:
        super().__init__(rank, size)
        self.store = store
        self.timeout = timeout
        # torch_xla's `_mesh`: the replica groups its collectives run over ([]: the whole world),
        # set by `new_group` (Note [Process group meshes])
        self._mesh: list[list[int]] = []
        self._group_name = "xla"

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "xla"

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        from . import xla_model as xm

        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if op == dist.ReduceOp.AVG:
            xm.all_reduce("sum", tensors, scale=1.0 / self.size(), groups=self._mesh)
        else:
            xm.all_reduce(_reduce_type(op), tensors, groups=self._mesh)
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        from . import xla_model as xm

        root = dist.get_global_rank(self, opts.rootRank) if self._mesh else opts.rootRank
        xm.collective_broadcast(tensors, root, groups=self._mesh)
        return _done(tensors)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        from . import xla_model as xm

        flat = input.reshape(1) if input.dim() == 0 else input
        result = xm.all_gather(flat, dim=0, groups=self._mesh)
        if result.shape != output.shape:
            result = result.reshape(output.shape)
        with torch.no_grad():
            output.copy_(result)
        return _done([output])

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        from . import xla_model as xm

        for inp, outs in zip(inputs, outputs):
            flat = inp.reshape(1) if inp.dim() == 0 else inp
            result = xm.all_gather(flat, dim=0, groups=self._mesh)
            with torch.no_grad():
                for o, part in zip(outs, torch.split(result, flat.shape[0])):
                    o.copy_(part.reshape(o.shape))
        return _done([t for ts in outputs for t in ts])

    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, opts)
        return _done(outputs)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        from . import xla_model as xm

        k = len(self._mesh[0]) if self._mesh else self.size()
        xm.reduce_scatter(
            _reduce_type(opts.reduceOp), input, 1.0, 0, k, groups=self._mesh, output=output
        )
        return _done(output)

    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> Any:
        for out, ins in zip(outputs, inputs):
            self._reduce_scatter_base(out, torch.cat([t.reshape(-1) for t in ins]), opts)
        return _done(outputs)

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, opts)
        return _done(outputs)

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Any:
        from . import xla_model as xm

        if output_split_sizes or input_split_sizes:
            raise NotImplementedError(
                "all_to_all_single with split sizes: XLA's all-to-all splits evenly; pad the "
                "input to equal splits"
            )
        with torch.no_grad():
            output.copy_(xm.all_to_all(input, 0, 0, self.size(), groups=self._mesh))
        return _done(output)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        from . import xla_model as xm

        stacked = torch.stack(inputs)
        result = xm.all_to_all(stacked, 0, 0, len(inputs), groups=self._mesh)
        with torch.no_grad():
            for o, r in zip(outputs, torch.unbind(result)):
                o.copy_(r)
        return _done(outputs)

    def barrier(self, opts: Any = None) -> Any:
        distributed.barrier("c10d")
        return _done([])

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        from . import xla_model as xm

        results = xm.all_reduce(_reduce_type(opts.reduceOp), [t.clone() for t in tensors])
        if self.rank() == opts.rootRank:
            with torch.no_grad():
                for t, r in zip(tensors, results):
                    t.copy_(r)
        return _done(tensors)

    def gather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        from . import xla_model as xm

        for i, inp in enumerate(inputs):
            flat = inp.reshape(1) if inp.dim() == 0 else inp
            result = xm.all_gather(flat, dim=0, groups=self._mesh)
            if self.rank() == opts.rootRank:
                with torch.no_grad():
                    for o, part in zip(outputs[i], torch.split(result, flat.shape[0])):
                        o.copy_(part.reshape(o.shape))
        return _done(outputs)

    def scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> Any:
        if self.rank() != opts.rootRank:
            inputs = [[torch.zeros_like(o)] * self.size() for o in outputs]
        rs = dist.ReduceScatterOptions()
        rs.reduceOp = dist.ReduceOp.SUM
        return self.reduce_scatter(outputs, inputs, rs)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        """Each tensor to rank `dst` now (Note [Point-to-point transfers]); `dst` calls recv."""
        for t in tensors:
            collectives.point_to_point(t, self._global(self.rank()), self._global(dst))
        return _done(tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        """Each tensor from rank `src`, in place; `src` calls send with the same shapes."""
        for t in tensors:
            got = collectives.point_to_point(t, self._global(src), self._global(self.rank()))
            with torch.no_grad():
                t.copy_(_from_array(got, t))
        return _done(tensors)

    def _global(self, rank: int) -> int:
        """The process of this group's `rank`."""
        return dist.get_global_rank(self, rank) if self._mesh else rank


class SpmdProcessGroupError(AssertionError, RuntimeError):
    """The `xla` process group asked for in SPMD mode (an AssertionError, as torch_xla's)."""


def _create(prefix_store: Any, rank: int, size: int, timeout: Any) -> ProcessGroupXla:
    """The backend's creator (torch_xla's `_create_xla_process_group`, same parameter names)."""
    from . import runtime_api

    if runtime_api.spmd_mode():
        raise SpmdProcessGroupError(
            "the xla process group is for one process per device; in SPMD mode use a gloo "
            "process group for host-side coordination"
        )
    return ProcessGroupXla(prefix_store, rank, size, timeout)


# Note [Process group meshes]
# XLA runs a collective on every replica: a process group over some of the ranks still needs a
# replica group for every rank. As torch_xla's, `dist.new_group(ranks)` of the `xla` backend
# records them in the group's `_mesh`: all ranks (one group), one rank (each its own group), or a
# slice of a rectangular mesh it infers with `pg_options={'xla_pg_options': {'spmd': True}}` (a
# row of consecutive ranks or a column of equally strided ones, the other rows/columns filled
# in), or the `mesh` given there; otherwise just `ranks`. A slice no rectangle has is a
# ValueError when the group is made.


def _infer_mesh(ranks: list[int], world: int) -> list[list[int]]:
    """The rectangular mesh of `world` ranks that has `ranks` as a row or a column."""
    n = len(ranks)
    if world % n:
        raise ValueError(
            f"Given slice length doesn't equal to a side of a rectangle. World size: {world}, "
            f"slice length: {n}"
        )
    step = ranks[1] - ranks[0]
    if ranks != list(range(ranks[0], ranks[0] + step * n, step)):
        raise ValueError(f"Given slice isn't a range with evenly distributed steps: {ranks}")
    rows = world // n
    if step == 1:  # a row: consecutive ranks
        if ranks[0] % n or ranks[0] >= world:
            raise ValueError(
                f"Given horizontal slice doesn't have a correct start: World size: {world}, "
                f"slice length: {n}, slice: {ranks}"
            )
        return [list(range(i * n, (i + 1) * n)) for i in range(rows)]
    if ranks[0] >= rows or step != rows:  # a column: every `rows`-th rank
        raise ValueError(
            f"Given vertical slice doesn't have a correct start or step: World size: {world}, "
            f"slice length: {n}, slice: {ranks}"
        )
    return [list(range(i, world, rows)) for i in range(rows)]


_new_group = dist.new_group


def new_group(
    ranks: Any = None, timeout: Any = None, backend: Any = None, pg_options: Any = None, **kw: Any
) -> Any:
    """`dist.new_group`, giving an `xla` group its replica groups (Note [Process group meshes])."""
    opts = pg_options.get("xla_pg_options", {}) if isinstance(pg_options, dict) else {}
    if timeout is not None:
        kw["timeout"] = timeout
    pg = _new_group(ranks=ranks, backend=backend, pg_options=pg_options, **kw)
    if not isinstance(pg, ProcessGroupXla) or ranks is None:
        return pg
    world_pg = dist.group.WORLD
    if not isinstance(world_pg, ProcessGroupXla):
        raise RuntimeError("the xla backend requires the default process group to be an xla one")
    ranks, world = list(ranks), world_pg.size()
    if ranks == list(range(world)):
        pg._mesh = [ranks]
    elif len(ranks) == 1:
        if ranks[0] not in range(world):
            raise ValueError(f"Given ranks is out of range: World size: {world}, ranks: {ranks}")
        pg._mesh = [[r] for r in range(world)]
    elif 1 < len(ranks) < world:
        given = opts.get("mesh")
        pg._mesh = given if given else _infer_mesh(ranks, world) if opts.get("spmd") else [ranks]
    else:
        warnings.warn(
            f"new_group: no replica groups for ranks {ranks}; the group's collectives run over "
            "the whole world",
            stacklevel=2,
        )
    return pg


def register() -> None:
    """Register the `xla` backend and `xla://` init method (idempotent)."""
    collectives.register_functional_collectives()
    dist.new_group = new_group
    if "xla" not in dist.Backend.backend_list:
        dist.Backend.register_backend("xla", _create, devices=["jax"])
    try:
        dist.register_rendezvous_handler("xla", _rendezvous_handler)
    except RuntimeError:
        pass  # already registered
