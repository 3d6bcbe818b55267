"""torch_xla's `torch_xla.utils.serialization` (`xser`): save a nested structure's lazy tensors
one file each, and load them back as CPU tensors.

# Note [xser format]
`save(data, path)` writes `path` with `torch.save` of `data` in which every lazy tensor is
replaced by a `TensorReference(i)`, and writes tensor `i` (moved to the CPU) to
`path + ".tensors/tensor_i.pt"`.
All lazy tensors are computed in one graph first. `load(path)` reads the structure back and swaps
each reference for its tensor, on the CPU (as torch_xla's does; move it with `.to(device)` or
`load_state_dict`). Tensors that are already on the CPU are pickled inline. Each lazy tensor is
saved on its own, so two views of one base come back as two tensors: recreate views after loading.
The nested walk is `utils.for_each_instance_rewrite`'s (tuples come back as lists, as in torch_xla).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch

from . import graph, runtime_api
from .py_utils import for_each_instance, for_each_instance_rewrite
from .tensor import is_lazy, state


class TensorReference:
    """Stands for the `tid`-th saved tensor in a file written by `save`."""

    def __init__(self, tid: int) -> None:
        self.tid = tid


def _tensors_folder(path: str) -> str:
    return path + ".tensors"


def _tensor_file(folder: str, tid: int) -> str:
    return os.path.join(folder, f"tensor_{tid}.pt")


def _should_write(master_only: bool, global_master: bool) -> bool:
    if not master_only:
        return True
    ordinal = runtime_api.global_ordinal() if global_master else runtime_api.local_ordinal()
    return ordinal == 0


def save(data: Any, path: str, master_only: bool = True, global_master: bool = False) -> None:
    """Save `data` (any nesting of lists, tuples, dicts, sets and objects) to `path`, each lazy
    tensor moved to the CPU into its own file under `path + ".tensors"` (Note [xser format]).

    Args:
        data: what to save.
        path: the destination file. With `master_only=False` every process writes, so each needs
            its own path.
        master_only: only the master process writes (the others still compute the tensors).
        global_master: with `master_only`, only global ordinal 0 writes, not each host's master.
    """
    lazy: list[torch.Tensor] = []
    for_each_instance(data, is_lazy, lazy.append)
    if lazy:
        graph.sync_states([state(t) for t in lazy])
    write = _should_write(master_only, global_master)
    folder = _tensors_folder(path)
    if write:
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        os.mkdir(folder)
    index = {id(t): i for i, t in enumerate(lazy)}

    def reference(t: torch.Tensor) -> TensorReference:
        tid = index[id(t)]
        if write:
            cpu = t.detach().cpu()
            if isinstance(t, torch.nn.Parameter):
                cpu = torch.nn.Parameter(cpu, requires_grad=t.requires_grad)
            torch.save(cpu, _tensor_file(folder, tid))
        return TensorReference(tid)

    ref_data = for_each_instance_rewrite(data, is_lazy, reference)
    if write:
        torch.save(ref_data, path)


def load(path: str) -> Any:
    """The data `save` wrote to `path`, with its tensors on the CPU (Note [xser format])."""
    ref_data = torch.load(path, weights_only=False)
    folder = _tensors_folder(path)

    def tensor(ref: TensorReference) -> torch.Tensor:
        file = _tensor_file(folder, ref.tid)
        if not os.path.exists(file):
            raise FileNotFoundError(
                f"{path} refers to tensor {ref.tid}, but {file} is missing: the {folder} folder "
                "written with it must stay next to it"
            )
        return torch.load(file, weights_only=False)

    return for_each_instance_rewrite(ref_data, lambda v: type(v) is TensorReference, tensor)
