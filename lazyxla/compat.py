"""The opt-in `torch_xla` alias: `install()` makes torch_xla programs import lazyxla.

Example:
    >>> import lazyxla.compat
    >>> lazyxla.compat.install()
    >>> import torch_xla, torch_xla.core.xla_model as xm
    >>> torch_xla.device()
    device(type='jax', index=0)

`lazyxla run script.py` runs a script with the alias installed. See Note [The torch_xla alias] in
`lazyxla/_src/compat.py`.
"""

from ._src.compat import TorchXlaFinder as TorchXlaFinder
from ._src.compat import install as install
from ._src.compat import is_installed as is_installed
from ._src.compat import real_torch_xla as real_torch_xla
from ._src.compat import uninstall as uninstall

__all__ = ["TorchXlaFinder", "install", "is_installed", "real_torch_xla", "uninstall"]
