"""torch_xla's `torch_xla.experimental.gru`: a GRU whose time loop is one scan per layer."""

from .._src.gru import GRU as GRU

__all__ = ["GRU"]
