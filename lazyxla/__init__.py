"""lazyxla: the PyTorch/XLA programming model in pure Python, on JAX."""
# ruff: noqa: E402  (JAX is configured and the device registered before the public imports)

from ._src import runtime as _runtime  # noqa: F401  (configures JAX before anything else)
from ._src import tensor as _tensor  # noqa: F401  (registers the 'jax' device)
from ._src.ops import install as _install

_install()
from . import _fastpath as _fastpath  # noqa: F401  (Note [Transformer fast path])
from . import debug as debug
from ._src.api import apply_environment as _apply_environment
from ._src.api import compile as compile  # noqa: A001  (torch_xla.compile)
from ._src.api import device as device
from ._src.api import device_count as device_count
from ._src.api import devices as devices
from ._src.api import launch as launch
from ._src.api import manual_seed as manual_seed
from ._src.api import real_devices as real_devices
from ._src.api import step as step
from ._src.api import sync as sync

_apply_environment()  # XLA_USE_SPMD, XLA_METRICS_FILE

from ._src import xla_backend as _xla_backend

_xla_backend.register()  # dist.init_process_group("xla", init_method="xla://"), as torch_xla

__version__ = "0.1.0"


def __getattr__(name: str):
    # torch_xla 2.9 has these two at its top level; imported on first use (export is heavy).
    if name in ("save_as_stablehlo", "save_torch_model_as_stablehlo"):
        from . import stablehlo

        return getattr(stablehlo, name)
    raise AttributeError(f"module 'lazyxla' has no attribute {name!r}")
