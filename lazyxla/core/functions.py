"""torch_xla's `torch_xla.core.functions` (`xf`): differentiable collectives and SyncBatchNorm."""

from .._src.functions import AllGather as AllGather
from .._src.functions import AllReduce as AllReduce
from .._src.functions import AllReduceSumLayer as AllReduceSumLayer
from .._src.functions import SyncBatchNorm as SyncBatchNorm
from .._src.functions import all_gather as all_gather
from .._src.functions import all_reduce as all_reduce
from .._src.functions import distributed_mm as distributed_mm

__all__ = [
    "AllGather",
    "AllReduce",
    "AllReduceSumLayer",
    "SyncBatchNorm",
    "all_gather",
    "all_reduce",
    "distributed_mm",
]
