"""torch_xla's `torch_xla.distributed.parallel_loader` (`pl`): device loaders with background
prefetch.
"""

from .._src.parallel_loader import MpDeviceLoader as MpDeviceLoader
from .._src.parallel_loader import ParallelLoader as ParallelLoader
from .._src.parallel_loader import PerDeviceLoader as PerDeviceLoader

__all__ = ["MpDeviceLoader", "ParallelLoader", "PerDeviceLoader"]
