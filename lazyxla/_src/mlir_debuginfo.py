"""torch_xla's `torch.ops.xla.write_mlir_debuginfo`: a string attached to the op that produced a
tensor, shown in the StableHLO text's location of that op.

# Note [MLIR debug info]
torch_xla prefixes the producing HLO instruction's name with
`<XLA_MLIR_DEBUGINFO_BEGIN>data<XLA_MLIR_DEBUGINFO_END>` and a pass after the HLO→MLIR conversion
turns that into the op's location (`loc("data")`). lazyxla does the same on its own IR: the op
recording `x`'s producer is copied under the prefixed name (same lowering rule, same descriptor,
so the compiled-graph cache is unaffected), and the prefix becomes a JAX named scope, so it is in
the op's MLIR location. `exported_program_to_stablehlo` then prints its text with locations inline
and each tagged location as `loc("data"(...))` (`debuginfo_text`). A tensor that no op produced (a
graph input) carries nothing. `StableHLOExportOptions(export_node_metadata=True)` tags every FX
node's outputs with torch.export's node metadata (`stack_trace`, `nn_module_stack`, ...) as JSON.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from .custom_call import XLA_LIB

BEGIN, END = "<XLA_MLIR_DEBUGINFO_BEGIN>", "<XLA_MLIR_DEBUGINFO_END>"

XLA_LIB.define("write_mlir_debuginfo(Tensor x, str data) -> Tensor")


def _write_lazy(x: torch.Tensor, data: str) -> torch.Tensor:
    from .ir import TensorSpec
    from .tensor import new_tensor, read, state

    node, k = read(state(x))
    if not node.inputs:  # a graph input or constant: no op to annotate
        return x
    tagged = node.with_inputs(node.inputs)
    tagged.op = f"{BEGIN}{data}{END}{node.op}"
    return new_tensor((tagged, k), TensorSpec(tuple(x.shape), x.dtype))


XLA_LIB.impl("write_mlir_debuginfo", lambda x, data: x.clone(), "CompositeExplicitAutograd")
XLA_LIB.impl("write_mlir_debuginfo", _write_lazy, "PrivateUse1")
XLA_LIB.impl("write_mlir_debuginfo", lambda x, data: torch.empty_like(x), "Meta")
torch.library.register_autograd(
    "xla::write_mlir_debuginfo",
    lambda ctx, grad: (grad, None),
    setup_context=lambda ctx, inputs, output: None,
)


def write_mlir_debuginfo(x: torch.Tensor, data: str) -> torch.Tensor:
    """`x`, with `data` attached to the StableHLO location of the op that produced it."""
    return torch.ops.xla.write_mlir_debuginfo(x, data)


_TAGGED = re.compile(
    r'loc\("[^"\\]*(?:\\.[^"\\]*)*?'
    + re.escape(BEGIN)
    + r"(.*?)"
    + re.escape(END)
    + r'(?:[^"\\]|\\.)*"'
)


def debuginfo_text(mlir_text: str) -> str:
    """The module's text with locations inline and each tagged one as `loc("data"...)`."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    with mlir.make_ir_context():
        module = ir.Module.parse(mlir_text)
        text = module.operation.get_asm(enable_debug_info=True, use_local_scope=True)
    return _TAGGED.sub(lambda m: f'loc("{m.group(1)}"', text)


def tag_outputs(value: Any, data: str) -> Any:
    """Every lazy tensor in `value` tagged with `data` (for `export_node_metadata`)."""
    import torch.utils._pytree as pytree

    from .tensor import DEVICE_TYPE

    def tag(t: torch.Tensor) -> torch.Tensor:
        return _write_lazy(t, data) if t.device.type == DEVICE_TYPE else t

    return pytree.tree_map_only(torch.Tensor, tag, value)
