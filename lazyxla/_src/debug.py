"""IR / HLO / StableHLO text of the graph that syncing some tensors would run."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import torch

from . import graph, ir, sharding
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
    its layout: operands printed with their shapes (`sine(f32[4,4]{1,0} %p)`), no metadata, and
    torch_xla's names where JAX's differ (Note [HLO text as torch_xla prints it])."""
    from jaxlib._hlo import HloPrintOptions

    opts = HloPrintOptions()
    opts.print_operand_shape = True
    opts.print_metadata = False
    try:
        with _gspmd_annotations():
            lowered = _lowered(tensors)
    except Exception:  # (a program only Shardy lowers: its annotations then stay Shardy's)
        lowered = _lowered(tensors)
    return _torch_xla_names(lowered.compiler_ir("hlo").get_hlo_module().to_string(opts))


# Note [HLO text as torch_xla prints it]
# torch_xla's HLO text of a graph names its instructions after XLA's opcodes and its parameters
# `p<number>` (`%p1.4 = f32[2,3]{1,0} parameter(1)`), and annotates shardings in XLA's GSPMD form
# (`custom_call_target="Sharding", sharding={devices=[1,8]<=[8]}`, `parameter(0),
# sharding={replicated}`), the strings users grep for. JAX's HLO names a dot after its primitive
# (`%dot_general.3`), a sharding annotation `%sharding_constraint.2`, a parameter after its
# argument (`%data_0_.1`), and lowers shardings for the Shardy partitioner (a frontend attribute
# per instruction). So the text is lowered with GSPMD annotations (the executable still compiles
# through Shardy: only this text changes) and those names are printed as torch_xla's. The numbers
# after the dots are XLA's own, not torch_xla's builder's.
def _gspmd_annotations() -> Any:
    return jax._src.config.use_shardy_partitioner(False)


_PARAMETER = re.compile(r"%([A-Za-z_][\w]*)\.(\d+) = (.*?) parameter\((\d+)\)")


def _torch_xla_names(text: str) -> str:
    entry = re.search(r"^ENTRY .*?^}", text, re.M | re.S)
    params = _PARAMETER.finditer(entry[0]) if entry else ()
    renames = {f"{m[1]}.{m[2]}": f"p{m[4]}.{m[2]}" for m in params}
    for prefix, opcode in (("dot_general", "dot"), ("sharding_constraint", "custom-call")):
        for name in re.findall(rf"%({prefix}\.\d+)\b", text):
            renames[name] = opcode + name[len(prefix) :]
    kept = set(re.findall(r"%([\w.-]+)", text)) - set(renames)
    new_names = set(renames.values())
    if len(new_names) < len(renames) or new_names & kept:
        return text  # (a clash: JAX's names are kept)
    text = re.sub(r"%([\w.-]+)", lambda m: "%" + renames.get(m[1], m[1]), text)
    # (the ENTRY signature names its parameters without a %)
    text = re.sub(
        r"^(ENTRY [^(]*\()(.*?)(\) ->)",
        lambda m: (
            m[1] + re.sub(r"([\w.-]+):", lambda p: renames.get(p[1], p[1]) + ":", m[2]) + m[3]
        ),
        text,
        flags=re.M,
    )
    if not sharding.is_spmd():  # (one device: JAX's committed arguments, no annotation to see)
        text = text.replace(", sharding={replicated}", "")
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
