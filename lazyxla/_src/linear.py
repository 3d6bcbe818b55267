"""`F.linear` on lazy tensors recorded as one op forward and one backward.

# Note [Linear kept whole]
PyTorch's `aten::linear` is CompositeImplicitAutograd. On a 3-D input it becomes `t`, `view`, `mm`
and `_unsafe_view` forward, and the backward adds about six more (`t`, `mm`, `t`, `mm`, views).
Each is a recorded op in lazyxla's step (5 to 9 us each, eager's ~1 us for a view); in the demo
decoder's training step the ops under its Linears were 227 of 456. So an AutogradPrivateUse1
kernel records `aten::linear` as one node, and its backward `aten::linear_backward` as one node
giving all three gradients (XLA drops the ones nobody reads). The forward's dot keeps every batch
dim, as torch_xla's `XLAPatchedLinear` wants for sharding propagation; the weight gradient
contracts the batch dims without flattening them either.

The fused form is taken only where it computes what eager computes, rounding included; elsewhere
the kernel runs PyTorch's decomposition, exactly as before:
- eager's own paths: an input of 2 or more dims and a 2-D weight, floating, of one dtype; a bias of
  shape `[out]`, and then the input 2-D or contiguous (eager's `addmm`, the bias added before the
  one rounding; a non-contiguous N-d input with a bias is `matmul` then `add_`, rounded twice);
  no empty tensors;
- nothing in between that must see the decomposed ops: a Python dispatch mode (dynamo's fake
  tensors, AOTAutograd, export, a FlopCounterMode, selective checkpointing's policy), forward-mode
  AD, tensor subclasses, saved-tensor hooks (non-reentrant checkpointing, `save_on_cpu`: they
  decide per saved tensor, and see eager's), and a checkpointed function's recomputation.
  (functorch's transforms decompose `linear` before autograd: the kernel never sees them.)
  Checkpointing needs the decomposition for more than that: with `linear_backward` as one node,
  XLA:CPU's memory-minimizing scheduler kept an 8-layer decoder's checkpointed step at the
  unchecked step's temp memory (42 MB, against 18 MB decomposed; tests/test_checkpointing.py).
A backward that builds a graph (`create_graph=True`) computes the gradients with differentiable
ops, so double backward works as in eager. Under `torch.no_grad()` or with nothing requiring a
gradient the kernel records the op directly, with no autograd node. Trace-once graphs are
unaffected: AOTAutograd traces under a dispatch mode and so sees the decomposition.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import torch
from jax import lax

from . import remat
from .ops.linalg import add_scaled, matmul_opmath
from .ops.nn import _present
from .ops.registry import lowering

aten = torch.ops.aten
_FLOATING = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_BELOW_AUTOGRAD = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
_linear = aten.linear.default._handle.redispatch_boxed
_linear_backward = aten.linear_backward.default._handle.redispatch_boxed
_saved_tensor_hooks = torch._C._autograd._top_saved_tensors_default_hooks


@lowering(aten.linear.default, opmath=False)
def linear_rule(x, w, b=None):
    out = matmul_opmath(x, w.T)
    return out if b is None else add_scaled(out, b, 1, 1)


@lowering(aten.linear_backward.default, opmath=False)
def linear_backward_rule(x, grad, w, output_mask):
    # As the meta kernel: the input's gradient if asked for, the weight's and the bias's together
    # if either is (XLA removes what is never read).
    batch = tuple(range(grad.ndim - 1))
    grad_x = matmul_opmath(grad, w)
    low = grad.dtype in (jnp.bfloat16, jnp.float16)
    grad_w = lax.dot_general(
        grad,
        x,
        ((batch, batch), ((), ())),
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32 if low else None,
    )
    grad_b = jnp.sum(grad.astype(jnp.float32) if low else grad, axis=batch)
    wb = output_mask[1] or output_mask[2]
    return _present(grad_x if output_mask[0] else None, *((grad_w, grad_b) if wb else ()))


def _plain(t: torch.Tensor) -> bool:
    return type(t) is torch.Tensor or type(t) is torch.nn.Parameter


def _fusable(x: Any, w: Any, b: Any) -> bool:
    """Whether eager's `linear(x, w, b)` is the one-rounding product the fused op computes, and
    nothing between autograd and lazyxla has to see its decomposition (Note [Linear kept whole])."""
    if not (_plain(x) and _plain(w) and x.dtype in _FLOATING and w.dtype == x.dtype):
        return False
    if x.dim() < 2 or w.dim() != 2 or x.shape[-1] != w.shape[1] or 0 in x.shape or 0 in w.shape:
        return False
    if b is not None:
        if not _plain(b) or b.dtype != x.dtype or b.shape != (w.shape[0],):
            return False
        if x.dim() > 2 and not x.is_contiguous():
            return False
    return (
        torch._C._len_torch_dispatch_stack() == 0
        and torch.autograd.forward_ad._current_level < 0
        and _saved_tensor_hooks(False) is None
        and not remat.recomputing[0]
    )


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: Any) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return _linear(_BELOW_AUTOGRAD, x, w, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        x, w = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph: differentiable ops (double backward)
            grad_x = grad.matmul(w) if needs[0] else None
            g2, x2 = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
            grad_w = g2.t().mm(x2) if needs[1] else None
            grad_b = g2.sum(0) if ctx.has_bias and needs[2] else None
            return grad_x, grad_w, grad_b
        mask = [needs[0], needs[1], ctx.has_bias and needs[2]]
        grad_x, grad_w, grad_b = _linear_backward(_BELOW_AUTOGRAD, x, grad, w, mask)
        return (
            grad_x if needs[0] else None,
            grad_w if needs[1] else None,
            grad_b if mask[2] else None,
        )


def linear_kernel(x: Any, w: Any, b: Any = None) -> torch.Tensor:
    """`aten::linear` for lazy tensors (its AutogradPrivateUse1 kernel)."""
    if not _fusable(x, w, b):
        return aten.linear.default.decompose(x, w, b)
    if torch.is_grad_enabled() and (
        x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
    ):
        return _Linear.apply(x, w, b)
    return _linear(_BELOW_AUTOGRAD, x, w, b)


_lib = torch.library.Library("aten", "IMPL")
_lib.impl("linear", linear_kernel, "AutogradPrivateUse1")
