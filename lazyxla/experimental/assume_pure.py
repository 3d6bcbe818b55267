"""torch_xla's `torch_xla.experimental.assume_pure`: pure functions traced once and replayed."""

from .._src.assume_pure import _XLA_COMPUTATION_CACHE as _XLA_COMPUTATION_CACHE
from .._src.assume_pure import PureModule as PureModule
from .._src.assume_pure import assume_pure as assume_pure
from .._src.assume_pure import assume_pure_torch as assume_pure_torch

__all__ = ["_XLA_COMPUTATION_CACHE", "PureModule", "assume_pure", "assume_pure_torch"]
