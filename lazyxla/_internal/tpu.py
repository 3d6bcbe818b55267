"""torch_xla's `torch_xla._internal.tpu`: TPU host facts (from environment variables)."""

from .._src.internal_tpu import MeshShape as MeshShape
from .._src.internal_tpu import get_tpu_env as get_tpu_env
from .._src.internal_tpu import get_tpu_type as get_tpu_type
from .._src.internal_tpu import get_worker_ips as get_worker_ips
from .._src.internal_tpu import num_available_chips as num_available_chips
from .._src.internal_tpu import num_available_devices as num_available_devices
from .._src.internal_tpu import num_expected_global_devices as num_expected_global_devices
from .._src.internal_tpu import num_local_processes as num_local_processes
from .._src.internal_tpu import num_logical_cores_per_chip as num_logical_cores_per_chip
from .._src.internal_tpu import num_tpu_workers as num_tpu_workers
from .._src.internal_tpu import process_bounds_size as process_bounds_size
from .._src.internal_tpu import task_id as task_id
from .._src.internal_tpu import version as version
from .._src.internal_tpu import worker_id as worker_id
