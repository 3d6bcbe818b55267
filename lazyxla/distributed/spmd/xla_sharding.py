"""torch_xla's `torch_xla.distributed.spmd.xla_sharding`: the module behind `xs`."""

from ..._src.hybrid_mesh import HybridMesh as HybridMesh
from ..._src.manual import disable_manual_sharding as disable_manual_sharding
from ..._src.manual import enable_manual_sharding as enable_manual_sharding
from ..._src.manual import mark_manual_sharding as _mark_manual_sharding
from ..._src.sharding import Mesh as Mesh
from ..._src.sharding import ShardingSpec as ShardingSpec
from ..._src.sharding import ShardingType as ShardingType
from ..._src.sharding import XLAShard as XLAShard
from ..._src.sharding import XLAShardedTensor as XLAShardedTensor
from ..._src.sharding import clear_sharding as clear_sharding
from ..._src.sharding import get_1d_mesh as get_1d_mesh
from ..._src.sharding import get_global_mesh as get_global_mesh
from ..._src.sharding import mark_sharding as mark_sharding
from ..._src.sharding import mark_sharding_with_gradients as mark_sharding_with_gradients
from ..._src.sharding import set_global_mesh as set_global_mesh
from ..._src.sharding import wrap_if_sharded as wrap_if_sharded
from ..._src.spmd_extra import EinsumLinear as EinsumLinear
from ..._src.spmd_extra import MarkShardingFunction as MarkShardingFunction
from ..._src.spmd_extra import PartitionSpec as PartitionSpec
from ..._src.spmd_extra import annotate_custom_sharding as annotate_custom_sharding
from ..._src.spmd_extra import apply_xla_patch_to_nn_linear as apply_xla_patch_to_nn_linear
from ..._src.spmd_extra import shard_as as shard_as
from ..._src.spmd_extra import unwrap_sharded_tensor as unwrap_sharded_tensor
from ..._src.spmd_extra import wrap_as_sharded_tensor as wrap_as_sharded_tensor
from ..._src.spmd_model import XLAPatchedLinear as XLAPatchedLinear
from ..._src.spmd_model import (
    apply_backward_optimization_barrier as apply_backward_optimization_barrier,
)
from ..._src.spmd_model import xla_patched_nn_linear_forward as xla_patched_nn_linear_forward

__all__ = [
    "EinsumLinear",
    "HybridMesh",
    "MarkShardingFunction",
    "Mesh",
    "PartitionSpec",
    "ShardingSpec",
    "ShardingType",
    "XLAPatchedLinear",
    "XLAShard",
    "XLAShardedTensor",
    "annotate_custom_sharding",
    "apply_backward_optimization_barrier",
    "apply_xla_patch_to_nn_linear",
    "clear_sharding",
    "disable_manual_sharding",
    "enable_manual_sharding",
    "_mark_manual_sharding",
    "get_1d_mesh",
    "get_global_mesh",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "set_global_mesh",
    "shard_as",
    "unwrap_sharded_tensor",
    "wrap_as_sharded_tensor",
    "wrap_if_sharded",
    "xla_patched_nn_linear_forward",
]
