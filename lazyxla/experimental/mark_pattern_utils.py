"""torch_xla's `torch_xla.experimental.mark_pattern_utils` (Note [Pattern markers] in
`lazyxla/_src/custom_call.py`)."""

from .._src.custom_call import StableHLOCompositeBuilder as StableHLOCompositeBuilder

__all__ = ["StableHLOCompositeBuilder"]
