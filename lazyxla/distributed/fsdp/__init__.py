"""torch_xla's `torch_xla.distributed.fsdp`: FSDP v1 over processes (`lazyxla/_src/fsdp.py`)."""

from ..._src.fsdp import XlaFullyShardedDataParallel as XlaFullyShardedDataParallel
from ..._src.fsdp import checkpoint_module as checkpoint_module

__all__ = ["XlaFullyShardedDataParallel", "checkpoint_module"]
