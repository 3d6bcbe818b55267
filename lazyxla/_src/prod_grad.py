"""`torch.prod`'s gradient on lazy tensors without reading the input's values on the host.

# Note [Product gradients without a sync]
Eager's derivative of `prod` (FunctionsManual's `prod_backward`) branches on the input's zeros:
with none, `grad * (result / input)`; with some, the product of the other elements from two
exclusive cumulative products (`prod_safe_zeros_backward`); for a full product with more than one
zero outside a differentiable backward, zeros. It finds them with `(input == 0).nonzero()` or a
`.item()`: on lazy tensors, a CPU fallback and a sync in the middle of every backward that
differentiates a product. The AutogradPrivateUse1 kernels here record `prod` with a backward
that computes both branches with tensor ops and selects with `torch.where` on the zero count, so
the values are eager's (the same ops, rounded the same way), with nothing read on the host, and
differentiable again (double backward works as eager's). Where something between autograd and
lazyxla must see eager's own autograd node (a dispatch mode: dynamo's fake tensors take eager's
zero-safe path themselves; forward AD; tensor subclasses), the kernel runs eager's autograd
kernel.
"""

from __future__ import annotations

from typing import Any

import torch

from .products import _BELOW_AUTOGRAD, _plain, _unobserved

aten = torch.ops.aten
_EAGER_AUTOGRAD = torch._C.DispatchKey.Autograd  # (its alias key: eager's VariableType kernel)
_prod = aten.prod.default._handle.redispatch_boxed
_prod_dim = aten.prod.dim_int._handle.redispatch_boxed


def _zero_safe(grad: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """Eager's `prod_safe_zeros_backward`: grad times the product of the other elements along
    `dim`, from exclusive cumulative products either way."""
    if x.numel() == 0:
        return grad.expand_as(x)
    ones = torch.ones((*x.shape[:dim], 1, *x.shape[dim + 1 :]), dtype=grad.dtype, device=x.device)
    n = x.shape[dim]
    before = torch.cat([ones, x.narrow(dim, 0, n - 1)], dim).cumprod(dim)
    after = torch.cat([ones, x.narrow(dim, 1, n - 1).flip(dim)], dim).cumprod(dim).flip(dim)
    return grad * (before * after)


def _prod_grad(grad: torch.Tensor, x: torch.Tensor, result: torch.Tensor, dim: Any, keepdim: bool):
    """Eager's `prod_backward` with its value-dependent branches as selects (Note [Product
    gradients without a sync]); `dim` None: the product of all elements."""
    if x.dim() == 0:
        return grad
    is_zero = x == 0
    zeros = is_zero.sum()
    # (the quotient's branch divides by 1 where x is 0: it is not selected then, and a division
    # by 0 there would put NaN in a second derivative through the select)
    x_or_1 = torch.where(is_zero, torch.ones_like(x), x)
    if dim is None:
        safe = _zero_safe(grad, x.contiguous().view(-1), 0).view_as(x)
        out = torch.where(zeros == 0, grad * (result / x_or_1), safe)
        if not torch.is_grad_enabled():  # eager: zeros where two or more zeros kill every term
            out = torch.where(zeros > 1, torch.zeros_like(x), out)
        return out
    dim = dim % x.dim()
    if not keepdim:
        grad, result = grad.unsqueeze(dim), result.unsqueeze(dim)
    return torch.where(zeros == 0, grad * (result / x_or_1), _zero_safe(grad, x, dim))


class _Prod(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: Any, keepdim: bool, dtype: Any) -> torch.Tensor:
        if dim is None:
            out = _prod(_BELOW_AUTOGRAD, x, dtype=dtype)
        else:
            out = _prod_dim(_BELOW_AUTOGRAD, x, dim, keepdim, dtype=dtype)
        ctx.save_for_backward(x, out)
        ctx.dim, ctx.keepdim = dim, keepdim
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        x, out = ctx.saved_tensors
        return _prod_grad(grad, x.to(grad.dtype), out, ctx.dim, ctx.keepdim), None, None, None


def _taken(x: Any) -> bool:
    return (
        torch.is_grad_enabled()
        and x.requires_grad
        and _plain(x)
        and x.is_floating_point()  # (complex: eager's kernel)
        and _unobserved()
    )


def prod_kernel(x: Any, *, dtype: Any = None) -> torch.Tensor:
    """`aten::prod` for lazy tensors (its AutogradPrivateUse1 kernel)."""
    if not _taken(x):
        return aten.prod.default._op_dk(_EAGER_AUTOGRAD, x, dtype=dtype)
    return _Prod.apply(x, None, False, dtype)


def prod_dim_kernel(x: Any, dim: int, keepdim: bool = False, *, dtype: Any = None):
    """`aten::prod.dim_int` for lazy tensors (its AutogradPrivateUse1 kernel)."""
    if not _taken(x):
        return aten.prod.dim_int._op_dk(_EAGER_AUTOGRAD, x, dim, keepdim, dtype=dtype)
    return _Prod.apply(x, dim, keepdim, dtype)


_lib = torch.library.Library("aten", "IMPL")
_lib.impl("prod", prod_kernel, "AutogradPrivateUse1")
_lib.impl("prod.dim_int", prod_dim_kernel, "AutogradPrivateUse1")
