"""torch_xla.distributed.fsdp.state_dict_utils."""

from ..._src.fsdp_state_dict import (
    consolidate_sharded_model_checkpoints as consolidate_sharded_model_checkpoints,
)
from ..._src.fsdp_state_dict import (
    consolidate_sharded_state_dicts as consolidate_sharded_state_dicts,
)

__all__ = ["consolidate_sharded_model_checkpoints", "consolidate_sharded_state_dicts"]
