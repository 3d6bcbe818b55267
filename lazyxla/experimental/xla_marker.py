"""torch_xla's `torch_xla.experimental.xla_marker`: `torch.ops.xla.mark_tensor` and its attribute
helpers (Note [Pattern markers] in `lazyxla/_src/custom_call.py`)."""

from .._src.custom_call import check_composite_attr as _assert_valid_composite_attr
from .._src.custom_call import deserialize_composite_attr as deserialize_composite_attr
from .._src.custom_call import serialize_composite_attr as serialize_composite_attr

__all__ = ["_assert_valid_composite_attr", "deserialize_composite_attr", "serialize_composite_attr"]
