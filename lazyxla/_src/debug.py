"""IR / HLO / StableHLO text of the graph that syncing some tensors would run."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

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
    """The HLO text of the graph computing `tensors` (torch_xla's `_get_xla_tensors_hlo`), in
    its layout: operands printed with their shapes (`sine(f32[4,4]{1,0} %p)`), no metadata."""
    from jaxlib._hlo import HloPrintOptions

    opts = HloPrintOptions()
    opts.print_operand_shape = True
    opts.print_metadata = False
    text = _lowered(tensors).compiler_ir("hlo").get_hlo_module().to_string(opts)
    # XLA names a dot after jax's primitive (`%dot_general.3`); torch_xla's HLO says `%dot.3`.
    if "%dot." not in text:
        text = re.sub(r"%dot_general\.(\d+)", r"%dot.\1", text)
    return text


class MemoryAnalysis(NamedTuple):
    """XLA's memory statistics of one compiled graph (`compiled.memory_analysis()`), in bytes.

    `temp_bytes` is the scratch memory the program needs beyond its arguments and outputs (the
    activations a step keeps alive); `alias_bytes` counts outputs written into donated inputs.
    """

    temp_bytes: int
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    generated_code_bytes: int
    host_temp_bytes: int
    host_argument_bytes: int
    host_output_bytes: int

    @property
    def total_bytes(self) -> int:
        """Arguments + outputs + temporaries, less the outputs aliased onto arguments."""
        return self.temp_bytes + self.argument_bytes + self.output_bytes - self.alias_bytes


def _stats(exe: Any) -> MemoryAnalysis:
    m = exe.memory_analysis()
    if m is None:
        raise RuntimeError("this platform's compiler gives no memory analysis")
    return MemoryAnalysis(
        temp_bytes=int(m.temp_size_in_bytes),
        argument_bytes=int(m.argument_size_in_bytes),
        output_bytes=int(m.output_size_in_bytes),
        alias_bytes=int(m.alias_size_in_bytes),
        generated_code_bytes=int(m.generated_code_size_in_bytes),
        host_temp_bytes=int(m.host_temp_size_in_bytes),
        host_argument_bytes=int(m.host_argument_size_in_bytes),
        host_output_bytes=int(m.host_output_size_in_bytes),
    )


def memory_analysis(tensors: Sequence[torch.Tensor] | None = None) -> MemoryAnalysis:
    """XLA's memory analysis of a compiled graph.

    Without arguments: the graph the last sync executed. With `tensors`: the graph that syncing
    them would run, compiled (through the graph cache, so a later sync reuses it) but not run.

    Example:
        >>> loss = model(x).sum(); loss.backward()
        >>> lazyxla.sync()
        >>> lazyxla.debug.memory_analysis().temp_bytes
        1048576
    """
    if tensors is None:
        if graph.last_executable is None:
            raise RuntimeError(
                "memory_analysis(): no graph has been executed yet; call lazyxla.sync() first, "
                "or pass the tensors whose graph to analyse"
            )
        return _stats(graph.last_executable)
    states = [state(t) for t in tensors]
    for s in states:
        read(s)
    pending = graph.pending_states(states)
    if not pending:
        raise ValueError(
            "memory_analysis(tensors): the tensors are already computed (device data), so there "
            "is no graph to analyse; pass tensors before the sync that computes them"
        )
    return _stats(graph.compile_capture(graph.Capture(pending)))
