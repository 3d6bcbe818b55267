"""torch_xla's `torch_xla.experimental.stablehlo_custom_call`: `stablehlo_custom_call` (Note [Custom
calls] in `lazyxla/_src/custom_call.py`) and host offloading (`place_to_host`, `place_to_device`;
Note [Host offloading] in `lazyxla/_src/offload.py`)."""

from .._src.custom_call import (
    extract_custom_call_outputs_shape_dtype as extract_custom_call_outputs_shape_dtype,
)
from .._src.custom_call import stablehlo_custom_call as stablehlo_custom_call
from .._src.offload import place_to_device as place_to_device
from .._src.offload import place_to_host as place_to_host

__all__ = [
    "extract_custom_call_outputs_shape_dtype",
    "place_to_device",
    "place_to_host",
    "stablehlo_custom_call",
]
