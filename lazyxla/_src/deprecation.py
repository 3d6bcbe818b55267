"""torch_xla's deprecation helpers: an old name that forwards to the new function and warns once."""

from __future__ import annotations

import functools
import importlib
import logging
import types
from collections.abc import Callable
from typing import Any, TypeVar

FN = TypeVar("FN", bound=Callable[..., Any])


def deprecated(
    module: types.ModuleType, new: FN, old_name: str | None = None, extra_msg: str | None = None
) -> FN:
    """`new`, wrapped to log (once, at WARNING) that `module.old_name` is deprecated for it.

    Example:
        >>> old = deprecated(sys.modules[__name__], new_function, "old_function")
        >>> old()  # logs: __main__.old_function is deprecated. Use __main__.new_function ...
    """
    name = old_name or new.__name__
    warned = False

    @functools.wraps(new)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        nonlocal warned
        if not warned:
            msg = (
                f"{module.__name__}.{name} is deprecated. "
                f"Use {new.__module__}.{new.__name__} instead."
            )
            logging.warning(msg + (f" {extra_msg}" if extra_msg else ""))
            warned = True
        return new(*args, **kwargs)

    return wrapped  # type: ignore[return-value]


def mark_deprecated(new: FN, extra_msg: str | None = None) -> Callable[[Callable[..., Any]], FN]:
    """Decorator: the decorated function becomes a deprecated alias of `new` (its body never
    runs)."""

    def decorator(func: Callable[..., Any]) -> FN:
        module = importlib.import_module(func.__module__)
        return deprecated(module, new, old_name=func.__name__, extra_msg=extra_msg)

    return decorator


def register_deprecated(module: types.ModuleType, new: FN, extra_msg: str | None = None) -> None:
    """Set `module.<new's name>` to a deprecated alias of `new`."""
    setattr(module, new.__name__, deprecated(module, new, extra_msg=extra_msg))
