"""torch_xla.experimental.distributed_checkpoint.manager."""

from ..._src.dcp_manager import CheckpointManager as CheckpointManager

__all__ = ["CheckpointManager"]
