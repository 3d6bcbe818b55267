"""torch_xla's FSDP wrap policies (`torch_xla.distributed.fsdp.wrap`).

A policy is called as `policy(module, recurse, unwrapped_params)`: with `recurse=True` it says
whether to look inside `module`, with `recurse=False` whether to wrap it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn


def always_wrap_policy(*args: Any, **kwargs: Any) -> bool:
    """Wrap every submodule."""
    return True


def lambda_auto_wrap_policy(
    module: nn.Module, recurse: bool, unwrapped_params: int, lambda_fn: Callable[[nn.Module], bool]
) -> bool:
    """Wrap the submodules for which `lambda_fn(module)` is true."""
    return True if recurse else lambda_fn(module)


def transformer_auto_wrap_policy(
    module: nn.Module, recurse: bool, unwrapped_params: int, transformer_layer_cls: Any
) -> bool:
    """Wrap each instance of `transformer_layer_cls` (a set of classes)."""
    return True if recurse else isinstance(module, tuple(transformer_layer_cls))


def size_based_auto_wrap_policy(
    module: nn.Module,
    recurse: bool,
    unwrapped_params: int,
    min_num_params: int = int(1e8),
    force_leaf_modules: set[type[nn.Module]] | None = None,
    exclude_wrap_modules: set[type[nn.Module]] | None = None,
) -> bool:
    """Wrap submodules holding at least `min_num_params` parameters not yet wrapped."""
    leaves = size_based_auto_wrap_policy.FORCE_LEAF_MODULES
    excluded = size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES
    leaves = leaves if force_leaf_modules is None else force_leaf_modules
    excluded = excluded if exclude_wrap_modules is None else exclude_wrap_modules
    large = unwrapped_params >= min_num_params
    if recurse:
        return large and not isinstance(module, tuple(leaves))
    return large and not isinstance(module, tuple(excluded))


size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {nn.ModuleList, nn.ModuleDict}  # type: ignore[attr-defined]
size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {nn.MultiheadAttention}  # type: ignore[attr-defined]


def recursive_wrap(
    module: nn.Module,
    auto_wrap_policy: Callable[..., bool],
    wrapper: Callable[[nn.Module], nn.Module],
    only_wrap_children: bool = False,
) -> tuple[nn.Module, int]:
    """Wrap `module`'s descendants (and `module` itself unless `only_wrap_children`) bottom-up
    where the policy says so; returns the (possibly wrapped) module and its unwrapped numel."""
    from .fsdp import XlaFullyShardedDataParallel

    if isinstance(module, XlaFullyShardedDataParallel):
        return module, 0
    numel = sum(p.numel() for p in module.parameters())
    if not auto_wrap_policy(module=module, recurse=True, unwrapped_params=numel):
        return module, 0
    wrapped = 0
    for name, child in module.named_children():
        new, n = recursive_wrap(child, auto_wrap_policy, wrapper)
        setattr(module, name, new)
        wrapped += n
    remainder = numel - wrapped
    if not only_wrap_children and auto_wrap_policy(
        module=module, recurse=False, unwrapped_params=remainder
    ):
        return wrapper(module), numel
    return module, wrapped


__all__ = [
    "always_wrap_policy",
    "lambda_auto_wrap_policy",
    "recursive_wrap",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]
