"""Op families and their installation as PrivateUse1 kernels.

`install()` registers, for every lowered functional op, its kernel and the kernels derived from it:
the
in-place variant (`add_` from `add`) and the `out=` variant (`add.out`). View ops get view kernels.
Ops listed in `DECOMPOSE` run PyTorch's decomposition at record time on lazy tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload

from . import (  # noqa: F401  (importing registers the lowerings)
    creation,
    elementwise,
    foreach,
    indexing,
    linalg,
    nn,
    random,
    reduction,
    rnn,
    shape,
)
from .registry import LOWERINGS

aten = torch.ops.aten


def _writes(op: OpOverload) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


def _signature(op: OpOverload) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in op._schema.arguments]


def _functional_of_inplace(op: OpOverload) -> OpOverload | None:
    """`add_.Tensor` → `add.Tensor`: the functional overload taking the same arguments.

    Matched by argument names and types, not overload name: `pow_.Scalar` (Tensor self, Scalar
    exponent) is not `pow.Scalar` (Scalar self, Tensor exponent).
    """
    name = op._schema.name.split("::", 1)[1]
    if not name.endswith("_"):
        return None
    packet = getattr(aten, name[:-1], None)
    if packet is None:
        return None
    want = _signature(op)
    for ov in packet.overloads():
        f = getattr(packet, ov)
        if not _writes(f) and _signature(f) == want:
            return f
    return None


def _functional_of_out(op: OpOverload, lowered: Any) -> OpOverload | None:
    """`add.out` → `add.Tensor`: the lowered overload whose arguments are the out variant's minus
    `out`, by names and types (`clamp.Tensor_out`'s Tensor bounds are `clamp.Tensor`'s, not
    `clamp.default`'s Scalar ones of the same names; `all.dims_out` is `all.dims`, not `all.dim`).
    Without a lowered one of the same types, one of the same names: `xlogy.OutScalar_Self` is
    `xlogy.Tensor`, its Scalar `self` passed as a wrapped number."""
    args = [a for a in op._schema.arguments if not (a.alias_info and a.alias_info.is_write)]
    want = [(a.name, str(a.type)) for a in args]
    names = [a.name for a in args]
    packet = getattr(aten, op._schema.name.split("::", 1)[1])
    by_name = None
    for ov in packet.overloads():
        f = getattr(packet, ov)
        if _writes(f) or f not in lowered:
            continue
        if _signature(f) == want:
            return f
        if by_name is None and [a.name for a in f._schema.arguments] == names:
            by_name = f
    return by_name


_installed = False
_LAYOUT_ONLY = frozenset(
    (
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.empty_like.default,
        aten.full_like.default,
    )
)


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    from .. import dispatch, recording, sharding, view_kernels, writes
    from . import special
    from .shape import SCATTERS, VIEWS

    functional = {op: lw for op, lw in LOWERINGS.items() if not _writes(op)}
    for op, lw in functional.items():
        if op is aten.as_strided.default:
            dispatch.register_kernel(op, view_kernels.as_strided_kernel(lw.rule, SCATTERS[op]))
        elif op in VIEWS:
            dispatch.register_kernel(op, view_kernels.view_kernel(op, lw, SCATTERS.get(op)))
        elif op in _LAYOUT_ONLY:  # Note [Like factories read a layout]
            dispatch.register_kernel(op, special.layout_only(recording.functional_kernel(op, lw)))
        elif op is aten.as_strided_scatter.default:
            kernel = recording.functional_kernel(op, lw)
            dispatch.register_kernel(op, special.as_strided_scatter_kernel(kernel))
        elif op is aten.clone.default:
            kernel = recording.functional_kernel(op, lw)
            dispatch.register_kernel(op, sharding.clone_keeps_sharding(kernel))
        elif op in nn.FLOAT_TARGET_POSITION:  # Note [Float class targets]
            kernel = recording.functional_kernel(op, lw)
            pos = nn.FLOAT_TARGET_POSITION[op]
            dispatch.register_kernel(op, nn.float_target_as_index(kernel, pos))
        else:
            dispatch.register_kernel(op, recording.functional_kernel(op, lw))
    # Derived variants: every in-place and out= overload of a lowered packet.
    packets = {op._schema.name.split("::", 1)[1] for op in functional}
    for name in packets:
        for variant_name in (name + "_", name):
            packet = getattr(aten, variant_name, None)
            if packet is None:
                continue
            for ov in packet.overloads():
                op = getattr(packet, ov)
                if op in LOWERINGS or op in special.OVERRIDES or not _writes(op):
                    continue
                f = _functional_of_inplace(op) if variant_name.endswith("_") else None
                if f is None:
                    f = _functional_of_out(op, functional)
                if f is not None and f in functional:
                    dispatch.register_kernel(op, recording.inplace_kernel(op, f, functional[f]))
    for op, lw in LOWERINGS.items():
        if _writes(op):  # in-place ops without a functional twin (normal_, random_): own rule
            dispatch.register_kernel(op, writes.inplace_kernel(op, op, lw))
    special.install()
    rnn.install()
    from .. import autocast

    autocast.install()


def register_lowering(op: OpOverload, rule, **options) -> None:
    """Add a lowering after import (custom ops, extensions) and install its kernel.

    Example:
        >>> register_lowering(torch.ops.mylib.scale.default, lambda x, s: x * s)
    """
    from .. import dispatch, recording
    from .registry import register

    register(op, rule, **options)
    dispatch.register_kernel(op, recording.functional_kernel(op, LOWERINGS[op]))
