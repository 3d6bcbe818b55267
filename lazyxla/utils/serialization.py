"""torch_xla's `torch_xla.utils.serialization` (`xser`): `save` / `load` with one file per tensor
(Note [xser format], `lazyxla/_src/serialization.py`)."""

from .._src.serialization import TensorReference as TensorReference
from .._src.serialization import load as load
from .._src.serialization import save as save

__all__ = ["TensorReference", "load", "save"]
