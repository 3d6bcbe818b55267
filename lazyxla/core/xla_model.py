"""torch_xla's `torch_xla.core.xla_model` (`xm`): steps, devices, data movement and collectives.

One process alone is one replica: ordinal 0, world size 1, and the collectives have their
one-replica meaning. Processes started by `torch_xla.launch` / `xmp.spawn` / torchrun are replicas
of one job, and the collectives cross them (Note [Cross-process collectives]).
"""

from .._src.py_utils import ToXlaTensorArena as ToXlaTensorArena
from .._src.xla_model import REDUCE_AND as REDUCE_AND
from .._src.xla_model import REDUCE_MAX as REDUCE_MAX
from .._src.xla_model import REDUCE_MIN as REDUCE_MIN
from .._src.xla_model import REDUCE_MUL as REDUCE_MUL
from .._src.xla_model import REDUCE_OR as REDUCE_OR
from .._src.xla_model import REDUCE_SUM as REDUCE_SUM
from .._src.xla_model import RateTracker as RateTracker
from .._src.xla_model import _fetch_gradients as _fetch_gradients
from .._src.xla_model import add_step_closure as add_step_closure
from .._src.xla_model import all_gather as all_gather
from .._src.xla_model import all_gather_bucketized as all_gather_bucketized
from .._src.xla_model import all_reduce as all_reduce
from .._src.xla_model import all_to_all as all_to_all
from .._src.xla_model import broadcast_master_param as broadcast_master_param
from .._src.xla_model import check_view_sharing as check_view_sharing
from .._src.xla_model import collective_broadcast as collective_broadcast
from .._src.xla_model import collective_permute as collective_permute
from .._src.xla_model import fork_rng as fork_rng
from .._src.xla_model import get_local_ordinal as get_local_ordinal
from .._src.xla_model import get_memory_info as get_memory_info
from .._src.xla_model import get_ordinal as get_ordinal
from .._src.xla_model import get_rng_state as get_rng_state
from .._src.xla_model import get_stablehlo as get_stablehlo
from .._src.xla_model import get_stablehlo_bytecode as get_stablehlo_bytecode
from .._src.xla_model import get_xla_supported_devices as get_xla_supported_devices
from .._src.xla_model import is_master_ordinal as is_master_ordinal
from .._src.xla_model import is_xla_tensor as is_xla_tensor
from .._src.xla_model import mark_step as mark_step
from .._src.xla_model import master_print as master_print
from .._src.xla_model import mesh_reduce as mesh_reduce
from .._src.xla_model import optimization_barrier_ as optimization_barrier_
from .._src.xla_model import optimizer_step as optimizer_step
from .._src.xla_model import recv as recv
from .._src.xla_model import reduce_gradients as reduce_gradients
from .._src.xla_model import reduce_scatter as reduce_scatter
from .._src.xla_model import reduce_scatter_bucketized as reduce_scatter_bucketized
from .._src.xla_model import rendezvous as rendezvous
from .._src.xla_model import save as save
from .._src.xla_model import send as send
from .._src.xla_model import send_cpu_data_to_device as send_cpu_data_to_device
from .._src.xla_model import set_rng_state as set_rng_state
from .._src.xla_model import unlazy as unlazy
from .._src.xla_model import wait_device_ops as wait_device_ops
from .._src.xla_model import xla_device as xla_device
from .._src.xla_model import xla_device_hw as xla_device_hw
from .._src.xla_model import xla_real_devices as xla_real_devices
from .._src.xla_model import xla_replication_devices as xla_replication_devices
from .._src.xla_model import xrt_world_size as xrt_world_size

__all__ = [
    "REDUCE_AND",
    "REDUCE_MAX",
    "REDUCE_MIN",
    "REDUCE_MUL",
    "REDUCE_OR",
    "REDUCE_SUM",
    "RateTracker",
    "ToXlaTensorArena",
    "add_step_closure",
    "all_gather",
    "all_gather_bucketized",
    "all_reduce",
    "all_to_all",
    "check_view_sharing",
    "broadcast_master_param",
    "collective_broadcast",
    "collective_permute",
    "get_local_ordinal",
    "get_memory_info",
    "get_ordinal",
    "fork_rng",
    "get_rng_state",
    "get_stablehlo",
    "get_stablehlo_bytecode",
    "is_master_ordinal",
    "is_xla_tensor",
    "mark_step",
    "master_print",
    "optimization_barrier_",
    "optimizer_step",
    "recv",
    "reduce_scatter",
    "reduce_scatter_bucketized",
    "save",
    "get_xla_supported_devices",
    "reduce_gradients",
    "mesh_reduce",
    "rendezvous",
    "send",
    "send_cpu_data_to_device",
    "set_rng_state",
    "unlazy",
    "wait_device_ops",
    "xla_device",
    "xla_device_hw",
    "xla_real_devices",
    "xla_replication_devices",
    "xrt_world_size",
]
