"""torch_xla's `torch_xla.experimental.scan`: `scan(fn, init, xs)` lowered to `jax.lax.scan`."""

from lazyxla._src.scan import _SCAN_COMPUTATION_CACHE as _SCAN_COMPUTATION_CACHE
from lazyxla._src.scan import _scan_impl_pytree as _scan_impl_pytree
from lazyxla._src.scan import scan as scan
from lazyxla._src.scan import split as split
from lazyxla._src.scan import tree_flatten_none as tree_flatten_none
from lazyxla._src.scan import value_and_grad_partitioned as value_and_grad_partitioned

__all__ = ["scan", "split", "tree_flatten_none", "value_and_grad_partitioned"]
