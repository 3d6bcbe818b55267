"""The lowering registry: aten OpOverload → a pure jnp/lax rule.

A rule receives the op's arguments in schema order: tensors as `jax.Array`s, everything else as
Python
statics (lifted scalars arrive as 0-d arrays). It returns an array or a tuple/list of arrays;
outputs are
cast to the dtypes PyTorch's meta kernels computed at record time. Registering an op twice is an
error
naming the first site.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from torch._ops import OpOverload, OpOverloadPacket


@dataclasses.dataclass(frozen=True)
class Lowering:
    op: OpOverload
    rule: Callable[..., Any]
    # Scalar arguments that shape the program (arange's bounds): baked in, not lifted to inputs.
    static: frozenset[str]
    # Float arguments lifted to graph inputs although their schema type is `float` (an optimizer's
    # lr).
    lift: frozenset[str]
    # Needs the RNG: the rule gets a `key` keyword argument (a jax PRNG key).
    random: bool
    site: str


LOWERINGS: dict[OpOverload, Lowering] = {}


def is_const(v: Any, c: float) -> bool:
    """True if `v` is the Python number `c` (lifted scalars arrive traced: never constants)."""
    return type(v) in (int, float, bool) and v == c


def _overloads(op: OpOverload | OpOverloadPacket) -> list[OpOverload]:
    if isinstance(op, OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


def lowering(
    *ops: OpOverload | OpOverloadPacket,
    static: tuple[str, ...] = (),
    lift: tuple[str, ...] = (),
    random: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `rule` as the lowering of `ops` (a packet registers all its overloads)."""

    def deco(rule: Callable[..., Any]) -> Callable[..., Any]:
        site = f"{inspect.getsourcefile(rule)}:{inspect.getsourcelines(rule)[1]}"
        for packet in ops:
            for op in _overloads(packet):
                register(op, rule, static=static, lift=lift, random=random, site=site)
        return rule

    return deco


def register(
    op: OpOverload,
    rule: Callable[..., Any],
    *,
    static: tuple[str, ...] = (),
    lift: tuple[str, ...] = (),
    random: bool = False,
    site: str = "<table>",
) -> None:
    if op in LOWERINGS:
        raise RuntimeError(f"{op} already has a lowering, registered at {LOWERINGS[op].site}")
    LOWERINGS[op] = Lowering(op, rule, frozenset(static), frozenset(lift), random, site)
