"""Host offloading: torch_xla's `place_to_host` / `place_to_device`, on JAX memory kinds.

# Note [Host offloading]
`place_to_host(t)` marks a value to live in host memory inside the compiled step and
`place_to_device(t)` brings it back (typically an activation saved in the forward and needed in
the backward). Each is a custom op whose lowering is `jax.device_put(x, jax.memory.Space.Host)` /
`jax.memory.Space.Device`, XLA's `annotate_device_placement` that torch_xla emits as a custom
call: on GPU and TPU, XLA's host-offloading passes move the buffer to pinned host memory and
back. On CPU the device memory *is* host memory: the annotations are accepted and compile to
nothing (the compiled memory analysis shows no host bytes), so offloading is a documented no-op
there. Platforms without a `pinned_host` memory get the identity. Gradients pass through
unchanged (the ops are identities to autograd), as in torch_xla.
"""

from __future__ import annotations

from typing import Any

import jax
import torch


def _has_host_memory() -> bool:
    try:
        kinds = {m.kind for m in jax.devices()[0].addressable_memories()}
    except Exception:  # a backend without memory kinds
        return False
    return "pinned_host" in kinds


def _place(space: Any) -> Any:
    def rule(x: jax.Array) -> jax.Array:
        return jax.device_put(x, space) if _has_host_memory() else x

    return rule


@torch.library.custom_op("lazyxla::place_to_host", mutates_args=())
def place_to_host(t: torch.Tensor) -> torch.Tensor:
    """Keep `t` in host memory inside the compiled step (Note [Host offloading])."""
    return t.clone()


@torch.library.custom_op("lazyxla::place_to_device", mutates_args=())
def place_to_device(t: torch.Tensor) -> torch.Tensor:
    """Bring a value placed on the host back to device memory (Note [Host offloading])."""
    return t.clone()


for _op in (place_to_host, place_to_device):
    _op.register_fake(lambda t: torch.empty_like(t))
    _op.register_autograd(lambda ctx, grad: grad)


def install() -> None:
    from .ops import register_lowering

    ops = torch.ops.lazyxla
    for op, space in (
        (ops.place_to_host.default, jax.memory.Space.Host),
        (ops.place_to_device.default, jax.memory.Space.Device),
    ):
        register_lowering(op, _place(space), opmath=False)


install()
