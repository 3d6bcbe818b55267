"""`torch.einsum` on lazy tensors kept as one einsum (one XLA dot), as torch_xla lowers it.

# Note [Einsum kept whole]
PyTorch's `aten::einsum` is CompositeImplicitAutograd: it becomes permutes, reshapes and a `bmm`,
so `einsum("...n,mn->...m", x, w)` on a `[3, 4, 5, 128]` input is a `[60, 128]` dot: the batch
dims are merged, and a sharding annotated on one of them cannot propagate through the product
(the point of torch_xla's `XLAPatchedLinear`, which computes `nn.Linear` as this einsum). torch_xla
registers einsum as its own op; lazyxla does the same for two-operand equations: an
AutogradPrivateUse1 kernel calls the custom op `lazyxla::einsum`, lowered to `jnp.einsum` (one
`dot_general` keeping every dim), whose backward `lazyxla::einsum_backward` lowers to the vjp of
the same einsum. Being custom ops, both stay whole when AOTAutograd traces a scan body. Other
equations (one operand, three or more) keep PyTorch's decomposition. Products accumulate at full
precision, bf16/fp16 in float32 and rounded once, as `mm` does (lazyxla/_src/ops/linalg.py).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .ops.registry import register

_LOW = (jnp.bfloat16, jnp.float16)


def _einsum(equation: str, a: jax.Array, b: jax.Array) -> jax.Array:
    if a.dtype in _LOW and a.dtype == b.dtype:
        out = jnp.einsum(
            equation, a, b, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32
        )
        return out.astype(a.dtype)
    return jnp.einsum(equation, a, b, precision=lax.Precision.HIGHEST)


@torch.library.custom_op("lazyxla::einsum", mutates_args=())
def einsum(equation: str, operands: list[torch.Tensor]) -> torch.Tensor:
    """A two-operand einsum kept whole (Note [Einsum kept whole])."""
    return torch.ops.aten.einsum.default.decompose(equation, operands).contiguous()


@einsum.register_fake
def _(equation: str, operands: list[torch.Tensor]) -> torch.Tensor:
    # contiguous, as the lazy result is (the decomposition's may be a permuted view)
    return torch.ops.aten.einsum.default.decompose(equation, operands).contiguous()


@torch.library.custom_op("lazyxla::einsum_backward", mutates_args=())
def einsum_backward(
    equation: str, operands: list[torch.Tensor], grad: torch.Tensor
) -> list[torch.Tensor]:
    """The gradients of `einsum(equation, operands)` for the output gradient `grad`."""
    with torch.enable_grad():
        ops = [o.detach().requires_grad_() for o in operands]
        out = torch.ops.aten.einsum.default.decompose(equation, ops)
        return [g.contiguous() for g in torch.autograd.grad(out, ops, grad)]


@einsum_backward.register_fake
def _(equation: str, operands: list[torch.Tensor], grad: torch.Tensor) -> list[torch.Tensor]:
    return [o.new_empty(o.shape) for o in operands]  # contiguous, as the lazy results are


def _setup(ctx: Any, inputs: tuple, output: Any) -> None:
    equation, operands = inputs
    ctx.equation = equation
    ctx.save_for_backward(*operands)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple:
    grads = einsum_backward(ctx.equation, list(ctx.saved_tensors), grad.contiguous())
    needs = ctx.needs_input_grad[1] if len(ctx.needs_input_grad) > 1 else True
    return None, (grads if needs else None)


einsum.register_autograd(_backward, setup_context=_setup)


def _fwd_rule(equation: str, operands: list[jax.Array]) -> jax.Array:
    return _einsum(equation, *operands)


def _bwd_rule(equation: str, operands: list[jax.Array], grad: jax.Array) -> list[jax.Array]:
    _, vjp = jax.vjp(lambda a, b: _einsum(equation, a, b), *operands)
    return list(vjp(grad.astype(_einsum(equation, *operands).dtype)))


register(torch.ops.lazyxla.einsum.default, _fwd_rule, opmath=False)
register(torch.ops.lazyxla.einsum_backward.default, _bwd_rule, opmath=False)


def _kept_whole(equation: str, operands: Any) -> bool:
    """Two floating operands of one dtype, no repeated index within an operand (a diagonal)."""
    if len(operands) != 2 or "->" not in equation:
        return False
    a, b = operands
    if a.dtype != b.dtype or not a.dtype.is_floating_point:
        return False
    for term in equation.replace(" ", "").split("->")[0].split(","):
        letters = term.replace("...", "")
        if len(set(letters)) != len(letters):
            return False
    return True


def einsum_kernel(equation: str, tensors: Any, *, path: Any = None) -> torch.Tensor:
    """`aten::einsum` for lazy tensors (its AutogradPrivateUse1 kernel)."""
    if path is None and _kept_whole(equation, tensors):
        return einsum(equation, list(tensors))
    return torch.ops.aten.einsum.default.decompose(equation, tensors, path=path)


_lib = torch.library.Library("aten", "IMPL")
_lib.impl("einsum", einsum_kernel, "AutogradPrivateUse1")
