"""Kernels that are not a lowering: transfers, copies, reading values back, and the CPU fallback."""

from __future__ import annotations

from typing import Any

import torch

from .. import error_messages, fallback, metrics, runtime
from ..dispatch import register_kernel, traced
from ..ir import Node, TensorSpec
from ..tensor import (
    DEVICE_TYPE,
    check_device,
    contiguous_strides,
    new_tensor,
    read,
    state,
    write,
)
from ..transfer import download, upload
from ..writes import cast_value, check_write_overlap, resize_output

aten = torch.ops.aten


# Kernels here replace what install() would derive.
OVERRIDES = {aten.copy_.default, aten.bernoulli.out}


def _spec(t: torch.Tensor, dtype: torch.dtype | None = None) -> TensorSpec:
    return TensorSpec(tuple(t.shape), dtype or t.dtype)


_COPY_LAYOUTS: dict[tuple, tuple[int, ...] | None] = {}


def _copy_layout(x: torch.Tensor, memory_format: Any) -> tuple[int, ...] | None:
    """Eager's strides for a copy of `x` (`memory_format=None` preserves a dense layout), or None
    when contiguous."""
    if memory_format is None and x.is_contiguous():
        return None
    key = (x.shape, x.stride(), memory_format)
    hit = _COPY_LAYOUTS.get(key, ())
    if hit == ():
        meta = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        out = aten._to_copy(meta, memory_format=memory_format)
        hit = _COPY_LAYOUTS[key] = _noncontiguous(out)
    return hit


def _noncontiguous(t: torch.Tensor) -> tuple[int, ...] | None:
    from ..tensor import contiguous_strides

    stride = tuple(t.stride())
    return None if stride == contiguous_strides(tuple(t.shape)) else stride


@traced("xla::_to_copy")
def _to_copy(
    x: torch.Tensor,
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    non_blocking: bool = False,
    memory_format: Any = None,
) -> torch.Tensor:
    target = torch.device(device) if device is not None else x.device
    check_device(target)
    stride = _copy_layout(x, memory_format)
    if x.device.type != DEVICE_TYPE:  # host → device
        return upload(x, dtype, stride)
    if target.type != DEVICE_TYPE:  # device → host
        out = download(x)
        out = out.to(device=target, dtype=dtype or out.dtype)
        if stride is not None:
            out = torch.empty_strided(out.shape, stride, dtype=out.dtype).copy_(out)
        return out
    runtime.check_dtype(dtype or x.dtype, "aten::_to_copy")
    spec = _spec(x, dtype)
    return new_tensor(cast_value(read(state(x)), spec), spec, stride)


_WRAPPED_NUMBER_DTYPES = {
    bool: torch.bool,
    int: torch.int64,
    float: torch.float64,
    complex: torch.complex128,
}


@traced("xla::copy_")
def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if dst.device.type != DEVICE_TYPE:  # device → host copy into an existing CPU tensor
        dst.copy_(download(src))
        return dst
    if src is dst or (isinstance(src, torch.Tensor) and _same_data(dst, src)):
        return dst
    if not isinstance(src, torch.Tensor):  # `t.copy_(3)`: a wrapped number, as eager takes it
        src = torch.tensor(src, dtype=_WRAPPED_NUMBER_DTYPES[type(src)])
    if src.device.type != DEVICE_TYPE:
        src = upload(src)
    _check_copy_shapes(dst.shape, src.shape)
    check_write_overlap(dst, src)
    ds = state(dst)
    write(ds, cast_value(read(state(src)), ds.spec))
    return dst


def _same_data(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether `src` views exactly `dst`'s elements as `dst` does: eager's `copy_` returns at
    once then (Copy.cpp), before its overlap checks (a stride-0 view copied onto itself). The
    storage is compared first: a copy between two storages, the common one, stops there."""
    return (
        src.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr()
        and src.device == dst.device
        and src.storage_offset() == dst.storage_offset()
        and src.stride() == dst.stride()
        and src.shape == dst.shape
        and src.dtype == dst.dtype
        and src.is_conj() == dst.is_conj()
        and src.is_neg() == dst.is_neg()
    )


def _check_copy_shapes(dst: torch.Size, src: torch.Size) -> None:
    """Eager's error for a `copy_` source that does not broadcast to the destination, raised
    when the copy is recorded (not when the graph is lowered)."""
    if src == dst:
        return
    for k in range(1, min(len(src), len(dst)) + 1):
        a, b = dst[-k], src[-k]
        if b not in (a, 1):
            raise RuntimeError(
                f"The size of tensor a ({a}) must match the size of tensor b ({b}) at "
                f"non-singleton dimension {len(dst) - k}"
            )
    if len(src) > len(dst):
        shape = list(torch.broadcast_shapes(dst, src))
        raise RuntimeError(
            f"output with shape {list(dst)} doesn't match the broadcast shape {shape}"
        )


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return copy_(dst, src, non_blocking)


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return copy_(dst, src)


def resize_(x: torch.Tensor, size: Any, memory_format: Any = None) -> torch.Tensor:
    """`Tensor.resize_`, as eager: the tensor takes the new shape with contiguous strides (or
    `memory_format`'s) over its own storage, from its storage offset, reading the storage in
    storage order (a transposed tensor's elements are not reordered). Within the storage's size
    it stays a view of that storage, so its other views still alias it. Past it, eager grows the
    storage in place; lazyxla gives the tensor a new storage holding the old one's elements and
    zeros after them (eager leaves those uninitialized), so tensors that shared the old storage
    no longer see its writes. A resize to the same shape is a no-op, as in eager."""
    size = tuple(int(d) for d in size)
    if any(d < 0 for d in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(size)}")
    if size == tuple(x.shape) and memory_format is None:
        return x
    if memory_format in (None, torch.contiguous_format, torch.preserve_format):
        strides = contiguous_strides(size)
    else:  # channels_last(_3d): eager's strides for that format
        strides = torch.empty(size, device="meta", memory_format=memory_format).stride()
    n = 1
    for d in size:
        n *= d
    offset = x.storage_offset()
    capacity = x.untyped_storage().nbytes() // x.element_size()
    with torch.no_grad():
        if offset + n <= capacity or n == 0:
            x.data = x.detach().as_strided(size, strides, offset)
            return x
        grown = x.new_zeros(offset + n)
        if capacity:
            grown[:capacity] = x.detach().as_strided((capacity,), (1,), 0)
        x.data = grown.as_strided(size, strides, offset)
    return x


def set_source_tensor(x: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """`Tensor.set_(source)`: `x` takes `source`'s storage, shape, strides and offset, so the two
    alias each other, as in eager."""
    if x.dtype != source.dtype:  # eager's error, in its words (C++ type names)
        torch.empty(0, dtype=x.dtype).set_(torch.empty(0, dtype=source.dtype))
    if source.device != x.device:  # (eager's words; set_data's own error named no device)
        raise RuntimeError(
            f'Attempted to set the storage of a tensor on device "{x.device}" to a storage on '
            f'different device "{source.device}".  This is no longer allowed; the devices must '
            "match."
        )
    x.data = source.detach()
    return x


def set_empty(x: torch.Tensor) -> torch.Tensor:
    """`Tensor.set_()`: `x` becomes empty, over a new, empty storage."""
    x.data = torch.empty(0, dtype=x.dtype, device=x.device)
    return x


def _local_scalar_dense(x: torch.Tensor) -> Any:
    # torch_xla runs `.item()` through its CPU fallback and counts it as one; here it is a value
    # read (no op runs on the CPU), counted under torch_xla's name and listed as torch_xla lists it
    # (`metrics.cpu_fallback_ops()` leaves it out: metrics.READS_NOT_FALLBACKS).
    metrics.counter_inc("aten::_local_scalar_dense")
    return download(x).item()


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    return bool(torch.eq(a, b).all().item())


# Note [Like factories read a layout]
# `zeros_like(x)`, `ones_like`, `empty_like` and `full_like` read x's shape, dtype and strides,
# never its values; recorded with x as an input, the result's graph held x's whole pending
# computation (a new graph, and a new compile, for each producer of x) and a tensor without a
# lazy value (FakeTensor's fallback runs `zeros_like(fake)` on the device) failed. They take a
# leaf of x's layout instead (its lowering is zeros, which XLA removes as unused).

_LAYOUT_OF = "xla::layout_of"


def _layout_rule(shape: Any, dtype: Any) -> Any:
    import jax.numpy as jnp

    return jnp.zeros(shape, runtime.jnp_dtype(dtype))


def layout_only(kernel: Any) -> Any:
    def like(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        spec = TensorSpec(tuple(x.shape), x.dtype)
        # (aten: a host read evaluates the leaf as `zeros(shape, dtype=)`)
        leaf = Node(
            _LAYOUT_OF,
            _layout_rule,
            (),
            (spec.shape, spec.dtype),
            (),
            (spec,),
            aten=aten.zeros.default,
        )
        stride = None if x.is_contiguous() else tuple(x.stride())
        return kernel(new_tensor((leaf, 0), spec, stride), *args, **kwargs)

    return like


# Note [Linalg info checks]
# `torch.linalg.inv`, `cholesky`, `solve`, `lu_factor`, ... call their `_ex` twin and then
# `_linalg_check_errors(info)`, which reads `info` to raise eager's "singular matrix" errors. XLA's
# factorizations report no such thing: lazyxla's lowerings return `info` = 0, as torch_xla's do,
# so the check can never raise, yet reading it ran the pending graph in the middle of the step (a
# sync per `inv`), and under torch.compile the traced graph stopped at a placeholder. The check
# reads `info` only where it is device data (an `_ex` op that ran on the CPU fallback reports
# eager's own info, and raises as eager does); a pending `info` is a lowering's zeros. The README's
# "Differences" section says that singular inputs give NaN/inf instead of the error.


def _linalg_check_errors(info: torch.Tensor, api_name: str, *, is_matrix: bool) -> None:
    if state(info).is_pending:
        return
    torch.ops.aten._linalg_check_errors(download(info), api_name, is_matrix=is_matrix)


# --- batch norm: outputs *and* running statistics written in place ---------------------------
# PyTorch's batch-norm entry points update running_mean/var in place (some without saying so in
# their schema), so they cannot be derived from a functional rule: each is the functional op
# `_native_batch_norm_legit_functional` (lowered in nn.py) plus a write of the new statistics.


def _bn(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training and running_mean is not None:
        return aten._native_batch_norm_legit_no_training(
            x, weight, bias, running_mean, running_var, momentum, eps
        )
    c = x.shape[1]
    rm = running_mean if running_mean is not None else torch.zeros(c, device=x.device)
    rv = running_var if running_var is not None else torch.ones(c, device=x.device)
    out, mean, rstd, new_rm, new_rv = aten._native_batch_norm_legit_functional(
        x, weight, bias, rm, rv, True, momentum, eps
    )
    if running_mean is not None:
        copy_(running_mean, new_rm)
        copy_(running_var, new_rv)
    return out, mean, rstd


def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _bn(x, weight, bias, running_mean, running_var, training, momentum, eps)


def native_batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    return _bn(x, weight, bias, None, None, training, momentum, eps)


def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    return _with_reserve(x, _bn(x, weight, bias, running_mean, running_var, True, momentum, eps))


def batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    training = running_mean is None  # no running stats: batch statistics, as PyTorch does
    return _with_reserve(
        x, _bn(x, weight, bias, running_mean, running_var, training, momentum, eps)
    )


def _with_reserve(x, outs):
    """(out, mean, rstd) plus the empty `reserve` buffer the *_update ops also return."""
    return (*outs, torch.empty((0,), dtype=torch.uint8, device=x.device))


def batch_norm_backward(
    grad, x, weight, running_mean, running_var, save_mean, save_var, update, eps, mask, reserve
):
    return aten.native_batch_norm_backward(
        grad, x, weight, running_mean, running_var, save_mean, save_var, update, eps, mask
    )


# --- kron's out= variant --------------------------------------------------------------------
# ATen's kron(out=) (CompositeImplicitAutograd, so it reaches no lowering) resizes `out`, then
# multiplies into `at::_unsafe_view(out, ...)`: in eager a tensor sharing out's storage, in
# lazyxla a new value, so the product never reached `out` (a silent wrong result). The same
# computation through a true view of `out`:


def kron_out(self: torch.Tensor, other: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    n = max(self.dim(), other.dim())
    a = [1] * (n - self.dim()) + list(self.shape)
    b = [1] * (n - other.dim()) + list(other.shape)
    mul_shape = [d for i in range(n) for d in (a[i], b[i])]
    resize_output(out, tuple(a[i] * b[i] for i in range(n)))
    a_view = self.reshape([d for i in range(n) for d in (a[i], 1)])
    b_view = other.reshape([d for i in range(n) for d in (1, b[i])])
    torch.mul(a_view, b_view, out=out.view(mul_shape))
    return out


def bernoulli_out(self: torch.Tensor, *, generator: Any = None, out: torch.Tensor) -> torch.Tensor:
    """As eager's `bernoulli_out`: `out` takes self's shape and 0/1 draws in its own dtype (an
    integer or bool `out` too), where the generic out path would refuse a float-to-int cast."""
    out.resize_as_(self)
    return out.bernoulli_(self, generator=generator)


# --- as_strided_scatter of a strided input ------------------------------------------------------
# `as_strided_scatter(self, src, size, stride, offset)` is the inverse of `self.as_strided(size,
# stride, offset)`, whose offset and strides address self's storage. Eager's result has self's
# layout (strides and storage offset) over a copy of that storage, and src lands where the view
# addresses it: an element of self only where the view meets self's own elements. The lowering
# (shape.py) addresses self's logical elements, which is the same only where self is its whole
# storage, contiguous, and the view stays inside it (`as_strided_scatter(x[1::2], src, (), (), 0)`
# wrote x[1::2][0], eager writes storage element 0, outside the view; a view past the end of
# `x[:3]` was clamped back into it, one past the storage's end wrote where eager raises).
# Otherwise the same computation through lazyxla's storage views, whose as_strided checks bounds:


def _view_inside(x: torch.Tensor, size: Any, stride: Any, offset: Any) -> bool:
    """Whether `x.as_strided(size, stride, offset)` only addresses x's own elements, in order."""
    if x.storage_offset() or not x.is_contiguous():
        return False
    if x.untyped_storage().nbytes() != x.numel() * x.element_size():
        return False
    if 0 in size:
        return True
    offset = offset or 0
    return offset >= 0 and offset + sum((n - 1) * s for n, s in zip(size, stride)) < x.numel()


def as_strided_scatter_kernel(functional: Any) -> Any:
    def kernel(
        x: torch.Tensor, src: torch.Tensor, size: Any, stride: Any, storage_offset: Any = None
    ) -> torch.Tensor:
        if _view_inside(x, size, stride, storage_offset):
            return functional(x, src, size, stride, storage_offset)
        buf = torch.zeros(
            x.untyped_storage().nbytes() // x.element_size(), dtype=x.dtype, device=x.device
        )
        out = buf.as_strided(x.shape, x.stride(), x.storage_offset())
        out.copy_(x)
        offset = x.storage_offset() if storage_offset is None else storage_offset
        buf.as_strided(size, stride, offset).copy_(src)
        return out

    return kernel


def install() -> None:
    register_kernel(aten.kron.out, kron_out)
    register_kernel(aten.bernoulli.out, bernoulli_out)
    register_kernel(aten._to_copy.default, _to_copy)
    register_kernel(aten.copy_.default, copy_)
    register_kernel(aten._copy_from.default, _copy_from)
    register_kernel(aten._copy_from_and_resize.default, _copy_from_and_resize)
    register_kernel(aten._local_scalar_dense.default, _local_scalar_dense)
    register_kernel(aten.resize_.default, resize_)
    register_kernel(aten.set_.source_Tensor, set_source_tensor)
    register_kernel(aten.set_.default, set_empty)
    register_kernel(aten.equal.default, equal)
    register_kernel(aten._linalg_check_errors.default, _linalg_check_errors)
    register_kernel(aten.native_batch_norm.default, native_batch_norm)
    register_kernel(aten._native_batch_norm_legit.default, native_batch_norm)
    register_kernel(aten._native_batch_norm_legit.no_stats, native_batch_norm_no_stats)
    register_kernel(aten._batch_norm_with_update.default, batch_norm_with_update)
    register_kernel(aten._batch_norm_no_update.default, batch_norm_no_update)
    register_kernel(aten.batch_norm_backward.default, batch_norm_backward)
    # Note [Shift operators]: `x << n`, `x >>= t` are aten's __lshift__/__irshift__ family, ops of
    # their own that eager's CPU computes with bitwise_left_shift's kernel and promotion. Their
    # meta kernels refuse a bool `self` that eager shifts (`bool_tensor << 2` is int64), so they
    # record as the bitwise ops they are.
    for dunder, idunder, op, inplace in (
        (aten.__lshift__, aten.__ilshift__, aten.bitwise_left_shift, aten.bitwise_left_shift_),
        (aten.__rshift__, aten.__irshift__, aten.bitwise_right_shift, aten.bitwise_right_shift_),
    ):
        register_kernel(dunder.Scalar, op.Tensor_Scalar)
        register_kernel(dunder.Tensor, op.Tensor)
        register_kernel(idunder.Scalar, inplace.Tensor_Scalar)
        register_kernel(idunder.Tensor, inplace.Tensor)
    fallback.install()
    error_messages.install()
