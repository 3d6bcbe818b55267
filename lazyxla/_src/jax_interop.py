"""Calling a JAX function on lazyxla tensors (torch_xla's `xla_builder.call_jax`).

# Note [call_jax]
`call_jax(f, args, kwargs)` records one node whose lowering rule is `f` itself: the lazy tensors
among the (pytree) arguments become the node's inputs, every other leaf is static and baked into
the rule. Output shapes come from `jax.eval_shape`, once per (function, argument structure, input
specs, static leaves) and cached (`_CACHE`); the node's descriptor carries that cache entry's
number, so two different functions never share a compiled graph and the same call on new data
hits the cache. `f` runs inside the step's single `jax.jit`, so it fuses with the torch ops
around it, and it must be traceable (pure, static shapes).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax
import torch
from torch.utils import _pytree as pytree

from . import runtime
from .ir import Node, Ref, TensorSpec
from .tensor import is_lazy, new_tensor, read, state


class _Entry:
    __slots__ = ("uid", "rule", "out_tree", "specs", "calls")

    def __init__(self, uid: int, rule: Any, out_tree: Any, specs: tuple[TensorSpec, ...]) -> None:
        self.uid, self.rule, self.out_tree, self.specs = uid, rule, out_tree, specs
        self.calls = 0


_CACHE: dict[Any, _Entry] = {}
_uids = itertools.count()


def cache_size() -> int:
    """How many (function, input signature) pairs have been traced."""
    return len(_CACHE)


def _static_key(v: Any) -> Any:
    try:
        hash(v)
        return (type(v), v)
    except TypeError:
        return ("id", id(v))


def call_jax(
    jax_func: Callable[..., Any],
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    name: str | None = None,
    override_hash: Any = None,
) -> Any:
    """`jax_func(*args, **kwargs)` with lazyxla tensors passed as JAX arrays; returns lazyxla
    tensors in the same pytree structure (see Note [call_jax])."""
    kwargs = kwargs or {}
    leaves, tree = pytree.tree_flatten((tuple(args), kwargs))
    positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    for i in positions:
        if not is_lazy(leaves[i]):
            raise TypeError(
                f"call_jax: argument leaf {i} is a {leaves[i].device} tensor; move it to the "
                "lazyxla device first (.to(torch_xla.device()))"
            )
    states = [state(leaves[i]) for i in positions]
    values = tuple(read(s) for s in states)
    in_specs = tuple(v[0].specs[v[1]] for v in values)
    statics = tuple(
        (i, _static_key(v)) for i, v in enumerate(leaves) if not isinstance(v, torch.Tensor)
    )
    key = (override_hash or id(jax_func), str(tree), in_specs, statics)
    entry = _CACHE.get(key)
    if entry is None:
        template = [None if isinstance(v, torch.Tensor) else v for v in leaves]

        def call(*arrays: Any) -> Any:
            filled = list(template)
            for i, a in zip(positions, arrays):
                filled[i] = a
            a, kw = pytree.tree_unflatten(filled, tree)
            return jax_func(*a, **kw)

        shapes = [jax.ShapeDtypeStruct(sp.shape, runtime.jnp_dtype(sp.dtype)) for sp in in_specs]
        out = jax.eval_shape(call, *shapes)
        out_leaves, out_tree = jax.tree_util.tree_flatten(out)

        def rule(*arrays: Any) -> tuple[Any, ...]:
            return tuple(jax.tree_util.tree_leaves(call(*arrays)))

        specs = tuple(
            TensorSpec(tuple(o.shape), runtime.NP_TO_TORCH[jax.numpy.dtype(o.dtype)])
            for o in out_leaves
        )
        entry = _CACHE[key] = _Entry(next(_uids), rule, out_tree, specs)
    entry.calls += 1
    if not entry.specs:
        return jax.tree_util.tree_unflatten(entry.out_tree, [])
    op = f"xla::call_jax({name or getattr(jax_func, '__name__', 'fn')})"
    node = Node(
        op,
        entry.rule,
        values,
        tuple(Ref(i) for i in range(len(values))),
        (),
        entry.specs,
        desc_extra=("call_jax", entry.uid),
    )
    outs = [new_tensor((node, k), sp) for k, sp in enumerate(entry.specs)]
    return jax.tree_util.tree_unflatten(entry.out_tree, outs)
