"""torch_xla's `torch_xla.utils.dlpack`: `to_dlpack` / `from_dlpack` for lazy tensors (Note
[DLPack], `lazyxla/_src/dlpack.py`)."""

from .._src.dlpack import from_dlpack as from_dlpack
from .._src.dlpack import to_dlpack as to_dlpack

__all__ = ["from_dlpack", "to_dlpack"]
