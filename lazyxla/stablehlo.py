"""torch_xla's `torch_xla.stablehlo`: export a `torch.export` program to StableHLO, save it, load
it and run it (through JAX), or run its `jax.export` form without PyTorch.
See Note [StableHLO export] in `lazyxla/_src/export.py`."""

from ._src.export import InputLocation as InputLocation
from ._src.export import StableHLOExportOptions as StableHLOExportOptions
from ._src.export import StableHLOFunc as StableHLOFunc
from ._src.export import StableHLOFunctionMeta as StableHLOFunctionMeta
from ._src.export import StableHLOGraphModule as StableHLOGraphModule
from ._src.export import StableHLOModelBundle as StableHLOModelBundle
from ._src.export import VariableSignature as VariableSignature
from ._src.export import VariableType as VariableType
from ._src.export import _run_decompositions as _run_decompositions
from ._src.export import exported_program_to_stablehlo as exported_program_to_stablehlo
from ._src.export import save_as_stablehlo as save_as_stablehlo
from ._src.export import save_torch_model_as_stablehlo as save_torch_model_as_stablehlo

__all__ = [
    "InputLocation",
    "StableHLOExportOptions",
    "StableHLOFunc",
    "StableHLOFunctionMeta",
    "StableHLOGraphModule",
    "StableHLOModelBundle",
    "VariableSignature",
    "VariableType",
    "exported_program_to_stablehlo",
    "save_as_stablehlo",
    "save_torch_model_as_stablehlo",
]
