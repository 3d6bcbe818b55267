"""Seeing inside: the IR, HLO and StableHLO of the graph a sync would run, and metrics."""

from .._src.debug import MemoryAnalysis as MemoryAnalysis
from .._src.debug import hlo_text as hlo_text
from .._src.debug import ir_text as ir_text
from .._src.debug import memory_analysis as memory_analysis
from .._src.debug import stablehlo_text as stablehlo_text
from .._src.sharding import sharding_spec as sharding_spec
from . import metrics as metrics

__all__ = [
    "MemoryAnalysis",
    "hlo_text",
    "ir_text",
    "memory_analysis",
    "metrics",
    "sharding_spec",
    "stablehlo_text",
]
