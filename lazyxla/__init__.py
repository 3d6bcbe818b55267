"""lazyxla: the PyTorch/XLA programming model in pure Python, on JAX."""

from ._src import runtime as _runtime  # noqa: F401  (configures JAX before anything else)
from ._src import tensor as _tensor  # noqa: F401  (registers the 'jax' device)
from ._src.ops import install as _install

_install()

from ._src.api import (  # noqa: E402
    device as device,
    device_count as device_count,
    devices as devices,
    manual_seed as manual_seed,
    real_devices as real_devices,
    sync as sync,
)

__version__ = "0.1.0"
