"""torch_xla.experimental.distributed_checkpoint: sharded checkpoints with
torch.distributed.checkpoint (see Note [Distributed checkpoint] in lazyxla/_src/dcp.py)."""

from ..._src.dcp import SPMDLoadPlanner as SPMDLoadPlanner
from ..._src.dcp import SPMDSavePlanner as SPMDSavePlanner
from ..._src.dcp_manager import CheckpointManager as CheckpointManager
from ..._src.dcp_manager import prime_optimizer as prime_optimizer

__all__ = ["CheckpointManager", "SPMDLoadPlanner", "SPMDSavePlanner", "prime_optimizer"]
