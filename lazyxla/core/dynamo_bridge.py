"""torch_xla's `torch_xla.core.dynamo_bridge`, backed by lazyxla's trace-once backend.

See Note [Trace once] in lazyxla/_src/dynamo.py.
"""

from __future__ import annotations

from .._src.dynamo import extract_compiled_graph as extract_compiled_graph
from .._src.tensor import is_lazy as is_xla_tensor

__all__ = ["extract_compiled_graph", "is_xla_tensor"]
