"""torch_xla's `torch_xla.distributed.parallel_loader` (`pl`): device loaders with prefetch.

A loader thread pulls batches from the CPU data loader; transfer threads copy them to the device
while the current step runs; iterating yields batches already on the device. As in torch_xla, each
`next()` first syncs (`batches_per_execution` batches make one step), so a loop over an
`MpDeviceLoader` needs no explicit `mark_step`.

Transfer threads only copy host data to device buffers (`jax.device_put`); the lazy tensors that
wrap those buffers are made on the consuming thread, since the IR and the live-tensor registry are
not thread-safe.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from . import analysis, graph, runtime_api, xla_model

_END = object()  # end of the data, sent once per transfer thread
_POLL_S = 0.1


class _Uploaded:
    """A device buffer made from CPU tensor `t`, waiting to be wrapped as a lazy tensor."""

    __slots__ = ("array", "cpu")

    def __init__(self, array: Any, cpu: torch.Tensor) -> None:
        self.array = array
        self.cpu = cpu


def _map(data: Any, fn: Any, leaf: type) -> Any:
    if isinstance(data, leaf):
        return fn(data)
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*[_map(x, fn, leaf) for x in data])
    if isinstance(data, (list, tuple)):
        return type(data)(_map(x, fn, leaf) for x in data)
    if isinstance(data, dict):
        return type(data)((k, _map(v, fn, leaf)) for k, v in data.items())
    return data


class _Pipeline:
    """Queues and threads of one ParallelLoader; holds no reference back to it."""

    def __init__(
        self,
        loader: Iterable[Any],
        devices: list[torch.device],
        loader_prefetch_size: int,
        device_prefetch_size: int,
        transfer_threads: int,
        upload_on_thread: bool,
    ) -> None:
        self.devices = devices
        self.transfer_threads = transfer_threads
        self.upload_on_thread = upload_on_thread
        self.done = threading.Event()
        self.errors: queue.Queue[BaseException] = queue.Queue()
        self.host_queues = {d: queue.Queue(loader_prefetch_size) for d in devices}
        self.device_queues = {d: queue.Queue(device_prefetch_size) for d in devices}
        self.ended = dict.fromkeys(devices, 0)
        self.threads = [threading.Thread(target=self._load, args=(loader,), daemon=True)]
        for d in devices:
            for _ in range(transfer_threads):
                self.threads.append(threading.Thread(target=self._transfer, args=(d,), daemon=True))
        for t in self.threads:
            t.start()

    def _put(self, q: queue.Queue[Any], item: Any) -> bool:
        while not self.done.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _load(self, loader: Iterable[Any]) -> None:
        try:
            it = iter(loader)
            while not self.done.is_set():
                batch = []
                for _ in self.devices:
                    try:
                        batch.append(next(it))
                    except StopIteration:
                        break
                if len(batch) < len(self.devices):  # a remainder too short for every device
                    break
                for d, data in zip(self.devices, batch):
                    if not self._put(self.host_queues[d], data):
                        return
        except BaseException as e:
            self.errors.put(e)
        finally:
            for d in self.devices:
                for _ in range(self.transfer_threads):
                    self._put(self.host_queues[d], _END)

    def _transfer(self, device: torch.device) -> None:
        while not self.done.is_set():
            try:
                data = self.host_queues[device].get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if data is not _END and self.upload_on_thread:
                try:
                    data = _map(data, lambda t: _Uploaded(xla_model.upload(t), t), torch.Tensor)
                except BaseException as e:
                    self.errors.put(e)
                    data = _END
            if not self._put(self.device_queues[device], data) or data is _END:
                return

    def next_item(self, device: torch.device) -> Any:
        q = self.device_queues[device]
        while True:
            if self.ended[device] >= self.transfer_threads:
                return _END
            item = q.get()
            if item is _END:
                self.ended[device] += 1
                continue
            if self.upload_on_thread:
                return _map(item, lambda u: xla_model.wrap_uploaded(u.array, u.cpu), _Uploaded)
            return item  # on the host: PerDeviceLoader.next places it (_shard_batch)

    def close(self) -> None:
        self.done.set()
        for qs in (self.host_queues, self.device_queues):
            for q in qs.values():
                while True:
                    try:
                        q.get_nowait()
                    except queue.Empty:
                        break


class PerDeviceLoader:
    """The iterator over one device's batches (`ParallelLoader.per_device_loader(device)`)."""

    def __init__(self, loader: ParallelLoader, device: torch.device) -> None:
        self._loader = loader
        self._device = device
        self._mark_step_batch_count = loader.batches_per_execution - 1
        self._batches_yielded = 0

    def __iter__(self) -> PerDeviceLoader:
        return self

    def __next__(self) -> Any:
        return self.next()

    def __len__(self) -> int:
        return self._loader.per_device_samples()

    def next(self) -> Any:
        """Sync the previous step (every `batches_per_execution` batches), then the next batch."""
        if self._mark_step_batch_count <= self._batches_yielded:
            self._batches_yielded = 0
            graph.sync(cause=analysis.PARALLEL_LOADER)
        else:
            self._batches_yielded += 1
        item = self._loader._pipeline.next_item(self._device)
        if item is _END:
            errors = self._loader._pipeline.errors
            if not errors.empty():
                raise errors.get()
            graph.sync(cause=analysis.PARALLEL_LOADER)
            raise StopIteration
        sharding = self._loader._input_sharding
        if sharding is None and not runtime_api.spmd_mode():
            return item
        return _shard_batch(item, sharding, self._device)


def _shard_batch(item: Any, sharding: Any, device: Any) -> Any:
    """A batch's CPU tensors on the device with their `input_sharding` (a ShardingSpec, or a dict
    from batch keys to ShardingSpecs), as torch_xla's loader places them; errors as torch_xla's:
    a dict sharding needs a dict batch (ValueError) holding only keys it names (KeyError)."""
    if isinstance(sharding, dict):
        if not isinstance(item, dict):
            raise ValueError("input batch should be a dict when input sharding is a dict.")
        missing = [k for k in item if sharding and k not in sharding]
        if missing:
            raise KeyError(f"Keys: {missing} are missing from input_sharding.")
        return {
            k: xla_model.send_cpu_data_to_device(v, device, sharding.get(k))[0]
            if isinstance(v, torch.Tensor)
            else xla_model.send_cpu_data_to_device(v, device, sharding.get(k))
            for k, v in item.items()
        }
    if isinstance(item, torch.Tensor):
        return xla_model.send_cpu_data_to_device(item, device, sharding)[0]
    return xla_model.send_cpu_data_to_device(item, device, sharding)


class ParallelLoader:
    """Feeds batches of `cpu_loader` to `devices`, prefetched on background threads.

    Args:
        cpu_loader: any iterable of batches (nested lists/tuples/dicts of CPU tensors).
        devices: the devices to feed; batch `i` goes to device `i % len(devices)`.
        batchdim: the batch dimension (kept for torch_xla compatibility).
        batches_per_execution: batches per step: `next()` syncs every this many batches.
        loader_prefetch_size: CPU batches buffered ahead per device.
        device_prefetch_size: device batches buffered ahead per device.
        host_to_device_transfer_threads: transfer threads per device.
        input_sharding: an SPMD `ShardingSpec` applied to each batch tensor (or a dict mapping
            the keys of dict batches to specs).
    """

    def __init__(
        self,
        cpu_loader: Iterable[Any],
        devices: Sequence[torch.device | str],
        batchdim: int = 0,
        batches_per_execution: int = 1,
        loader_prefetch_size: int = 16,
        device_prefetch_size: int = 8,
        host_to_device_transfer_threads: int = 1,
        input_sharding: Any = None,
    ) -> None:
        self._loader = cpu_loader
        self._devices = [torch.device(d) for d in devices]
        self._batchdim = batchdim
        self.batches_per_execution = batches_per_execution
        self._input_sharding = input_sharding
        # SPMD placement happens on the consuming thread, through the ordinary `.to(device)`.
        on_thread = input_sharding is None and not runtime_api.spmd_mode()
        self._pipeline = _Pipeline(
            cpu_loader,
            self._devices,
            loader_prefetch_size,
            device_prefetch_size,
            host_to_device_transfer_threads,
            on_thread,
        )

    def per_device_loader(self, device: torch.device | str) -> PerDeviceLoader:
        """The iterator of `device`'s batches."""
        return PerDeviceLoader(self, torch.device(device))

    def per_device_samples(self) -> int:
        return len(self._loader) // len(self._devices)  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop the background threads (also done when the loader is garbage collected)."""
        self._pipeline.close()

    def __del__(self) -> None:
        self._pipeline.close()


class MpDeviceLoader:
    """Wraps a CPU data loader; each `iter()` is one epoch of device batches.

    Args:
        loader: the CPU data loader.
        device: the device to put batches on.
        **kwargs: `ParallelLoader` options (`batches_per_execution`, `input_sharding`, ...).

    Example:
        >>> for x, y in pl.MpDeviceLoader(train_loader, torch_xla.device()):
        ...     train_step(x, y)   # x, y are already on the device; each next() syncs
    """

    def __init__(self, loader: Iterable[Any], device: torch.device | str, **kwargs: Any) -> None:
        self._loader = loader
        self._device = torch.device(device)
        self._parallel_loader_kwargs = kwargs

    def __iter__(self) -> PerDeviceLoader:
        parallel_loader = ParallelLoader(
            self._loader, [self._device], **self._parallel_loader_kwargs
        )
        return parallel_loader.per_device_loader(self._device)

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]
