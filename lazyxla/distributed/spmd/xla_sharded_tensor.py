"""torch_xla's `torch_xla.distributed.spmd.xla_sharded_tensor`: the sharded tensor's view types."""

from ..._src.sharding import XLAShard as XLAShard
from ..._src.sharding import XLAShardedTensor as XLAShardedTensor

__all__ = ["XLAShard", "XLAShardedTensor"]
