"""The helpers of torch_xla's `torch_xla._dynamo.dynamo_bridge` that tests and tools use.

`NoneRemover` strips and restores the None entries of an output list (AOTAutograd's backward
graphs return None for inputs without gradients); `GraphInputMatcher` maps a traced graph's
device-data inputs back to the call's arguments (by tensor id) or to the values captured at trace
time. lazyxla's own trace-once backend (Note [Trace once]) needs neither: it replays the FX graph.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from . import metrics


class NoneRemover:
    """Remove Nones from a list or tuple, remembering where they were; `add_nones` restores them."""

    def __init__(self) -> None:
        self.none_poslist: list[int] = []

    def remove_nones(self, value_list: Any) -> Any:
        if isinstance(value_list, list):
            for i in reversed(range(len(value_list))):
                if value_list[i] is None:
                    self.none_poslist.append(i)
                    del value_list[i]
            self.none_poslist.reverse()
            return value_list
        if isinstance(value_list, tuple):
            kept = []
            for i, v in enumerate(value_list):
                if v is None:
                    self.none_poslist.append(i)
                else:
                    kept.append(v)
            return tuple(kept)
        raise TypeError("value_list must be a list or a tuple.")

    def add_nones(self, value_list: Any) -> Any:
        if isinstance(value_list, list):
            for pos in self.none_poslist:
                value_list.insert(pos, None)
            return value_list
        if isinstance(value_list, tuple):
            out = list(value_list)
            for pos in self.none_poslist:
                out.insert(pos, None)
            return tuple(out)
        raise TypeError("value_list must be a list or a tuple.")


@dataclasses.dataclass
class GraphInputMatcher:
    """The inputs of a traced graph for a new call: arguments by position where the input was an
    argument (by tensor id), the trace-time value otherwise."""

    tensor_id_to_arg_idx: dict[int, int]
    graph_input_tensor_ids: list[int]
    graph_input_xla_values: list[torch.Tensor]
    xla_args_tensor_id: set[int]

    def __post_init__(self) -> None:
        self.graph_input_xla_values = [
            None if tid in self.xla_args_tensor_id else value
            for tid, value in zip(self.graph_input_tensor_ids, self.graph_input_xla_values)
        ]
        self.arg_idxs = [self.tensor_id_to_arg_idx.get(t) for t in self.graph_input_tensor_ids]

    def __call__(self, args: Any) -> list[torch.Tensor]:
        out = []
        for value, arg_idx in zip(self.graph_input_xla_values, self.arg_idxs):
            if arg_idx is None:
                if value is None:
                    raise AssertionError("Traced Tensor cannot be None.")
                out.append(value)
            else:
                out.append(args[arg_idx])
        return out


def get_fallback_ops() -> list[str]:
    return metrics.executed_fallback_ops()
