"""torch_xla's `torch_xla.experimental.xla_dynamic_reshape_ops`: `torch.ops.xla.dynamic_view` and
`torch.ops.xla.dynamic_expand` (Note [Unbounded dynamism] in
`lazyxla/_src/unbounded_dynamism.py`)."""

from .._src.unbounded_dynamism import dynamic_expand as dynamic_expand
from .._src.unbounded_dynamism import dynamic_view as dynamic_view

__all__ = ["dynamic_expand", "dynamic_view"]
