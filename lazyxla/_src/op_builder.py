"""torch_xla's Python op builder (`xla_builder.Op`) and op registry, over `jax.lax`.

# Note [Op builder]
torch_xla's `xb.Op` wraps an XLA client op; users compose them (`a + b`, `a.cast(Type.BF16)`,
`Op.mkwhile(...)`) inside a lowering function, and `xor.register(name, fn)` turns that function
into a PyTorch op. Here an `Op` wraps a traced JAX value (an array, or a tuple of Ops), each
method is the matching `jax.lax`/`jax.numpy` call, and a registered op runs its lowering function
through `call_jax` (Note [call_jax]): the function is traced once per input signature and becomes
one node of the lazy graph. `builder()` returns a token (JAX needs no builder object); `Shape`
carries the sizes and torch_xla's type name.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import runtime
from .jax_interop import call_jax


class Type:
    F32 = "f32"
    F64 = "f64"
    BF16 = "bf16"
    F16 = "f16"
    U8 = "u8"
    S8 = "s8"
    U16 = "u16"
    S16 = "s16"
    U32 = "u32"
    S32 = "s32"
    U64 = "u64"
    S64 = "s64"
    C64 = "c64"
    C128 = "c128"
    PRED = "pred"


XLA_PT_TYPE_MAP = {
    Type.F32: torch.float32,
    Type.F64: torch.float64,
    Type.BF16: torch.bfloat16,
    Type.F16: torch.float16,
    Type.U8: torch.uint8,
    Type.S8: torch.int8,
    Type.U16: torch.uint16,
    Type.S16: torch.int16,
    Type.U32: torch.uint32,
    Type.S32: torch.int32,
    Type.U64: torch.uint64,
    Type.S64: torch.int64,
    Type.C64: torch.complex64,
    Type.C128: torch.complex128,
    Type.PRED: torch.bool,
}
_PT_XLA_TYPE_MAP = {v: k for k, v in XLA_PT_TYPE_MAP.items()}


def _np_dtype(t: str | torch.dtype) -> np.dtype:
    pt = XLA_PT_TYPE_MAP[t] if isinstance(t, str) else t
    return runtime.jnp_dtype(pt)


def _xla_type(dtype: Any) -> str:
    return _PT_XLA_TYPE_MAP[runtime.NP_TO_TORCH[np.dtype(dtype)]]


class Shape:
    """An op's shape: `sizes` and torch_xla's type name (`dtype`, e.g. 'f32')."""

    def __init__(self, sizes: Sequence[int], dtype: str) -> None:
        self.sizes, self.dtype = tuple(sizes), dtype
        self.rank = len(self.sizes)

    def __repr__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.sizes))}]"


class _Builder:
    """torch_xla's XLA builder handle; JAX traces without one."""


_BUILDER = _Builder()


def _v(x: Any) -> Any:
    return x.value if isinstance(x, Op) else x


class Op:
    """A traced value inside a registered op's lowering function (see Note [Op builder])."""

    def __init__(self, value: Any) -> None:
        self.value = value

    # --- structure ---
    def builder(self) -> _Builder:
        return _BUILDER

    def shape(self) -> Shape:
        return Shape(jnp.shape(self.value), _xla_type(jnp.result_type(self.value)))

    @staticmethod
    def tuple(ops: Sequence[Op], builder: Any = None) -> Op:
        return Op(tuple(ops))

    def get_tuple_element(self, index: int) -> Op:
        return self.value[index]

    @staticmethod
    def scalar(builder: Any, value: Any, dtype: str | None = None) -> Op:
        return Op(jnp.asarray(value, _np_dtype(dtype) if dtype else None))

    @staticmethod
    def zero(builder: Any, dtype: str | None = None) -> Op:
        return Op.scalar(builder, 0, dtype)

    @staticmethod
    def one(builder: Any, dtype: str | None = None) -> Op:
        return Op.scalar(builder, 1, dtype)

    @staticmethod
    def to_torch_type(dtype: str) -> torch.dtype:
        return XLA_PT_TYPE_MAP[dtype]

    @staticmethod
    def from_torch_type(dtype: torch.dtype) -> str:
        return _PT_XLA_TYPE_MAP[dtype]

    # --- arithmetic and comparison ---
    def _bin(self, other: Any, fn: Callable[[Any, Any], Any], swap: bool = False) -> Op:
        a, b = self.value, _v(other)
        return Op(fn(b, a) if swap else fn(a, b))

    def __add__(self, o: Any) -> Op:
        return self._bin(o, jnp.add)

    def __radd__(self, o: Any) -> Op:
        return self._bin(o, jnp.add, True)

    def __sub__(self, o: Any) -> Op:
        return self._bin(o, jnp.subtract)

    def __rsub__(self, o: Any) -> Op:
        return self._bin(o, jnp.subtract, True)

    def __mul__(self, o: Any) -> Op:
        return self._bin(o, jnp.multiply)

    def __rmul__(self, o: Any) -> Op:
        return self._bin(o, jnp.multiply, True)

    def __truediv__(self, o: Any) -> Op:
        return self._bin(o, lambda a, b: jax.lax.div(a, jnp.asarray(b, jnp.result_type(a))))

    def __mod__(self, o: Any) -> Op:
        return self._bin(o, jax.lax.rem)

    def __pow__(self, o: Any) -> Op:
        return self._bin(o, jnp.power)

    def __neg__(self) -> Op:
        return Op(jnp.negative(self.value))

    def __and__(self, o: Any) -> Op:
        return self._bin(o, jnp.bitwise_and)

    def __or__(self, o: Any) -> Op:
        return self._bin(o, jnp.bitwise_or)

    def __xor__(self, o: Any) -> Op:
        return self._bin(o, jnp.bitwise_xor)

    def __lt__(self, o: Any) -> Op:
        return self._bin(o, jnp.less)

    def __le__(self, o: Any) -> Op:
        return self._bin(o, jnp.less_equal)

    def __gt__(self, o: Any) -> Op:
        return self._bin(o, jnp.greater)

    def __ge__(self, o: Any) -> Op:
        return self._bin(o, jnp.greater_equal)

    def eq(self, o: Any) -> Op:
        return self._bin(o, jnp.equal)

    def ne(self, o: Any) -> Op:
        return self._bin(o, jnp.not_equal)

    def max(self, o: Any) -> Op:
        return self._bin(o, jnp.maximum)

    def min(self, o: Any) -> Op:
        return self._bin(o, jnp.minimum)

    def __getattr__(self, name: str) -> Any:
        unary = _UNARY.get(name)
        if unary is None:
            raise AttributeError(f"xla_builder.Op has no operation {name!r}")
        return lambda: Op(unary(self.value))

    # --- shape and type ---
    def cast(self, dtype: str) -> Op:
        return Op(jnp.asarray(self.value).astype(_np_dtype(dtype)))

    def reshape(self, sizes: Sequence[int], dimensions: Sequence[int] | None = None) -> Op:
        v = jnp.transpose(self.value, dimensions) if dimensions else self.value
        return Op(jnp.reshape(v, tuple(sizes)))

    def broadcast(self, sizes: Sequence[int]) -> Op:
        return Op(jax.lax.broadcast(self.value, tuple(sizes)))

    def broadcast_in_dim(self, sizes: Sequence[int], dimensions: Sequence[int]) -> Op:
        return Op(jax.lax.broadcast_in_dim(self.value, tuple(sizes), tuple(dimensions)))

    def transpose(self, permutation: Sequence[int]) -> Op:
        return Op(jnp.transpose(self.value, tuple(permutation)))

    def slice(self, start: Sequence[int], limit: Sequence[int], strides: Any = None) -> Op:
        return Op(jax.lax.slice(self.value, tuple(start), tuple(limit), strides))

    def slice_in_dim(self, start: int, limit: int, dimno: int, stride: int = 1) -> Op:
        return Op(jax.lax.slice_in_dim(self.value, start, limit, stride, dimno))

    def concat_in_dim(self, ops: Sequence[Op], dimension: int) -> Op:
        return Op(jnp.concatenate([self.value, *(_v(o) for o in ops)], axis=dimension))

    def select(self, true_value: Any, false_value: Any) -> Op:
        return Op(jnp.where(self.value, _v(true_value), _v(false_value)))

    def dot(self, other: Op) -> Op:
        return Op(jnp.dot(self.value, _v(other)))

    def reduce_sum(self, dimensions: Sequence[int], keep_dims: bool = False) -> Op:
        return Op(jnp.sum(self.value, axis=tuple(dimensions), keepdims=keep_dims))

    def reduce_max(self, dimensions: Sequence[int], keep_dims: bool = False) -> Op:
        return Op(jnp.max(self.value, axis=tuple(dimensions), keepdims=keep_dims))

    def reduce_min(self, dimensions: Sequence[int], keep_dims: bool = False) -> Op:
        return Op(jnp.min(self.value, axis=tuple(dimensions), keepdims=keep_dims))

    def triangualr_solve(
        self, b: Op, left_side: bool, lower: bool, unit_diagonal: bool, transpose_a: bool
    ) -> Op:
        """Solve `op(A) X = B` (`left_side`) for X, A being this op (torch_xla's spelling)."""
        return Op(
            jax.lax.linalg.triangular_solve(
                self.value,
                _v(b),
                left_side=left_side,
                lower=lower,
                transpose_a=transpose_a,
                unit_diagonal=unit_diagonal,
            )
        )

    triangular_solve = triangualr_solve

    # --- control flow ---
    def mkconditional(self, operands: Sequence[Op], true_fn: Callable, false_fn: Callable) -> Op:
        """`true_fn(*operands)` if this predicate holds, else `false_fn(*operands)`."""
        ops = tuple(_v(o) for o in operands)

        def branch(fn: Callable) -> Callable:
            return lambda args: _unwrap(fn(*(Op(a) for a in args)))

        return _wrap(jax.lax.cond(self.value, branch(true_fn), branch(false_fn), ops))

    @staticmethod
    def mkwhile(init: Sequence[Op], cond_fn: Callable, body_fn: Callable) -> Op:
        """A tuple Op: `init` carried through `body_fn` while `cond_fn` holds."""
        state = tuple(_v(o) for o in init)

        def cond(s: tuple) -> Any:
            return _v(cond_fn(*(Op(a) for a in s)))

        def body(s: tuple) -> tuple:
            out = body_fn(*(Op(a) for a in s))
            return tuple(_v(o) for o in (out.value if isinstance(out.value, tuple) else (out,)))

        return _wrap(jax.lax.while_loop(cond, body, state))


_UNARY: dict[str, Callable[[Any], Any]] = {
    "abs": jnp.abs,
    "exp": jnp.exp,
    "log": jnp.log,
    "log1p": jnp.log1p,
    "sqrt": jnp.sqrt,
    "rsqrt": jax.lax.rsqrt,
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "floor": jnp.floor,
    "ceil": jnp.ceil,
    "sign": jnp.sign,
    "logical_not": jnp.logical_not,
    "neg": jnp.negative,
}


def _unary_method(fn: Callable[[Any], Any]) -> Callable[[Op], Op]:
    return lambda self: Op(fn(self.value))


# `a.sin()` and torch_xla's static spelling `Op.sin(a)` alike.
for _name, _fn in _UNARY.items():
    setattr(Op, _name, _unary_method(_fn))


def _wrap(v: Any) -> Op:
    if isinstance(v, tuple | list):
        return Op(tuple(_wrap(x) for x in v))
    return Op(v)


def _unwrap(o: Any) -> Any:
    if isinstance(o, Op):
        o = o.value
    if isinstance(o, tuple | list):
        return tuple(_unwrap(x) for x in o)
    return o


def tensor_shape(tensors: Any) -> Shape | list[Shape]:
    """torch_xla's shape of a tensor, or the list of shapes of a list of tensors."""
    if isinstance(tensors, list | tuple):
        return [Shape(t.shape, _PT_XLA_TYPE_MAP[t.dtype]) for t in tensors]
    return Shape(tensors.shape, _PT_XLA_TYPE_MAP[tensors.dtype])


# --- computations: built once, applied to tensors (torch_xla's XlaComputation) -------------------


class Computation:
    """torch_xla's `XlaComputation` built by `create_computation`: an Op-builder function of
    parameters of fixed shapes. Here it is the JAX function, its parameter shapes, and the hash of
    its HLO (two computations with the same HLO are one executable, as in torch_xla)."""

    def __init__(self, name: str, fn: Callable[..., Any], shapes: Sequence[Shape], **kw: Any):
        self.name = name
        self.shapes = list(shapes)

        def jax_fn(*arrays: Any) -> Any:
            return _unwrap(fn(*(Op(a) for a in arrays), **kw))

        jax_fn.__name__ = name
        self.fn = jax_fn
        structs = [jax.ShapeDtypeStruct(sh.sizes, _np_dtype(sh.dtype)) for sh in self.shapes]
        self.hlo = jax.jit(jax_fn).lower(*structs).as_text()
        self.key = ("computation", hashlib.md5(self.hlo.encode()).hexdigest())


def create_computation(name: str, fn: Callable[..., Any], shapes: Sequence[Any], **kw: Any):
    """torch_xla's `xb.create_computation`: `fn` (written with `Op`) over parameters of `shapes`
    (`Shape`s; a one-element list is the shape it holds, as `[tensor_shape(t)]` gives)."""
    flat = [sh[0] if isinstance(sh, list | tuple) and len(sh) == 1 else sh for sh in shapes]
    return Computation(name, fn, flat, **kw)


def get_computation_hlo(computation: Computation) -> str:
    """The computation's HLO text (StableHLO, as JAX lowers it)."""
    return computation.hlo


def _need_inputs(what: str, inputs: Sequence[Any]) -> None:
    if len(inputs) == 0:
        raise RuntimeError(f"{what}: expected at least 1 input tensor.")


def user_computation(name: str, inputs: Sequence[torch.Tensor], computation: Computation) -> Any:
    """torch_xla's `_XLAC._xla_user_computation`: `computation` applied to `inputs` as one node of
    the lazy graph; returns the list of its outputs (a tuple root gives one per element)."""
    _need_inputs(f"user_computation({name})", inputs)
    for i, (t, sh) in enumerate(zip(inputs, computation.shapes)):
        want = (tuple(sh.sizes), XLA_PT_TYPE_MAP[sh.dtype])
        if (tuple(t.shape), t.dtype) != want:
            raise RuntimeError(
                f"user_computation({name}): input {i} is {_PT_XLA_TYPE_MAP.get(t.dtype)}"
                f"{list(t.shape)}, but the computation was built for {sh!r}"
            )
    out = call_jax(computation.fn, tuple(inputs), name=name, override_hash=computation.key)
    return list(out) if isinstance(out, tuple | list) else [out]


def xla_computation_as_func(computation: Computation, name: str | None = None) -> Any:
    """torch_xla's `xb.xla_computation_as_func`: a function of a list of tensors."""
    name = name or "xla::computation"
    if "::" not in name:
        name = "xla::" + name
    return lambda input_tensors: user_computation(name, input_tensors, computation)


def _check_custom_call(
    what: str, inputs: Sequence[Any], shapes: Sequence[Any], dtypes: Sequence[Any]
):
    """torch_xla's checks of a custom call's arguments, with its messages."""
    _need_inputs(what, inputs)
    if len(shapes) != len(dtypes):
        raise RuntimeError(
            f"{what}: expected the given output shapes (size={len(shapes)}) to be of the same "
            f"size as the given output dtypes (size={len(dtypes)})."
        )


def custom_call(
    inputs: Sequence[torch.Tensor],
    call_target: str,
    output_shapes: Sequence[Sequence[int]],
    output_dtypes: Sequence[torch.dtype],
    has_side_effect: bool = False,
    backend_config: str = "",
    api_version: int = 0,
    frontend_attributes: dict | None = None,
) -> list[torch.Tensor]:
    """torch_xla's `_XLAC._xla_custom_call`: checked as torch_xla checks it, then the custom call
    (Note [Custom calls] in custom_call.py); returns the list of its results."""
    from .custom_call import stablehlo_custom_call

    _check_custom_call(f"custom_call({call_target})", inputs, output_shapes, output_dtypes)
    out = stablehlo_custom_call(
        inputs, call_target, output_shapes, output_dtypes, has_side_effect, backend_config,
        api_version, frontend_attributes,
    )  # fmt: skip
    return out if isinstance(out, list) else [out]


def tpu_custom_call(
    inputs: Sequence[torch.Tensor],
    payload: str,
    output_shapes: Sequence[Sequence[int]],
    output_dtypes: Sequence[torch.dtype],
) -> list[torch.Tensor]:
    """torch_xla's `_XLAC._xla_tpu_custom_call` (a Mosaic kernel): checked as torch_xla checks it,
    then refused: Mosaic kernels run on TPUs only."""
    _check_custom_call("tpu_custom_call()", inputs, output_shapes, output_dtypes)
    raise NotImplementedError(
        "tpu_custom_call(): a Mosaic (Pallas TPU) kernel runs only on a TPU; lazyxla runs on "
        f"{runtime.jax_devices()[0].platform.upper()}. Use the kernel's reference implementation"
    )


class RegisteredOp:
    """A PyTorch op whose computation is an Op-builder function (torch_xla's `xor.Op`)."""

    def __init__(self, name: str, opfn: Callable[..., Any]) -> None:
        self._name, self._opfn = name, opfn
        self._lock = threading.Lock()

        def jax_fn(*arrays: Any, **kwargs: Any) -> Any:
            return _unwrap(opfn(*(Op(a) for a in arrays), **kwargs))

        jax_fn.__name__ = name
        self._jax_fn = jax_fn

    def __call__(self, *args: torch.Tensor, **kwargs: Any) -> Any:
        with self._lock:
            out = call_jax(self._jax_fn, tuple(args), kwargs, name=self._name)
        if isinstance(out, tuple) and len(out) == 1:
            return out[0]
        return out


def register(name: str, opfn: Callable[..., Any]) -> RegisteredOp:
    """A PyTorch op computing `opfn` (written with `xla_builder.Op`) on lazyxla tensors."""
    return RegisteredOp(name, opfn)


# --- placeholder tensors --------------------------------------------------------------------------

# Note [Placeholder tensors]
# torch_xla's `create_placeholder_tensor(shape, dtype)` is a device tensor with no buffer: it
# stages out a graph (its ops are recorded, `_get_xla_tensors_hlo` shows it as a parameter) and
# reading its value fails. Here it is a device-data leaf whose array is a deleted jax Array of that
# shape, dtype and placement (a zero buffer made on the device, no host transfer, then freed): the
# graph key, IR text and lowering see an ordinary parameter, and running a graph that reads it
# raises JAX's RuntimeError ("Array has been deleted"), the state of a donated buffer, which
# torch_xla also reports as a placeholder. It receives data by being written (`p.copy_(t)`) or by
# `_replace_xla_tensor`. `mark_sharding` of a placeholder must give it a new placeholder array with
# the sharding (`placeholder_array`), as torch_xla makes a sharded placeholder: there is no data
# to move.
_placeholders: dict[int, Any] = {}  # id(array) -> weakref: the arrays made as placeholders


def create_placeholder_tensor(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A lazyxla tensor of `shape` and `dtype` with no device buffer (torch_xla's
    `xla_builder.create_placeholder_tensor`); see Note [Placeholder tensors].

    Args:
        shape: the tensor's sizes.
        dtype: its torch dtype.

    Returns:
        A tensor usable in traced computations; reading its value raises RuntimeError.

    Example:
        >>> p = create_placeholder_tensor((2, 3), torch.bfloat16)
        >>> hlo = torch_xla._XLAC._get_xla_tensors_hlo([torch.sin(p)])
    """
    from .ir import TensorSpec, device_data
    from .sharding import sharding_key, upload_placement
    from .tensor import new_tensor

    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"create_placeholder_tensor: dtype must be a torch.dtype, got {dtype!r}")
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"create_placeholder_tensor: negative size in shape {shape}")
    runtime.check_dtype(dtype, "a placeholder tensor")
    spec = TensorSpec(shape, dtype)
    placement = upload_placement()
    arr = placeholder_array(shape, dtype, placement)
    return new_tensor(
        (device_data(arr, spec, sharding=sharding_key(placement, len(shape))), 0), spec
    )


def placeholder_array(shape: tuple[int, ...], dtype: torch.dtype, placement: Any) -> jax.Array:
    """A deleted array of `shape`, `dtype` and `placement` (a device or a sharding), remembered
    as a placeholder (Note [Placeholder tensors])."""
    import weakref

    arr = jnp.zeros(shape, runtime.jnp_dtype(dtype), device=placement)
    arr.delete()
    key = id(arr)
    _placeholders[key] = weakref.ref(arr, lambda _: _placeholders.pop(key, None))
    return arr


def _data_array(t: torch.Tensor) -> Any:
    """The device array `t` holds, or None if its value is pending."""
    from .ir import DEVICE_DATA
    from .tensor import is_lazy, read, state

    if not is_lazy(t):
        raise TypeError(f"expected a lazyxla tensor, got a {t.device} tensor")
    node = read(state(t))[0]
    return node.data if node.op == DEVICE_DATA else None


def made_as_placeholder(arr: Any) -> bool:
    """Whether device array `arr` was made by `placeholder_array`."""
    ref = _placeholders.get(id(arr))
    return ref is not None and ref() is arr


def is_placeholder(t: torch.Tensor) -> bool:
    """Whether `t` holds device data without a buffer: a placeholder, or a donated (deleted)
    buffer (torch_xla's `_XLAC._is_placecholder`)."""
    arr = _data_array(t)
    return arr is not None and arr.is_deleted()


def tensors_handle(tensors: Sequence[torch.Tensor]) -> list[int]:
    """A unique id of each tensor's device buffer (torch_xla's `_XLAC._get_tensors_handle`);
    pending values are executed first. A placeholder gets an id of its own; a buffer that was
    donated (deleted) has none: RuntimeError."""
    from .transfer import materialize

    handles = []
    for t in tensors:
        arr = _data_array(t)
        if arr is None:
            arr = materialize(t)
        if made_as_placeholder(arr):
            handles.append(id(arr))
        elif arr.is_deleted():
            raise RuntimeError(
                f"_get_tensors_handle: the buffer of a tensor of shape {tuple(t.shape)} is deleted "
                "(it was donated to a graph that wrote its output into it); it has no handle"
            )
        else:
            handles.append(min(s.data.unsafe_buffer_pointer() for s in arr.addressable_shards))
    return handles
