"""Pictures of shardings (torch_xla's `torch_xla.distributed.spmd.debugging`).

`construct_v1_sharding_str(t)` is `t`'s sharding in torch_xla's V1 string form
(`{devices=[4,2]0,1,...}`), the form lazyxla prints (Note [Sharding]).
"""

from ..._src.sharding import sharding_spec as construct_v1_sharding_str
from ..._src.spmd_model import visualize_sharding as visualize_sharding
from ..._src.spmd_model import visualize_tensor_sharding as visualize_tensor_sharding

__all__ = ["construct_v1_sharding_str", "visualize_sharding", "visualize_tensor_sharding"]
