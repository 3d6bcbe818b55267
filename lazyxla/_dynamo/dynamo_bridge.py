"""torch_xla's `torch_xla._dynamo.dynamo_bridge`: the trace-once bridge and its helpers."""

from .._src.dynamo import alias_with_buffer_donor_config as alias_with_buffer_donor_config
from .._src.dynamo import extract_compiled_graph as extract_compiled_graph
from .._src.dynamo_helpers import GraphInputMatcher as GraphInputMatcher
from .._src.dynamo_helpers import NoneRemover as NoneRemover
from .._src.dynamo_helpers import get_fallback_ops as get_fallback_ops
from .._src.tensor import is_lazy as is_xla_tensor

__all__ = [
    "alias_with_buffer_donor_config",
    "GraphInputMatcher",
    "NoneRemover",
    "extract_compiled_graph",
    "get_fallback_ops",
    "is_xla_tensor",
]
