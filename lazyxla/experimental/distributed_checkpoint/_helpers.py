"""torch_xla.experimental.distributed_checkpoint._helpers (names its tests import)."""

from ..._src.dcp import FLATTEN_MAPPING as FLATTEN_MAPPING
from ..._src.dcp import _CpuShards as _CpuShards
from ..._src.dcp import _is_sharded_tensor as _is_sharded_tensor
from ..._src.dcp import _sharded_cpu_state_dict as _sharded_cpu_state_dict
from ..._src.dcp import _unwrap_xla_sharded_tensor as _unwrap_xla_sharded_tensor
from ..._src.dcp import dedup_tensors as dedup_tensors
from ..._src.dcp import flatten_state_dict as flatten_state_dict
from ..._src.dcp import narrow_tensor_by_index as narrow_tensor_by_index
from ..._src.dcp import set_element as set_element
