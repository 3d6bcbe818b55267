"""torch_xla.experimental.distributed_checkpoint.planners."""

from ..._src.dcp import SPMDLoadPlanner as SPMDLoadPlanner
from ..._src.dcp import SPMDSavePlanner as SPMDSavePlanner

__all__ = ["SPMDLoadPlanner", "SPMDSavePlanner"]
