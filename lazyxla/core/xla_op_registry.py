"""torch_xla's `torch_xla.core.xla_op_registry` (`xor`): PyTorch ops from Op-builder functions."""

from .._src.op_builder import RegisteredOp as Op
from .._src.op_builder import register as register

__all__ = ["Op", "register"]
