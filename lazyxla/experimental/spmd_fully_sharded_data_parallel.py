"""FSDPv2: fully sharded data parallel through SPMD (torch_xla's module of the same name)."""

from .._src.spmd_model import SpmdFullyShardedDataParallel as SpmdFullyShardedDataParallel

__all__ = ["SpmdFullyShardedDataParallel"]
