"""`torch.autocast("jax")`: the CUDA autocast policy on lazyxla's device.

PyTorch has autocast kernels for its own backends only; for PrivateUse1 the AutocastPrivateUse1 key
is empty. We register a fallthrough for every op and, for the ops CUDA's policy lists, a kernel that
casts floating-point tensor arguments (to the autocast dtype for matmul-like ops, to float32 for
precision-sensitive ones) and redispatches below autocast.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten
_KEY = "AutocastPrivateUse1"

# CUDA's autocast lists (aten/src/ATen/autocast_mode.cpp), the ops models here reach.
_LOWER = [
    aten.mm.default,
    aten.bmm.default,
    aten.addmm.default,
    aten.baddbmm.default,
    aten.addbmm.default,
    aten.matmul.default,
    aten.linear.default,
    aten.conv1d.default,
    aten.conv2d.default,
    aten.conv3d.default,
    aten.conv_transpose1d.default,
    aten.conv_transpose2d.input,
    aten.conv_transpose3d.input,
    aten.mv.default,
    aten.dot.default,
    aten.einsum.default,
    aten.scaled_dot_product_attention.default,
]
_FP32 = [
    aten.softmax.int,
    aten.log_softmax.int,
    aten.layer_norm.default,
    aten.group_norm.default,
    aten.rms_norm.default,
    aten.cross_entropy_loss.default,
    aten.nll_loss.default,
    aten.mse_loss.default,
    aten.binary_cross_entropy_with_logits.default,
    aten.pow.Tensor_Scalar,
    aten.exp.default,
    aten.log.default,
    aten.sum.dim_IntList,
    aten.cumsum.default,
    aten.norm.Scalar,
]

_libs: list[torch.library.Library] = []


def _cast(v: Any, dtype: torch.dtype) -> Any:
    if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != torch.float64:
        return v.to(dtype)
    if isinstance(v, (list, tuple)):
        return type(v)(_cast(x, dtype) for x in v)
    return v


def _kernel(op: Any, lower: bool) -> Any:
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype("jax") if lower else torch.float32
        args, kwargs = _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            return op(*args, **kwargs)

    return kernel


def install() -> None:
    if _libs:
        return
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, _KEY)
    lib = torch.library.Library("aten", "IMPL")
    for op in _LOWER:
        lib.impl(op, _kernel(op, True), _KEY)
    for op in _FP32:
        lib.impl(op, _kernel(op, False), _KEY)
    _libs.extend([fallback, lib])
