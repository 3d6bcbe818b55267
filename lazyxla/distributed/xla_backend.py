"""torch_xla's `torch_xla.distributed.xla_backend`: the `xla` c10d backend (registered when
lazyxla is imported) and its process group."""

from .._src.xla_backend import ProcessGroupXla as ProcessGroupXla
from .._src.xla_backend import register as _register

_register()

__all__ = ["ProcessGroupXla"]
