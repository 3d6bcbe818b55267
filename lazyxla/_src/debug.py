"""IR / HLO / StableHLO text of the graph that syncing some tensors would run."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import torch

from . import graph, ir
from .tensor import read, state


def ir_text(tensors: Sequence[torch.Tensor]) -> str:
    """The pending IR of `tensors`, in torch_xla's `_get_xla_tensors_text` layout.

    Example:
        >>> t = (a @ b + 1).relu()
        >>> print(lazyxla.debug.ir_text([t]))
        IR {
          %0 = f32[3,4]{1,0} xla::device_data(), xla_shape=f32[3,4]{1,0}
          ...
          %4 = f32[2,4]{1,0} aten::relu(%3), xla_shape=f32[2,4]{1,0}, ROOT=0
        }
    """
    return ir.to_text([read(state(t)) for t in tensors])


def _lowered(tensors: Sequence[torch.Tensor]) -> jax.stages.Lowered:
    states = [state(t) for t in tensors]
    for s in states:
        read(s)
    cap = graph.Capture(states)
    return jax.jit(cap.program().function()).lower(cap.data, cap.scalars)


def stablehlo_text(tensors: Sequence[torch.Tensor]) -> str:
    """The StableHLO (MLIR text) of the graph computing `tensors`; runs nothing."""
    return _lowered(tensors).as_text()


def hlo_text(tensors: Sequence[torch.Tensor]) -> str:
    """The HLO text of the graph computing `tensors` (torch_xla's `_get_xla_tensors_hlo`)."""
    return _lowered(tensors).compiler_ir("hlo").as_hlo_text()
