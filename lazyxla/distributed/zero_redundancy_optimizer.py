"""torch_xla's `torch_xla.distributed.zero_redundancy_optimizer`: ZeRO-1."""

from .._src.zero1 import ZeroRedundancyOptimizer as ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
