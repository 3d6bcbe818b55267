"""`F.linear` and `torch.matmul` on lazy tensors recorded as one op forward and one backward.

# Note [Products kept whole]
PyTorch's `aten::linear` and `aten::matmul` are CompositeImplicitAutograd. `linear` on a 3-D
input becomes `t`, `view`, `mm` and `_unsafe_view` forward, and the backward adds about six more
(`t`, `mm`, `t`, `mm`, views); a batched `matmul` is `expand`s, `reshape`s (a copy when an
operand is transposed), `bmm` and `_unsafe_view`, and about eight ops backward. Each is a recorded
op in lazyxla's step (5 to 9 us each, eager's ~1 us for a view); in the demo decoder's training
step the ops under its Linears were 227 of 456. So AutogradPrivateUse1 kernels record
`aten::linear` as one node, and its backward `aten::linear_backward` as one node giving all three
gradients (XLA drops the ones nobody reads), and `aten::matmul` and `aten::matmul_backward` the
same way. The forward's dot keeps every batch dim, as torch_xla's `XLAPatchedLinear` wants for
sharding propagation; the weight gradient contracts the batch dims without flattening them either.

The fused form is taken only where it computes what eager computes, rounding included; elsewhere
the kernel runs PyTorch's decomposition, exactly as before:
- eager's own paths: for `linear`, an input of 2 or more dims and a 2-D weight, floating, of one
  dtype; a bias of shape `[out]`, and then the input 2-D or contiguous (eager's `addmm`, the bias
  added before the one rounding; a non-contiguous N-d input with a bias is `matmul` then `add_`,
  rounded twice). For `matmul`, operands of 3 or more dims with the same batch dims (one `bmm`
  each way; a broadcast batch dim sums rounded products backward, and an N-d operand beside a
  2-D one folds or not by its layout and `requires_grad`). Two 2-D operands are one `mm` already,
  recorded as torch_xla records `a @ b` (`aten::mm` in its IR text and counters). No empty
  tensors;
- nothing in between that must see the decomposed ops: a Python dispatch mode (dynamo's fake
  tensors, AOTAutograd, export, a FlopCounterMode, selective checkpointing's policy), forward-mode
  AD, tensor subclasses, saved-tensor hooks (non-reentrant checkpointing, `save_on_cpu`: they
  decide per saved tensor, and see eager's), and a checkpointed function's recomputation.
  (functorch's transforms decompose `linear` before autograd: the kernel never sees them.)
  Checkpointing needs the decomposition for more than that: with `linear_backward` as one node,
  XLA:CPU's memory-minimizing scheduler kept an 8-layer decoder's checkpointed step at the
  unchecked step's temp memory (42 MB, against 18 MB decomposed; tests/test_checkpointing.py).
A fused output is a plain tensor; eager's N-d `linear` with a bias returns a view of its private
2-D `addmm` result, an alias no program can reach (only `_is_view()` tells them apart).
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
from .ops.linalg import _LOW, add_scaled, matmul_opmath
from .ops.nn import _present
from .ops.registry import lowering, to_opmath

aten = torch.ops.aten
_FLOATING = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_BELOW_AUTOGRAD = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
_linear = aten.linear.default._handle.redispatch_boxed
_linear_backward = aten.linear_backward.default._handle.redispatch_boxed
_matmul = aten.matmul.default._handle.redispatch_boxed
_matmul_backward = aten.matmul_backward.default._handle.redispatch_boxed
_saved_tensor_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


def _eager(op: Any, *args: Any) -> Any:
    """`op`'s C++ CompositeImplicitAutograd kernel: eager's decomposition. (Not `op.decompose`,
    which prefers a Python one where PyTorch has it: matmul's ends in `view`, not eager's
    `_unsafe_view`, and its output would be a view.)"""
    return op._op_dk(_COMPOSITE, *args)


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
    grad_w = lax.dot_general(  # (matmul_opmath's precision, without flattening the batch dims)
        grad,
        x,
        ((batch, batch), ((), ())),
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32 if grad.dtype in _LOW else None,
    )
    grad_b = jnp.sum(to_opmath(grad), axis=batch)
    wb = output_mask[1] or output_mask[2]
    return _present(grad_x if output_mask[0] else None, *((grad_w, grad_b) if wb else ()))


def _plain(t: torch.Tensor) -> bool:
    return type(t) is torch.Tensor or type(t) is torch.nn.Parameter


def _linear_fusable(x: Any, w: Any, b: Any) -> bool:
    """Whether eager's `linear(x, w, b)` is the one-rounding product the fused op computes, and
    nothing between autograd and lazyxla has to see its decomposition (Note [Products kept
    whole])."""
    if not (_plain(x) and _plain(w) and x.dtype in _FLOATING and w.dtype == x.dtype):
        return False
    if x.dim() < 2 or w.dim() != 2 or x.shape[-1] != w.shape[1] or 0 in x.shape or 0 in w.shape:
        return False
    if b is not None:
        if not _plain(b) or b.dtype != x.dtype or b.shape != (w.shape[0],):
            return False
        if x.dim() > 2 and not x.is_contiguous():
            return False
    return _unobserved()


def _unobserved() -> bool:
    """No dispatch mode, forward AD, saved-tensor hook or checkpoint recomputation is active."""
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
    if not _linear_fusable(x, w, b):
        return _eager(aten.linear.default, x, w, b)
    if torch.is_grad_enabled() and (
        x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
    ):
        return _Linear.apply(x, w, b)
    return _linear(_BELOW_AUTOGRAD, x, w, b)


@lowering(aten.matmul.default, opmath=False)
def matmul_rule(a, b):
    return matmul_opmath(a, b)


@lowering(aten.matmul_backward.default, opmath=False)
def matmul_backward_rule(grad, a, b, mask):
    return _present(
        matmul_opmath(grad, jnp.swapaxes(b, -1, -2)) if mask[0] else None,
        matmul_opmath(jnp.swapaxes(a, -1, -2), grad) if mask[1] else None,
    )


def _matmul_backward_meta(grad: Any, a: Any, b: Any, mask: Any) -> tuple:
    # (PyTorch has none: only nested tensors implement matmul_backward)
    return (
        grad.new_empty(a.shape) if mask[0] else None,
        grad.new_empty(b.shape) if mask[1] else None,
    )


def _matmul_fusable(a: Any, b: Any) -> bool:
    """Whether eager's `matmul(a, b)` is one `mm` or `bmm` each way, and nothing between autograd
    and lazyxla has to see its decomposition (Note [Products kept whole])."""
    if not (_plain(a) and _plain(b) and a.dtype in _FLOATING and b.dtype == a.dtype):
        return False
    n = a.dim()
    if n < 3 or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        return False
    return 0 not in a.shape and 0 not in b.shape and _unobserved()


class _Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return _matmul(_BELOW_AUTOGRAD, a, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        a, b = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph: differentiable ops (double backward)
            return (grad @ b.mT if needs[0] else None, a.mT @ grad if needs[1] else None)
        grad_a, grad_b = _matmul_backward(_BELOW_AUTOGRAD, grad, a, b, [needs[0], needs[1]])
        return (grad_a if needs[0] else None, grad_b if needs[1] else None)


def matmul_kernel(a: Any, b: Any) -> torch.Tensor:
    """`aten::matmul` for lazy tensors (its AutogradPrivateUse1 kernel)."""
    if not _matmul_fusable(a, b):
        return _eager(aten.matmul.default, a, b)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _Matmul.apply(a, b)
    return _matmul(_BELOW_AUTOGRAD, a, b)


_lib = torch.library.Library("aten", "IMPL")
_lib.impl("linear", linear_kernel, "AutogradPrivateUse1")
_lib.impl("matmul", matmul_kernel, "AutogradPrivateUse1")
_lib.impl("matmul_backward", _matmul_backward_meta, "Meta")
