"""torch_xla's `torch_xla.distributed.spmd.api`: DTensor meshes and placements onto SPMD."""

from ..._src.spmd_api import auto_policy as auto_policy
from ..._src.spmd_api import convert_to_xla_mesh as convert_to_xla_mesh
from ..._src.spmd_api import convert_to_xla_partition_spec as convert_to_xla_partition_spec
from ..._src.spmd_api import with_xla as with_xla
from ..._src.spmd_api import xla_distribute_module as xla_distribute_module
from ..._src.spmd_api import xla_distribute_tensor as xla_distribute_tensor

__all__ = [
    "auto_policy",
    "convert_to_xla_mesh",
    "convert_to_xla_partition_spec",
    "with_xla",
    "xla_distribute_module",
    "xla_distribute_tensor",
]
