"""torch_xla's `torch_xla.experimental.xla_mlir_debuginfo`: `torch.ops.xla.write_mlir_debuginfo`
(Note [MLIR debug info] in `lazyxla/_src/mlir_debuginfo.py`)."""

from .._src.mlir_debuginfo import write_mlir_debuginfo as write_mlir_debuginfo

__all__ = ["write_mlir_debuginfo"]
