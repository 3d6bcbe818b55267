"""torch_xla's `torch_xla.utils.checkpoint`: activation checkpointing whose recomputation XLA
cannot merge back into the forward (Note [Checkpointing], `lazyxla/_src/remat.py`)."""

from .._src.remat import CheckpointFunction as CheckpointFunction
from .._src.remat import checkpoint as checkpoint
from .._src.remat import save_matmuls_context_fn as save_matmuls_context_fn

__all__ = ["CheckpointFunction", "checkpoint", "save_matmuls_context_fn"]
