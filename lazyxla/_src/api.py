"""The top-level `lazyxla.*` functions (torch_xla's `torch_xla.*`)."""

from __future__ import annotations

import torch

from . import graph, random_state, runtime
from .tensor import DEVICE_TYPE


def device(index: int | None = None) -> torch.device:
    """The lazyxla device (`jax:0` unless `index` is given); always carries an explicit index."""
    return torch.device(DEVICE_TYPE, 0 if index is None else index)


def devices() -> list[torch.device]:
    return [torch.device(DEVICE_TYPE, i) for i in range(device_count())]


def device_count() -> int:
    return len(runtime.jax_devices())


def real_devices() -> list[str]:
    """The PJRT devices behind `devices()`, named as torch_xla names them (`CPU:0`)."""
    return [f"{d.platform.upper()}:{d.id}" for d in runtime.jax_devices()]


def sync(wait: bool = False) -> None:
    """Run the pending graph of all live lazy tensors; afterwards they hold device data."""
    graph.sync(wait=wait)


def manual_seed(seed: int) -> None:
    """Seed the device RNG (also done by `torch.manual_seed`)."""
    random_state.manual_seed(seed)
