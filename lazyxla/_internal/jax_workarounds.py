"""torch_xla's `torch_xla._internal.jax_workarounds`.

torch_xla must claim the TPU before JAX does and hide MegaScale from JAX's client; lazyxla *is*
JAX's client, so the guard only initialises the runtime, and the helpers return JAX itself.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from .._src import runtime


def jax_import_guard() -> None:
    """Initialise the runtime (the devices) before JAX is used directly."""
    runtime.jax_devices()


def requires_jax(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func`, run after `jax_import_guard()`."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        jax_import_guard()
        return func(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def jax_env_context() -> Iterator[None]:
    yield


def maybe_get_jax(log: bool = True) -> Any:
    import jax

    return jax


def maybe_get_torchax() -> Any:
    """torchax if it is installed (lazyxla does not need it), else None."""
    try:
        import torchax
    except ImportError:
        return None
    return torchax
