"""torch_xla.experimental.distributed_checkpoint.util."""

from ..._src.dcp_manager import prime_optimizer as prime_optimizer

__all__ = ["prime_optimizer"]
