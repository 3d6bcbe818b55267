"""torch_xla's `torch_xla.distributed.fsdp`: FSDP v1 over processes (`lazyxla/_src/fsdp.py`)."""

from ..._src.fsdp import XlaFullyShardedDataParallel as XlaFullyShardedDataParallel
from ..._src.fsdp import checkpoint_module as checkpoint_module
from ..._src.fsdp_state_dict import (
    consolidate_sharded_model_checkpoints as consolidate_sharded_model_checkpoints,
)
from ..._src.fsdp_state_dict import (
    consolidate_sharded_state_dicts as consolidate_sharded_state_dicts,
)

__all__ = [
    "XlaFullyShardedDataParallel",
    "checkpoint_module",
    "consolidate_sharded_model_checkpoints",
    "consolidate_sharded_state_dicts",
]
