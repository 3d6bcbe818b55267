"""Pictures of shardings (torch_xla's `torch_xla.distributed.spmd.debugging`)."""

from ..._src.spmd_model import visualize_sharding as visualize_sharding
from ..._src.spmd_model import visualize_tensor_sharding as visualize_tensor_sharding

__all__ = ["visualize_sharding", "visualize_tensor_sharding"]
