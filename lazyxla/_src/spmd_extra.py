"""The rest of torch_xla's `xla_sharding` module: custom annotations, shard_as, einsum linears.

- `annotate_custom_sharding(t, mesh, spec)`: a sharding constraint on `t`'s value in the graph,
  never a data transfer (unlike `mark_sharding`, which reshards device data at once).
- `shard_as(a, b)`: `jax.experimental.shard_alike` on each pair of leaves: the partitioner gives
  both the same sharding, whichever it picks.
- `MarkShardingFunction`: `mark_sharding` on a copy, and on its gradient in the backward pass.
- `EinsumLinear` / `apply_xla_patch_to_nn_linear`: `nn.Linear` computed as an einsum (keeps the
  batch dims through the matmul, which sharding propagation prefers over reshapes).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .ir import Node, Ref
from .sharding import (
    Mesh,
    ShardingAnnotation,
    XLAShardedTensor,
    _constraint_rule,
    _ShardWithGradients,
    _validate,
    unwrap,
)
from .spmd_model import xla_patched_nn_linear_forward
from .tensor import read, state, write

PartitionSpec = tuple


def annotate_custom_sharding(
    t: torch.Tensor, mesh: Mesh, partition_spec: tuple
) -> XLAShardedTensor:
    """Constrain `t`'s value to `partition_spec` over `mesh` in the graph, moving no data now."""
    from .dispatch import emit

    t = unwrap(t)
    if len(t.shape) != len(partition_spec):
        raise ValueError(
            f"Partition spec length ({len(partition_spec)}) should be equal to the input rank "
            f"({len(t.shape)})."
        )
    named = _validate(t, mesh, tuple(partition_spec))
    s = state(t)
    node, k = read(s)
    write(s, emit("xla::custom_sharding", _constraint_rule, ((node, k),), (Ref(0), named), s.spec))
    s.sharding = ShardingAnnotation(mesh, mesh.translate(tuple(partition_spec)), named)
    return XLAShardedTensor.wrap(t)


def _shard_alike_rule(x: Any, y: Any) -> tuple[Any, Any]:
    from jax.experimental.shard_alike import shard_alike

    return shard_alike(x, y)


def _shard_pair(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from .dispatch import emit

    if x.shape != y.shape:
        raise ValueError(f"shard_as: paired tensors differ in shape: {x.shape} and {y.shape}")
    outs = (x.clone(), y.clone())
    states = [state(o) for o in outs]
    ann = state(x).sharding or state(y).sharding
    if ann is not None:
        # One of them is annotated: both get its sharding, as a constraint (what shard_alike
        # would settle on, without leaving the choice to the partitioner).
        for s in states:
            node, k = read(s)
            write(
                s,
                emit("xla::shard_as", _constraint_rule, ((node, k),), (Ref(0), ann.named), s.spec),
            )
            s.sharding = ann
        return outs
    values = tuple(read(s) for s in states)
    node = Node(
        "xla::shard_as",
        _shard_alike_rule,
        values,
        (Ref(0), Ref(1)),
        (),
        tuple(s.spec for s in states),
    )
    for i, s in enumerate(states):
        write(s, (node, i))
    return outs


def shard_as(a: Any, b: Any) -> tuple[Any, Any]:
    """`(a', b')`: copies of two pytrees of matching structure whose paired tensors are sharded
    alike (use at least one of the outputs; None leaves must be None in both)."""
    a_flat, a_tree = tree_flatten(a)
    b_flat, b_tree = tree_flatten(b)
    if a_tree != b_tree:
        raise ValueError(
            f"shard_as: a and b must have the same structure. got {a_tree} and {b_tree}"
        )
    a_out, b_out = [], []
    for x, y in zip(a_flat, b_flat):
        if x is None or y is None:
            if not (x is None and y is None):
                raise ValueError("shard_as: a None leaf must be None in both a and b")
        else:
            x, y = _shard_pair(unwrap(x), unwrap(y))
        a_out.append(x)
        b_out.append(y)
    return tree_unflatten(a_out, a_tree), tree_unflatten(b_out, b_tree)


def wrap_as_sharded_tensor(
    t: torch.Tensor, mesh_shape: Any = None, partition_spec: Any = None
) -> XLAShardedTensor:
    """`t` as an XLAShardedTensor (the same object if it already is one)."""
    out = XLAShardedTensor.wrap(t)
    if mesh_shape is not None:
        out.mesh_shape = mesh_shape
    if partition_spec is not None:
        out.partition_spec = partition_spec
    return out


def unwrap_sharded_tensor(t: torch.Tensor) -> torch.Tensor:
    """The global tensor of an XLAShardedTensor (anything else unchanged)."""
    return unwrap(t)


class MarkShardingFunction(torch.autograd.Function):
    """`MarkShardingFunction.apply(t, mesh, spec)`: a sharded copy of `t`; its gradient is
    sharded the same way in the backward pass."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, mesh: Mesh, partition_spec: tuple) -> torch.Tensor:
        return _ShardWithGradients.forward(ctx, unwrap(t), mesh, tuple(partition_spec))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return _ShardWithGradients.backward(ctx, grad)


class EinsumLinear(torch.nn.Linear):
    """`nn.Linear` computed with an einsum."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return xla_patched_nn_linear_forward(self, input)


def apply_xla_patch_to_nn_linear(module: torch.nn.Module) -> torch.nn.Module:
    """Replace every `nn.Linear` under `module` by an `EinsumLinear` holding the same parameters."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Linear) and not isinstance(child, EinsumLinear):
            with torch.device("meta"):
                new = EinsumLinear(
                    child.in_features, child.out_features, bias=child.bias is not None
                )
            new.load_state_dict(child.state_dict(), strict=True, assign=True)
            setattr(module, name, new)
        else:
            apply_xla_patch_to_nn_linear(child)
    return module
