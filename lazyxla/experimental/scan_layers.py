"""torch_xla's `torch_xla.experimental.scan_layers`: identical layers as one scan."""

from lazyxla._src.scan_layers import _ONE_LAYER_CACHE as _ONE_LAYER_CACHE
from lazyxla._src.scan_layers import scan_layers as scan_layers

__all__ = ["scan_layers"]
