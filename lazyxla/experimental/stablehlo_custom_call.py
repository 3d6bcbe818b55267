"""torch_xla's `torch_xla.experimental.stablehlo_custom_call`: host offloading
(`place_to_host`, `place_to_device`); see Note [Host offloading] in `lazyxla/_src/offload.py`."""

from .._src.offload import place_to_device as place_to_device
from .._src.offload import place_to_host as place_to_host

__all__ = ["place_to_device", "place_to_host"]
