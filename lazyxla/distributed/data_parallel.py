"""torch_xla's `torch_xla.distributed.data_parallel`: `DataParallel`, model replicas in threads
averaging their gradients (Note [DataParallel replicas], `lazyxla/_src/data_parallel.py`)."""

from .._src.data_parallel import Context as Context
from .._src.data_parallel import DataParallel as DataParallel
from .._src.data_parallel import ReplicaAborted as ReplicaAborted

__all__ = ["Context", "DataParallel", "ReplicaAborted"]
