"""torch_xla's `torch_xla.runtime` (`xr`): devices, processes, SPMD mode and the compilation
cache.
"""

from ._src.runtime_api import addressable_device_count as addressable_device_count
from ._src.runtime_api import addressable_runtime_device_count as addressable_runtime_device_count
from ._src.runtime_api import device_type as device_type
from ._src.runtime_api import global_device_count as global_device_count
from ._src.runtime_api import global_ordinal as global_ordinal
from ._src.runtime_api import global_runtime_device_attributes as global_runtime_device_attributes
from ._src.runtime_api import global_runtime_device_count as global_runtime_device_count
from ._src.runtime_api import host_index as host_index
from ._src.runtime_api import initialize_cache as initialize_cache
from ._src.runtime_api import is_spmd as is_spmd
from ._src.runtime_api import local_device_count as local_device_count
from ._src.runtime_api import local_ordinal as local_ordinal
from ._src.runtime_api import local_process_count as local_process_count
from ._src.runtime_api import process_count as process_count
from ._src.runtime_api import process_index as process_index
from ._src.runtime_api import runtime_device_attributes as runtime_device_attributes
from ._src.runtime_api import set_device_type as set_device_type
from ._src.runtime_api import use_spmd as use_spmd
from ._src.runtime_api import world_size as world_size

__all__ = [
    "addressable_device_count",
    "addressable_runtime_device_count",
    "device_type",
    "global_device_count",
    "global_ordinal",
    "global_runtime_device_attributes",
    "global_runtime_device_count",
    "host_index",
    "initialize_cache",
    "is_spmd",
    "local_device_count",
    "local_ordinal",
    "local_process_count",
    "process_count",
    "process_index",
    "runtime_device_attributes",
    "set_device_type",
    "use_spmd",
    "world_size",
]
