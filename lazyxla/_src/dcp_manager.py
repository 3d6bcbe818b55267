"""Per-step checkpoints (torch_xla's `CheckpointManager`), optimizer priming, and the preemption
sync point that triggers a checkpoint on SIGTERM."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import pickle
import signal
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import fsspec
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dist_cp
from fsspec.core import url_to_fs
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

from . import dcp, distributed

_MANAGER_METADATA_FILE = ".manager_metadata"
_log = logging.getLogger("lazyxla")


# --- preemption ----------------------------------------------------------------------------------

# Note [Preemption sync point]
# A preempted job gets SIGTERM on some of its processes, some time before it is killed. Every
# process must then checkpoint at the same step, or the checkpoint's collectives hang. As
# torch_xla's PreemptionSyncManager: SIGTERM only sets a flag; the next `sync_point_reached(step)`
# on a signalled process announces step + 1 through the coordinator's key-value store (the first
# announcement wins), and every process, signalled or not, answers True at exactly that step.
# Processes that run collectives every step are at most one step apart, so none has passed the
# announced step when it learns of it. With one process the signalled step itself is the point.
_PREEMPT_KEY = "lazyxla/preemption_step"


class _Preemption:
    def __init__(self) -> None:
        self.active = False
        self.signalled = threading.Event()
        self.point: int | None = None
        self.previous: Any = None

    def activate(self) -> None:
        if self.active:
            return
        self.previous = signal.signal(signal.SIGTERM, lambda *_: self.signalled.set())
        self.active = True

    def deactivate(self) -> None:
        if self.active:
            signal.signal(signal.SIGTERM, self.previous or signal.SIG_DFL)
        self.active, self.point, self.previous = False, None, None
        self.signalled.clear()

    def reached(self, step: int) -> bool:
        if not self.active:
            raise RuntimeError(
                "the preemption sync manager is not active: create the CheckpointManager with "
                "chkpt_on_preemption=True (or call _activate_preemption_sync_manager())"
            )
        if self.point is None:
            self.point = self._agreed(step)
        return self.point is not None and step == self.point

    def _agreed(self, step: int) -> int | None:
        if distributed.process_count() == 1:
            return step if self.signalled.is_set() else None
        client = distributed._client()
        if self.signalled.is_set():
            try:
                client.key_value_set(_PREEMPT_KEY, str(step + 1))
            except Exception:  # noqa: BLE001 - another process announced first
                pass
        try:
            return int(client.key_value_try_get(_PREEMPT_KEY))
        except Exception:  # noqa: BLE001 - not announced yet (the store says NOT_FOUND)
            return None


_preemption = _Preemption()


def activate_preemption_sync_manager() -> None:
    _preemption.activate()


def deactivate_preemption_sync_manager() -> None:
    _preemption.deactivate()


def sync_point_reached(step: int) -> bool:
    """True at the step every process checkpoints at after a SIGTERM (Note [Preemption sync
    point])."""
    return _preemption.reached(step)


# --- the manager ---------------------------------------------------------------------------------


@dataclasses.dataclass
class _CheckpointMetadata:
    step: int
    ts: datetime.datetime


class CheckpointManager:
    """Checkpoints identified by step under one directory (any fsspec URL), as torch_xla's:
    `save` / `save_async` every step (a checkpoint is taken every `save_interval` steps, or at
    the preemption sync point), `restore(step, state_dict)` in place, `all_steps()`, `join()`.

    Args:
        path: the base directory; checkpoint `step` is written to `path/step`.
        save_interval: steps between checkpoints.
        max_to_keep: how many checkpoints to keep (oldest by creation time deleted); 0 keeps all.
        max_pending_async: async checkpoints that may be pending before `save_async` blocks.
        num_of_threads: threads writing files.
        process_group: the group coordinating the checkpoint (default: a new group of the
            default process group; with one process torch.distributed need not be initialised).
        chkpt_on_preemption: take a checkpoint at the preemption sync point after SIGTERM.

    Example:
        >>> mgr = CheckpointManager("/ckpt/run1", save_interval=100)
        >>> state = {"model": model.state_dict(), "optim": optim.state_dict()}
        >>> mgr.save_async(step, state)
    """

    def __init__(
        self,
        path: str,
        save_interval: int,
        max_to_keep: int | None = 0,
        max_pending_async: int | None = 1,
        num_of_threads: int | None = 1,
        process_group: Any = None,
        chkpt_on_preemption: bool = True,
    ) -> None:
        if save_interval <= 0:
            raise ValueError(f"save_interval must be positive, got {save_interval}")
        if max_pending_async <= 0:
            raise ValueError(f"max_pending_async must be positive, got {max_pending_async}")
        if max_to_keep < 0:
            raise ValueError(f"max_to_keep must be non-negative, got {max_to_keep}")
        initialized = dist.is_available() and dist.is_initialized()
        if not initialized and distributed.process_count() > 1:
            raise RuntimeError(
                "CheckpointManager with several processes needs a process group: call "
                "dist.init_process_group('gloo', init_method='xla://') first"
            )
        self.base_path = os.path.join(path, "")
        self.save_interval = save_interval
        self.max_to_keep = max_to_keep
        self.num_of_threads = num_of_threads
        self.chkpt_on_preemption = chkpt_on_preemption
        self.pg = process_group or (dist.new_group() if initialized else None)
        self._async_worker_pool = ThreadPoolExecutor(max_workers=1)
        self._async_sem = threading.Semaphore(max_pending_async)
        self._async_futures: list[Future] = []
        self._save_mutex = threading.Lock()
        self._tracked_chkpts = self._load_tracked_chkpts()
        if chkpt_on_preemption:
            activate_preemption_sync_manager()

    def _rank(self) -> int:
        return dist.get_rank(self.pg) if self.pg is not None else 0

    def _load_tracked_chkpts(self) -> deque[_CheckpointMetadata]:
        found, invalid = [], []
        fs, raw = url_to_fs(self.base_path)
        if not fs.exists(raw):
            fs.makedirs(raw, exist_ok=True)
        else:
            for path in fs.ls(raw, detail=False):
                try:
                    with fs.open(os.path.join(path, _MANAGER_METADATA_FILE), "rb") as f:
                        found.append(pickle.load(f))
                except Exception:  # noqa: BLE001 - not a finished checkpoint of this manager
                    invalid.append(path)
        if invalid:
            _log.warning("Ignoring invalid checkpoints: %s", invalid)
        return deque(sorted(found, key=lambda m: m.ts))

    def _get_path(self, step: int) -> str:
        return os.path.join(self.base_path, str(step))

    def _delete_chkpt_at_step(self, step: int) -> None:
        if self._rank() == 0:
            fs, raw = url_to_fs(self._get_path(step))
            if fs.exists(raw):
                fs.rm(raw, recursive=True)

    def _release_oldest_checkpoints(self) -> None:
        while self.max_to_keep > 0 and len(self._tracked_chkpts) > self.max_to_keep:
            self._delete_chkpt_at_step(self._tracked_chkpts.popleft().step)

    def _wait_for_data(self) -> None:
        from . import api

        api.sync(wait=True)

    def _save(self, step: int, state_dict: dict) -> None:
        with self._save_mutex:
            path = self._get_path(step)
            self._delete_chkpt_at_step(step)
            self._tracked_chkpts = deque(m for m in self._tracked_chkpts if m.step != step)
            dist_cp.save(
                state_dict=state_dict,
                storage_writer=FsspecWriter(
                    path, thread_count=self.num_of_threads, per_thread_copy_ahead=0
                ),
                planner=dcp.SPMDSavePlanner(),
                process_group=self.pg,
            )
            metadata = _CheckpointMetadata(step=step, ts=datetime.datetime.now())
            self._tracked_chkpts.append(metadata)
            if self._rank() == 0:
                with fsspec.open(os.path.join(path, _MANAGER_METADATA_FILE), "wb") as f:
                    pickle.dump(metadata, f)
                self._release_oldest_checkpoints()

    def should_save(self, step: int) -> bool:
        """True at every `save_interval`-th step, and at the preemption sync point."""
        preempted = self.chkpt_on_preemption and self.reached_preemption(step)
        if preempted:
            _log.warning("Preemption sync point reached at step %d. Triggering a checkpoint.", step)
        return step % self.save_interval == 0 or preempted

    def save(self, step: int, state_dict: dict, force: bool | None = False) -> bool:
        """Checkpoint `state_dict` now if `should_save(step)` (or `force`); True if taken."""
        if self.should_save(step) or force:
            self._wait_for_data()
            self._save(step, state_dict)
            return True
        return False

    def save_async(self, step: int, state_dict: dict, force: bool | None = False) -> bool:
        """As `save`, but the state dict is copied to the host and written by a background
        thread; blocks only while `max_pending_async` checkpoints are already pending."""
        if self.should_save(step) or force:
            self._wait_for_data()
            cpu_state_dict = dcp._sharded_cpu_state_dict(state_dict)
            self._async_sem.acquire()
            future = self._async_worker_pool.submit(self._save, step, cpu_state_dict)
            future.add_done_callback(lambda _: self._async_sem.release())
            self._async_futures.append(future)
            return True
        return False

    def restore(self, step: int, state_dict: dict) -> None:
        """Load the checkpoint of `step` into `state_dict` in place (then call the model's and
        optimizer's `load_state_dict` for non-tensor values)."""
        tracked = {m.step for m in self._tracked_chkpts}
        if step not in tracked:
            raise ValueError(
                f"Cannot restore from untracked step {step}. Valid steps are: {sorted(tracked)}"
            )
        dist_cp.load(
            state_dict=state_dict,
            storage_reader=FsspecReader(self._get_path(step)),
            planner=dcp.SPMDLoadPlanner(),
            process_group=self.pg,
        )

    def all_steps(self) -> list[int]:
        """Every step with a tracked checkpoint, ascending."""
        return sorted(m.step for m in self._tracked_chkpts)

    def join(self) -> None:
        """Wait for pending async checkpoints; re-raises the first one's error."""
        wait(self._async_futures)
        futures, self._async_futures = self._async_futures, []
        for f in futures:
            f.result()

    def reached_preemption(self, step: int) -> bool:
        """True if `step` is the preemption sync point (Note [Preemption sync point])."""
        if not self.chkpt_on_preemption:
            raise RuntimeError(
                "Preemption detection not enabled. Please set `chkpt_on_preemption` when "
                "creating the CheckpointManager"
            )
        return sync_point_reached(step)


def prime_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Create `optimizer`'s state with one step on zero gradients, so a checkpoint can be loaded
    into it in place. The step changes the parameters (weight decay, momentum): call it only
    right before restoring a checkpoint."""
    from . import api, sharding

    api.sync(wait=True)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                named = sharding._sharding_of(p)
                ann = sharding.state(p).sharding
                if ann is not None and ann is not sharding.MANUAL:
                    sharding.annotate(p.grad, ann, named)
    optimizer.step()
    api.sync(wait=True)
    return optimizer


def ensure_xla_coordinator_initialized(
    global_rank: int, world_size: int, master_addr: str, port: Any = None
) -> None:
    """torch_xla's `_XLAC._ensure_xla_coordinator_initialized`: lazyxla joins JAX's coordinator
    from the job's environment when the backend starts; this checks that it is the job asked
    for."""
    del master_addr, port
    distributed.ensure_initialized()
    have = (distributed.process_index(), distributed.process_count())
    if have != (global_rank, world_size):
        raise RuntimeError(
            f"the coordinator was asked for process {global_rank} of {world_size}, but this "
            f"process is {have[0]} of {have[1]} (set by LAZYXLA_NUM_PROCESSES/LAZYXLA_PROCESS_ID "
            "or torchrun's WORLD_SIZE/RANK)"
        )


def local_shard_replica_and_indices(tensors: list[torch.Tensor]) -> list[list[tuple]]:
    """torch_xla's `_XLAC._get_local_shard_replica_and_indices`: per tensor, (replica id,
    indices) of each local shard, by device id."""
    out = []
    for t in tensors:
        shape = tuple(t.shape)
        out.append([(sh.replica_id, dcp._slices(sh.index, shape)) for sh in dcp._local_shards(t)])
    return out


# `torch_xla._XLAC` entry name -> function of this module (the alias forwards to them lazily).
XLAC_ENTRIES = {
    "_ensure_xla_coordinator_initialized": "ensure_xla_coordinator_initialized",
    "_activate_preemption_sync_manager": "activate_preemption_sync_manager",
    "_deactivate_preemption_sync_manager": "deactivate_preemption_sync_manager",
    "_sync_point_reached": "sync_point_reached",
    "_get_local_shard_replica_and_indices": "local_shard_replica_and_indices",
}
