"""torch_xla's weight-only quantized matmul: `torch.ops.xla.quantized_matmul` and
`XlaQuantizedLinear` (int8 or int4 weights, per-channel or blockwise scales, optional zero point
and optional int8 activation quantization).

# Note [Quantized matmul]
The op is defined in the `xla` library namespace with torch_xla's schema. Its
CompositeExplicitAutograd kernel is the eager reference (dequantize-free math in the activation's
dtype, as torch_xla's); on a lazyxla tensor it records one node (`call_jax`) whose JAX function
keeps the weight integer up to the dot: a per-channel matmul is one `dot_general` of the
activation (or, with `quantize_activation`, its int8 quantization) with the int8 (or int4)
weight, the output in the activation's dtype (int32 for int8 x int8), and the scale applied to
the result. XLA gets the mixed-type dot itself (`bf16 dot(bf16, s8)`), so a backend with
mixed-precision dots (TPU) reads the weight at its stored width; `jax.lax.dot_general` would
convert the weight first, so the dot is emitted by a small primitive (`_mixed_dot`) whose lowering
is `stablehlo.dot_general` on the operands as they are (XLA:CPU upcasts int8 inside).

int4 weights come unpacked in an int8 container (values in [-8, 7]) and are cast to `s4` for the
dot, as torch_xla does; XLA:CPU has no int4 dot (its upcast pass rejects the `s4` layout), so on
CPU such a graph shows the right HLO but does not run: torch_xla's tests run int4 dots on TPU
only, and lazyxla warns when one is recorded on CPU. Blockwise weights `[in / block, block, out]`
are contracted per block (two einsums, as torch_xla's), with the weight converted to the
activation's dtype; the int4 cast changes no value there, so it is not applied.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

# torch's reference quantization ops (`torch.ops.quantized_decomposed.quantize_per_channel`, ...),
# which weight-quantization code written for this op calls: importing torch_xla defines them (its
# `experimental.quantized` registers XLA kernels for them), so importing this module does too.
import torch.ao.quantization.fx._decomposed  # noqa: F401

from .custom_call import XLA_LIB

XLA_LIB.define(
    "quantized_matmul(Tensor x, Tensor w, Tensor scale, Tensor? zero_point=None, "
    "int? block_size=-1, bool? int4_weight=False, bool? quantize_activation=False) -> Tensor"
)


# --- checks (torch_xla's messages) ---------------------------------------------------------------


def _check_per_channel_quant_weight_dtype_shapes(
    input_dim: int,
    output_dim: int,
    w: torch.Tensor,
    w_scaler: torch.Tensor,
    zero_point: torch.Tensor | None,
) -> None:
    assert w.dtype == torch.int8, f"Weight dtype is expected to be torch.int8, got {w.dtype}."
    assert w.dim() == 2, f"Weight tensor is expected to be 2D, got {w.dim()}D Tensor."
    w_shape = list(w.shape)
    assert output_dim == w_shape[0] and input_dim == w_shape[1], (
        f"Weight shape is expected to be [output_dim, input_dim], output_dim: {output_dim}, "
        f"input_dim: {input_dim}, but got {w_shape}."
    )
    assert w_scaler.dim() == 1 and w_scaler.shape[0] == w_shape[0], (
        f"weight scaler shape is expect to be [out_channel,], got {w_scaler.shape}, weight "
        f"shape {w_shape}."
    )
    if zero_point is not None:
        assert zero_point.dim() == 1 and zero_point.shape[0] == w_shape[0], (
            f"zero point shape is expect to be [out_channel,], got {zero_point.shape}, weight "
            f"shape {w_shape}."
        )


def _check_blockwise_quant_weight_dtype_shapes(
    input_dim: int,
    output_dim: int,
    block_size: int,
    w: torch.Tensor,
    w_scaler: torch.Tensor,
    zero_point: torch.Tensor | None,
) -> None:
    assert w.dtype == torch.int8, f"Weight dtype is expected to be torch.int8, got {w.dtype}."
    assert w.dim() == 3, f"Weight tensor is expected to be 3D, got {w.dim()}D Tensor."
    w_shape = list(w.shape)
    assert input_dim % block_size == 0, (
        f"input_dim should be divisible by block_size, got input_dim: {input_dim}, "
        f"block_size: {block_size}."
    )
    assert w_shape[0] == input_dim // block_size and w_shape[1] == block_size, (
        f"Weight shape is expected to be [input_dim / block_size, block_size, output_dim], "
        f"input_dim: {input_dim}, block_size: {block_size}, output_dim: {output_dim}, but got "
        f"{w_shape}."
    )
    assert w_scaler.dim() == 2, f"weight scaler is expected to be 2D, got {w_scaler.dim()}D Tensor."
    assert w_scaler.shape[0] == w_shape[0] and w_scaler.shape[1] == w_shape[-1], (
        f"weight scaler shape is expect to be [in_channel / block_size, out_channel], got "
        f"{w_scaler.shape}, weight shape {w_shape}."
    )
    if zero_point is not None:
        assert zero_point.dim() == 2, (
            f"zero_point is expected to be 2D, got {zero_point.dim()}D Tensor."
        )
        assert zero_point.shape[0] == w_shape[0] and zero_point.shape[1] == w_shape[-1], (
            f"zero_point shape is expect to be [in_channel / block_size, out_channel], got "
            f"{zero_point.shape}, weight shape {w_shape}."
        )


def _check(
    x: torch.Tensor,
    w: torch.Tensor,
    scaler: torch.Tensor,
    zero_point: torch.Tensor | None,
    block_size: int,
    quantize_activation: bool,
) -> None:
    if block_size == -1:
        _check_per_channel_quant_weight_dtype_shapes(
            x.shape[-1], scaler.shape[0], w, scaler, zero_point
        )
    else:
        assert not quantize_activation, (
            "Blockwise quantization does not support activation quantization."
        )
        _check_blockwise_quant_weight_dtype_shapes(
            x.shape[-1], w.shape[-1], block_size, w, scaler, zero_point
        )


def _quantize_tensor(x: torch.Tensor, n_bits: int = 8, dim: int = -1) -> tuple:
    """Symmetric quantization of `x` along `dim`: (int8 values, scale in x's dtype)."""
    max_val = torch.amax(torch.abs(x), dim=dim, keepdim=True)
    scale = max_val / (2 ** (n_bits - 1) - 1)
    return torch.round(x / scale).to(torch.int8), scale.to(x.dtype)


# --- the eager reference --------------------------------------------------------------------------


def quantized_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    scaler: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    block_size: int | None = -1,
    int4_weight: bool | None = False,
    quantize_activation: bool | None = False,
) -> torch.Tensor:
    """Quantized matmul, the eager reference (torch_xla's CompositeExplicitAutograd kernel).

    Args:
        x: activation `[..., in_channel]`.
        w: int8 weight: `[out_channel, in_channel]` per-channel, or
            `[in_channel / block_size, block_size, out_channel]` blockwise.
        scaler: `[out_channel]` per-channel, `[in_channel / block_size, out_channel]` blockwise.
        zero_point: optional, the scaler's shape (already multiplied by the scale).
        block_size: -1 for per-channel quantization, else the block size.
        int4_weight: the weight holds int4 values in an int8 container.
        quantize_activation: quantize `x` to int8 per row too (per-channel only).

    Returns:
        `x @ dequantized(w).T`, shape `[..., out_channel]`.
    """
    block_size = -1 if block_size is None else block_size
    _check(x, w, scaler, zero_point, block_size, bool(quantize_activation))
    x_scale = None
    if block_size == -1:
        w = w.to(x.dtype)
        if quantize_activation:
            x, x_scale = _quantize_tensor(x)
            # int32 operands: an int8 matmul would overflow.
            x, w = x.to(torch.int32), w.to(torch.int32)
        out = torch.nn.functional.linear(x, w) * scaler
    else:
        x = x.reshape(*x.shape[:-1], x.shape[-1] // block_size, block_size)
        out = torch.einsum("scn,...sc->...sn", w.to(x.dtype), x)
        out = torch.einsum("sn,...sn->...n", scaler, out)
    if zero_point is not None:
        if block_size == -1:
            zp_out = torch.einsum("...c,z->...z", x, zero_point)
        else:
            zp_out = torch.matmul(x.sum(dim=-1), zero_point)
        out = out - zp_out.to(out.dtype)
    if x_scale is not None:
        out = out * x_scale
    return out


# --- the lazy kernel ------------------------------------------------------------------------------


@functools.cache
def _mixed_dot() -> Any:
    """A `dot_general` primitive that lowers with its operands' own dtypes (see Note [Quantized
    matmul]); contracts the last dim of `x` with the last dim of `w`, no batch dims."""
    import jax.numpy as jnp
    from jax._src import core
    from jax._src.interpreters import mlir
    from jax.extend.core import Primitive
    from jax.extend.mlir.dialects import stablehlo

    p = Primitive("lazyxla_mixed_dot")

    def abstract(x: Any, w: Any, *, out_dtype: Any) -> Any:
        return core.ShapedArray((*x.shape[:-1], *w.shape[:-1]), jnp.dtype(out_dtype))

    def lowering(ctx: Any, x: Any, w: Any, *, out_dtype: Any) -> Any:
        ax, aw = ctx.avals_in
        dims = stablehlo.DotDimensionNumbers.get(
            lhs_batching_dimensions=[],
            rhs_batching_dimensions=[],
            lhs_contracting_dimensions=[len(ax.shape) - 1],
            rhs_contracting_dimensions=[len(aw.shape) - 1],
        )
        out_type = mlir.aval_to_ir_type(ctx.module_context, ctx.avals_out[0])
        return [stablehlo.dot_general(out_type, x, w, dims)]

    p.def_abstract_eval(abstract)
    mlir.register_lowering(p, lowering)
    return p


def _jax_dtype(dtype: torch.dtype) -> Any:
    from .runtime import jnp_dtype

    return jnp_dtype(dtype)


def _promote(*dtypes: torch.dtype) -> torch.dtype:
    out = dtypes[0]
    for d in dtypes[1:]:
        out = torch.promote_types(out, d)
    return out


def _jax_quantized_matmul(
    x: Any,
    w: Any,
    scaler: Any,
    zero_point: Any,
    *,
    block_size: int,
    int4_weight: bool,
    quantize_activation: bool,
    dtypes: tuple[torch.dtype, ...],
) -> Any:
    """The JAX function of one quantized matmul (pure; `dtypes`: torch result dtypes of the
    steps, so the result's dtype is eager's)."""
    import jax.numpy as jnp

    out_dtype, zp_dtype = (_jax_dtype(d) if d is not None else None for d in dtypes)
    x_scale = None
    if block_size == -1:
        if int4_weight:
            w = w.astype(jnp.int4)
        dot = _mixed_dot()
        if quantize_activation:
            max_val = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
            scale = max_val / 127
            # Through int32, as eager's float -> int8 cast does on the CPU: a value that rounds
            # to 128 wraps to -128 (XLA's direct float -> s8 convert would saturate).
            xq = jnp.round(x / scale).astype(jnp.int32).astype(jnp.int8)
            x_scale = scale.astype(x.dtype)
            out = dot.bind(xq, w, out_dtype=jnp.int32)
            x_for_zp = xq.astype(jnp.int32)
        else:
            out = dot.bind(x, w, out_dtype=x.dtype)
            x_for_zp = x
        out = out.astype(out_dtype) * scaler.astype(out_dtype)
    else:
        x = x.reshape(*x.shape[:-1], x.shape[-1] // block_size, block_size)
        out = jnp.einsum("scn,...sc->...sn", w.astype(x.dtype), x)
        out = jnp.einsum("sn,...sn->...n", scaler.astype(out_dtype), out.astype(out_dtype))
        x_for_zp = x
    if zero_point is not None:
        if block_size == -1:
            zp_out = jnp.einsum(
                "...c,z->...z", x_for_zp.astype(zp_dtype), zero_point.astype(zp_dtype)
            )
        else:
            zp_out = jnp.matmul(x_for_zp.sum(axis=-1).astype(zp_dtype), zero_point.astype(zp_dtype))
        out = out - zp_out.astype(out.dtype)
    if x_scale is not None:
        out = out * x_scale.astype(out.dtype)
    return out.astype(out_dtype)


def _result_dtypes(
    x: torch.Tensor,
    scaler: torch.Tensor,
    zero_point: torch.Tensor | None,
    block_size: int,
    quantize_activation: bool,
) -> tuple[torch.dtype, torch.dtype | None]:
    """The eager reference's result dtype, and its zero-point product's dtype."""
    if block_size == -1:
        mm = torch.int32 if quantize_activation else x.dtype
        out = _promote(mm, scaler.dtype)
        if quantize_activation:
            out = _promote(out, x.dtype)
        zp = None if zero_point is None else _promote(mm, zero_point.dtype)
    else:
        out = _promote(scaler.dtype, x.dtype)
        zp = None if zero_point is None else _promote(x.dtype, zero_point.dtype)
    return out, zp


def _quantized_matmul_lazy(
    x: torch.Tensor,
    w: torch.Tensor,
    scaler: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    block_size: int | None = -1,
    int4_weight: bool | None = False,
    quantize_activation: bool | None = False,
) -> torch.Tensor:
    """The lazyxla kernel: one `xla::quantized_matmul` node (see Note [Quantized matmul])."""
    from . import runtime
    from .ir import Node, Ref, TensorSpec
    from .tensor import new_tensor, read, state

    block_size = -1 if block_size is None else block_size
    int4_weight, quantize_activation = bool(int4_weight), bool(quantize_activation)
    _check(x, w, scaler, zero_point, block_size, quantize_activation)
    if int4_weight and block_size == -1 and runtime.jax_devices()[0].platform == "cpu":
        warnings.warn(
            "quantized_matmul with int4_weight=True: XLA:CPU has no int4 dot, so this graph "
            "compiles only on TPU (as in torch_xla); on CPU, pass the weight without "
            "int4_weight (its values are the same in the int8 container)",
            stacklevel=3,
        )
    dtypes = _result_dtypes(x, scaler, zero_point, block_size, quantize_activation)
    operands = [x, w, scaler] + ([] if zero_point is None else [zero_point])
    values = tuple(read(state(t)) for t in operands)
    refs = [Ref(i) for i in range(len(values))]
    out_dim = w.shape[0] if block_size == -1 else w.shape[-1]
    spec = TensorSpec((*x.shape[:-1], out_dim), dtypes[0])
    args = (*refs[:3], refs[3] if zero_point is not None else None)
    args += (block_size, int4_weight, quantize_activation, dtypes)
    node = Node("xla::quantized_matmul", _rule, values, args, (), (spec,))
    return new_tensor((node, 0), spec)


def _rule(
    x: Any,
    w: Any,
    scaler: Any,
    zero_point: Any,
    block_size: int,
    int4_weight: bool,
    quantize_activation: bool,
    dtypes: tuple,
) -> Any:
    return _jax_quantized_matmul(
        x,
        w,
        scaler,
        zero_point,
        block_size=block_size,
        int4_weight=int4_weight,
        quantize_activation=quantize_activation,
        dtypes=dtypes,
    )


XLA_LIB.impl("quantized_matmul", quantized_matmul, "CompositeExplicitAutograd")
XLA_LIB.impl("quantized_matmul", _quantized_matmul_lazy, "PrivateUse1")


# --- the module -----------------------------------------------------------------------------------


class XlaQuantizedLinear(torch.nn.Module):
    """A linear layer with a quantized weight (buffers, not parameters), calling
    `torch.ops.xla.quantized_matmul`.

    Args:
        input_dim: in features.
        output_dim: out features.
        is_symmetric: no zero point.
        block_size: -1 for per-channel scales, else the block size along the input features.
        int4_weight: the weight holds int4 values (in an int8 container).
        quantize_activation: quantize the input to int8 too (per-channel only).

    Example:
        >>> q = XlaQuantizedLinear(16, 8, is_symmetric=True)
        >>> q.load_quantized_weight(w_int8, scale)
        >>> y = q(x)
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        is_symmetric: bool = False,
        block_size: int = -1,
        int4_weight: bool = False,
        quantize_activation: bool = False,
    ) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.is_symmetric = is_symmetric
        self.block_size = block_size
        self.int4_weight = int4_weight
        self.quantize_activation = quantize_activation
        self.register_buffer("weight", torch.zeros(output_dim, input_dim).to(torch.int8))
        self.register_buffer("weight_scaler", torch.zeros(output_dim))
        if not self.is_symmetric:
            self.register_buffer("zero_point", torch.zeros(output_dim))
        else:
            self.zero_point = None

    def load_quantized_weight(
        self,
        weight: torch.Tensor,
        weight_scaler: torch.Tensor,
        zero_point: torch.Tensor | None = None,
    ) -> None:
        """Set the quantized weight, its scales and (asymmetric) zero point, after checking
        their dtypes and shapes against the layer's."""
        if self.block_size == -1:
            _check_per_channel_quant_weight_dtype_shapes(
                self.input_dim, self.output_dim, weight, weight_scaler, zero_point
            )
        else:
            _check_blockwise_quant_weight_dtype_shapes(
                self.input_dim, self.output_dim, self.block_size, weight, weight_scaler, zero_point
            )
        self.weight = weight
        self.weight_scaler = weight_scaler
        self.zero_point = zero_point

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.xla.quantized_matmul(
            x,
            self.weight,
            self.weight_scaler,
            self.zero_point,
            block_size=self.block_size,
            int4_weight=self.int4_weight,
            quantize_activation=self.quantize_activation,
        )


__all__ = ["XlaQuantizedLinear", "quantized_matmul"]
