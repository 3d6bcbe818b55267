"""torch_xla's `torch_xla.distributed.data_parallel`: `DataParallel`, replicas of a model in
threads of one process, one per device, averaging their gradients every step.

# Note [DataParallel replicas]
torch_xla runs one thread per device; each thread runs the user's `loop_fn` over its own copy of
the model and its share of the batches, and `xm.optimizer_step` all-reduces the gradients across
the threads. lazyxla drives one device per process (see `tensor.check_device`), and its IR is not
thread-safe, so the replica threads take turns on the process's device, in replica order: replica
`i` runs until it reaches a collective, then hands the turn to `i + 1`; the last to arrive
combines everyone's values and runs on, and the turn comes back round to replica 0. The order is
fixed, not left to the thread scheduler, and a replica runs what it recorded before it hands the
turn over, so each graph holds one replica's work and every step records the same graphs (a sync
runs all pending tensors: were other replicas' work pending at a sync, it would vary and
recompile). The numbers are those of N replicas on N devices (each replica keeps its own model
copy and optimizer, gets every N-th batch in order, and `xm.optimizer_step` /
`xm.reduce_gradients` / `xm.all_reduce` reduce over the replicas, summing in replica order;
`xm.get_ordinal()` is the replica's index and `xm.xrt_world_size()` the replica count, so
`xm.is_master_ordinal()` / `xm.master_print` / `xm.save` act on replica 0); the speed is that of
one device. Other collectives (all_gather, reduce_scatter, all_to_all, collective_permute,
collective_broadcast) raise inside a replica rather than give one replica's answer. For
parallel speed use SPMD (`xs.mark_sharding` over a mesh) or one process per device
(`torch_xla.launch`).

Batches are read from the host loader when a replica needs them (`_Dealer`), in its turn. A
replica that raises aborts the others (they raise `ReplicaAborted` where they wait) and
`DataParallel.__call__` re-raises the first error in the caller's thread (torch_xla exits the
process instead). A replica that returns while the others still enter collectives is an error,
not a hang.
"""

from __future__ import annotations

import collections
import copy
import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from . import api, graph, xla_model
from .tensor import DEVICE_TYPE

_tls = threading.local()
_END = object()


class ReplicaAborted(RuntimeError):
    """Another replica of the same DataParallel call failed."""


class _Replicas:
    """The replica threads of one `DataParallel` call, taking turns in a fixed order (Note
    [DataParallel replicas])."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.cond = threading.Condition()
        self.turn = 0
        self.done = [False] * count
        self.slots: list[Any] = [None] * count
        self.arrived = 0
        self.generation = 0
        self.result: Any = None
        self.error: BaseException | None = None

    def _aborted(self) -> ReplicaAborted:
        return ReplicaAborted(
            f"another DataParallel replica failed: {type(self.error).__name__}: {self.error}"
        )

    def _pass_turn(self, index: int) -> None:
        """Hand the turn to the next replica after `index` still running (cond held)."""
        for step in range(1, self.count + 1):
            k = (index + step) % self.count
            if not self.done[k]:
                self.turn = k
                break
        self.cond.notify_all()

    def _wait_turn(self, index: int, also: Callable[[], bool] = lambda: True) -> None:
        self.cond.wait_for(lambda: (self.turn == index and also()) or self.error is not None)
        if self.error is not None and not (self.turn == index and also()):
            raise self._aborted()

    def start(self, index: int) -> None:
        with self.cond:
            self._wait_turn(index)

    def finish(self, index: int, error: BaseException | None) -> None:
        with self.cond:
            self.done[index] = True
            if error is not None and self.error is None:
                self.error = error
            if self.turn == index:
                self._pass_turn(index)
            self.cond.notify_all()

    def yield_turn(self, index: int) -> None:
        """Let the other replicas run until the turn comes back."""
        graph.sync_states(None)  # this replica's pending work stays in its own graph
        with self.cond:
            self._pass_turn(index)
            self._wait_turn(index)

    def exchange(self, index: int, value: Any, combine: Callable[[list[Any]], Any]) -> Any:
        """Deposit `value`; returns `combine(values of all replicas, in replica order)`."""
        with self.cond:
            if self.error is not None:
                raise self._aborted()
            finished = [k for k in range(self.count) if self.done[k]]
            if finished:
                raise RuntimeError(
                    f"DataParallel replica {index} entered a collective, but replicas {finished} "
                    "already returned from loop_fn: every replica must run the same collectives "
                    "(the same number of steps)"
                )
            generation = self.generation
            self.slots[index] = value
            self.arrived += 1
            if self.arrived == self.count:  # the last one combines, in its turn
                values, self.slots, self.arrived = self.slots, [None] * self.count, 0
                self.result = combine(values)
                self.generation += 1
                return self.result
            graph.sync_states(None)  # this replica's pending work stays in its own graph
            self._pass_turn(index)
            self._wait_turn(index, lambda: self.generation != generation)
            return self.result


def current() -> tuple[_Replicas, int] | None:
    """The replicas and the index of the replica this thread runs, if it runs one."""
    return getattr(_tls, "replica", None)


_REDUCE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add,
    "mul": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "and": torch.bitwise_and,
    "or": torch.bitwise_or,
}


def _group_of(groups: Any, count: int, index: int) -> list[int]:
    if not groups:
        return list(range(count))
    members = sorted(r for g in groups for r in g)
    if members != list(range(count)):
        raise ValueError(
            f"all_reduce groups {groups} must split the {count} DataParallel replicas "
            f"(0..{count - 1}) into groups, each replica in exactly one"
        )
    return next(list(g) for g in groups if index in g)


def all_reduce(
    reduce_type: str, tensors: Sequence[torch.Tensor], scale: float, groups: Any
) -> list[torch.Tensor]:
    """Reduce `tensors` position-wise over this call's replicas (or their `groups`), times
    `scale`: one new tensor per position, for this replica."""
    replicas, index = current()  # type: ignore[misc]
    op = _REDUCE[reduce_type]
    _group_of(groups, replicas.count, index)  # validates before anyone waits

    def combine(per_replica: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        out = []
        with torch.no_grad():
            for r in range(replicas.count):
                group = _group_of(groups, replicas.count, r)
                reduced = []
                for j in range(len(per_replica[r])):
                    total = functools.reduce(op, [per_replica[g][j] for g in group])
                    reduced.append(total * scale if scale != 1.0 else total.clone())
                out.append(reduced)
        return out

    return replicas.exchange(index, list(tensors), combine)[index]


class _Dealer:
    """Deals the host loader's batches to the replicas, batch `k` to replica `k % N` (as torch_xla's
    ParallelLoader does; a last round too short for every replica is dropped), reading a round when
    a replica needs one. A replica whose read would put more than `limit` batches in waiting for
    another gives that one the turn first, so a loop without collectives keeps at most `limit`
    batches per replica in memory."""

    def __init__(self, loader: Iterable[Any], replicas: _Replicas, limit: int = 4) -> None:
        self._it = iter(loader)
        self._replicas = replicas
        self._limit = limit
        self._waiting: list[collections.deque[Any]] = [
            collections.deque() for _ in range(replicas.count)
        ]
        self._ended = False

    def take(self, index: int) -> Any:
        replicas = self._replicas
        while True:
            if self._waiting[index]:
                return self._waiting[index].popleft()
            if self._ended:
                return _END
            full = [
                j
                for j in range(replicas.count)
                if j != index and not replicas.done[j] and len(self._waiting[j]) >= self._limit
            ]
            if full:
                replicas.yield_turn(index)
                continue
            batch = []
            for _ in range(replicas.count):
                try:
                    batch.append(next(self._it))
                except StopIteration:
                    break
            if len(batch) < replicas.count:
                self._ended = True
                continue
            for j, data in enumerate(batch):
                if not replicas.done[j]:
                    self._waiting[j].append(data)


class _ReplicaLoader:
    """One replica's batches, on the device; each `next()` first ends the step (`mark_step`), as
    torch_xla's per-device loaders do."""

    def __init__(self, dealer: _Dealer, index: int, device: torch.device) -> None:
        self._dealer = dealer
        self._index = index
        self._device = device

    def __iter__(self) -> _ReplicaLoader:
        return self

    def __next__(self) -> Any:
        xla_model.mark_step()
        item = self._dealer.take(self._index)
        if item is _END:
            raise StopIteration
        return xla_model._map_tensors(item, lambda t: t.to(self._device))


class Context:
    """Per-replica state that lives as long as the `DataParallel` object (`getattr_or`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def getattr_or(self, name: str, defval: Any) -> Any:
        """The attribute `name`, first set to `defval` (called if callable) when missing."""
        value = getattr(self, name, None)
        if value is None:
            value = defval() if callable(defval) else defval
            setattr(self, name, value)
        return value


class DataParallel:
    """Replicas of a model over devices, one thread each (Note [DataParallel replicas]).

    Args:
        network: a `torch.nn.Module`, or a callable returning one; each replica gets a deep copy.
        device_ids: the devices to replicate over (default: `xm.get_xla_supported_devices()`).
            Empty: one replica running the module where it is (e.g. on the CPU).

    Example:
        >>> dp = DataParallel(MyModel)
        >>> def loop_fn(model, loader, device, context):
        ...     opt = context.getattr_or("opt", lambda: torch.optim.SGD(model.parameters(), 0.1))
        ...     for x, y in loader:
        ...         opt.zero_grad(); loss_fn(model(x), y).backward(); xm.optimizer_step(opt)
        >>> dp(loop_fn, train_loader)  # one epoch
    """

    def __init__(
        self, network: Any, device_ids: Sequence[Any] | None = None, **kwargs: Any
    ) -> None:
        if device_ids is None:
            device_ids = xla_model.get_xla_supported_devices()
        self._device_ids = [str(d) for d in device_ids]
        for d in self._device_ids:
            if torch.device(d).type not in (DEVICE_TYPE, "xla"):
                raise ValueError(
                    f"DataParallel(device_ids=...) takes lazyxla devices ({DEVICE_TYPE}:N, or "
                    f"'xla:N' under the torch_xla alias), got {d!r}; pass [] to run on the CPU"
                )
        self._kwargs = kwargs
        module = network if isinstance(network, torch.nn.Module) else network()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(
                f"DataParallel(network) takes an nn.Module or a callable returning one; "
                f"the callable returned {type(module).__name__}"
            )
        self._native_run = not self._device_ids
        if self._native_run:
            device = self._get_model_device(module)
            self._models = [module]
            self._device_ids = [device]
            self._contexts = [Context(torch.device(device))]
            return
        here = api.device()  # every replica's tensors live here (Note [DataParallel replicas])
        self._models = [copy.deepcopy(module).to(here) for _ in self._device_ids]
        self._contexts = [Context(here) for _ in self._device_ids]

    @property
    def devices(self) -> list[str]:
        return self._device_ids

    @property
    def models(self) -> list[torch.nn.Module]:
        return self._models

    @staticmethod
    def _get_model_device(model: torch.nn.Module) -> str:
        devices = {str(p.device) for p in model.parameters()}
        if len(devices) > 1:
            raise RuntimeError(f"Model uses more than one device: {sorted(devices)}")
        return devices.pop() if devices else "cpu"

    def __call__(
        self, loop_fn: Callable[..., Any], loader: Iterable[Any], batchdim: int = 0, **kwargs: Any
    ) -> list[Any]:
        """Run one epoch: `loop_fn(model, device_loader, device, context, **kwargs)` on every
        replica, each `device_loader` yielding that replica's batches on the device.

        Args:
            loop_fn: the per-replica loop.
            loader: the host data loader; batch `k` goes to replica `k % len(devices)`.
            batchdim: the batch dimension of the samples (kept for torch_xla compatibility).

        Returns:
            What `loop_fn` returned on each replica, in device order.
        """
        if not isinstance(batchdim, int):
            raise TypeError(f"DataParallel(...)(batchdim=...) takes an int, got {batchdim!r}")
        if self._native_run:
            device = torch.device(self._device_ids[0])
            return [loop_fn(self._models[0], loader, device, self._contexts[0], **kwargs)]
        xla_model.wait_device_ops()
        replicas = _Replicas(len(self._models))
        dealer = _Dealer(loader, replicas)
        results: list[Any] = [None] * replicas.count

        def run(index: int) -> None:
            error: BaseException | None = None
            try:
                replicas.start(index)
                _tls.replica = (replicas, index)
                context = self._contexts[index]
                device_loader = _ReplicaLoader(dealer, index, context.device)
                results[index] = loop_fn(
                    self._models[index], device_loader, context.device, context, **kwargs
                )
            except BaseException as e:
                error = e
            finally:
                _tls.replica = None
                replicas.finish(index, error)

        threads = [
            threading.Thread(target=run, args=(i,), name=f"lazyxla-replica-{i}", daemon=True)
            for i in range(replicas.count)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if replicas.error is not None:
            raise replicas.error
        xla_model.mark_step()
        return results
