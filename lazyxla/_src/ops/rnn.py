"""The fused LSTM and GRU cells `nn.LSTM` / `nn.GRU` call on an accelerator, and their backwards.

# Note [Fused RNN cells]
On a device other than the CPU, ATen's `lstm`/`gru` compute each time step's cell with one fused
op, `_thnn_fused_lstm_cell` / `_thnn_fused_gru_cell` (CUDA kernels in PyTorch; PrivateUse1
devices, lazyxla's, take the same path). They have no CPU kernel, so the CPU fallback cannot run
them: without these lowerings `nn.LSTM` and `nn.GRU` failed on lazyxla. The rules compute what
the CUDA kernels compute (ATen's RNN.cu), gate order included:
- LSTM: gates = input_gates + hidden_gates (+ both biases), chunked as input, forget, cell,
  output; cy = f * cx + i * g, hy = o * tanh(cy). The workspace keeps the activated gates, which
  the backward reads with cx and cy.
- GRU: input and hidden gates (each with its bias) chunked as reset, update, new; r and z from
  the sums, n = tanh(in + r * hn), hy = n + z * (hx - n). The workspace keeps r, z, n, hx and hn.
lazyxla infers output shapes with meta kernels: the GRU ops have none in PyTorch, and the LSTM
cell's fails without biases (it checks the device of each bias, None included), so `install` gives
dispatch their shape rules. The differentiable backwards (double backward) are composite.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .registry import lowering

aten = torch.ops.aten


def _biased(gates, bias):
    return gates if bias is None else gates + bias


@lowering(aten._thnn_fused_lstm_cell.default)
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _biased(input_gates, input_bias) + _biased(hidden_gates, hidden_bias)
    i, f, g, o = jnp.split(gates, 4, axis=1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * cx + i * g
    hy = o * jnp.tanh(cy)
    return hy, cy, jnp.concatenate([i, f, g, o], axis=1)


@lowering(aten._thnn_fused_lstm_cell_backward_impl.default)
def fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return ()  # (None, None, None), as PyTorch's
    i, f, g, o = jnp.split(workspace, 4, axis=1)
    tanh_cy = jnp.tanh(cy)
    grad_hy = jnp.zeros_like(cy) if grad_hy is None else grad_hy
    gcy = grad_hy * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        gcy = gcy + grad_cy
    gi = gcy * g * i * (1 - i)
    gf = gcy * cx * f * (1 - f)
    gg = gcy * i * (1 - g * g)
    go = grad_hy * tanh_cy * o * (1 - o)
    grad_gates = jnp.concatenate([gi, gf, gg, go], axis=1)
    grad_cx = gcy * f
    if has_bias:
        return grad_gates, grad_cx, grad_gates.sum(0)
    return grad_gates, grad_cx


@lowering(aten._thnn_fused_gru_cell.default)
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ir, iz, in_ = jnp.split(_biased(input_gates, input_bias), 3, axis=1)
    hr, hz, hn = jnp.split(_biased(hidden_gates, hidden_bias), 3, axis=1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    hy = n + z * (hx - n)
    return hy, jnp.concatenate([r, z, n, hx, hn], axis=1)


@lowering(aten._thnn_fused_gru_cell_backward.default)
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = jnp.split(workspace, 5, axis=1)
    gz = grad_hy * (hx - n) * z * (1 - z)
    gn = grad_hy * (1 - z) * (1 - n * n)
    gr = gn * hn * r * (1 - r)
    grad_input_gates = jnp.concatenate([gr, gz, gn], axis=1)
    grad_hidden_gates = jnp.concatenate([gr, gz, gn * r], axis=1)
    grad_hx = grad_hy * z
    if has_bias:
        return (
            grad_input_gates,
            grad_hidden_gates,
            grad_hx,
            grad_input_gates.sum(0),
            grad_hidden_gates.sum(0),
        )
    return grad_input_gates, grad_hidden_gates, grad_hx


def _lstm_cell_meta(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    return torch.empty_like(cx), torch.empty_like(cx), torch.empty_like(input_gates)


def _gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    return torch.empty_like(hx), input_gates.new_empty((hx.shape[0], hx.shape[1] * 5))


def _gru_cell_backward_meta(grad_hy, workspace, has_bias):
    h = grad_hy.shape[1]
    gates = workspace.new_empty((grad_hy.shape[0], 3 * h))
    bias = workspace.new_empty((3 * h,)) if has_bias else None
    return gates, torch.empty_like(gates), torch.empty_like(grad_hy), bias, bias


def install() -> None:
    """Shape rules: the GRU ops have no meta kernel; the LSTM cell's fails without biases
    (Note [Fused RNN cells])."""
    from ..meta import META_RULES

    META_RULES[aten._thnn_fused_lstm_cell.default] = _lstm_cell_meta
    META_RULES[aten._thnn_fused_gru_cell.default] = _gru_cell_meta
    META_RULES[aten._thnn_fused_gru_cell_backward.default] = _gru_cell_backward_meta
