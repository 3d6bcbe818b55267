"""torch_xla.backends: the default precision of 32-bit matmuls and convolutions.

The precision is JAX's `jax_default_matmul_precision` ('default' | 'high' | 'highest'), which every
lowering of a dot or convolution inherits; changing it drops the compiled executables (they were
built at the old precision). On CPU XLA computes float32 dots in float32 at every level; on TPU the
levels are 1, 3 and 6 bf16 passes.
"""

from __future__ import annotations

import logging
from typing import Final, Literal

from . import xlac

logger = logging.getLogger("lazyxla.backends")

_WARNING_MESSAGE: Final[str] = (
    "Setting mat mul precision multiple times is not recommended. If you need to do so, please "
    "empirically verify that the precision setting is behaving as expected."
)
_DEFAULT: Final = "default"
_HIGH: Final = "high"
_HIGHEST: Final = "highest"
Precision = Literal["default", "high", "highest"]


def set_mat_mul_precision(precision: Precision) -> None:
    """Set the precision of 32-bit matmuls and convolutions: 'default', 'high' or 'highest'.

    Raises:
        ValueError: `precision` is not one of the three.
    """
    if precision not in (_DEFAULT, _HIGH, _HIGHEST):
        raise ValueError(
            f"Invalid precision: {precision}. Must be one of {_DEFAULT}, {_HIGH}, {_HIGHEST}."
        )
    logger.warning(_WARNING_MESSAGE)
    xlac._xla_set_mat_mul_precision(precision)


def get_mat_mul_precision() -> Precision:
    """The current precision of 32-bit matmuls and convolutions."""
    return xlac._xla_get_mat_mul_precision()  # type: ignore[return-value]
