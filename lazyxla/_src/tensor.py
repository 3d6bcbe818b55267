"""The lazy tensor: a plain PrivateUse1 tensor on device `jax:N` whose value lives in the IR.

# Note [Lazy tensor identity]
A lazyxla tensor is an ordinary `torch.Tensor` created by `torch._C._acc.create_empty_tensor`
(0-byte storage, PrivateUse1 dispatch keys): no subclass, no `__torch_dispatch__`. PyTorch therefore
treats it as any device tensor (autograd, `nn.Parameter`, `model.to`, dynamo's FakeTensor). Its
state, a `LazyState`, hangs off its *storage* (`t.untyped_storage()._lx`), not the tensor object:
autograd, `detach()`, `.data` and `Parameter` make shallow TensorImpl copies that share the storage,
and all of them must see the same value. No weakref ever points at a tensor (DESIGN.md); the live
registry holds the states.

# Note [Views and mutation]
lazyxla functionalizes in Python, the way PyTorch's FunctionalTensorWrapper does in C++:
- Every storage is either a *base* (it owns a value) or a *view*: it points at its root base and
  carries the chain of view ops (`ViewOp`: select, slice, permute, reshape, ...) from the base to
  itself, plus a cached value and the base version that value was computed from.
- Reading a view whose cached version is stale replays its chain on the base's current value.
- Writing a tensor (any in-place op, `copy_`, `out=`) computes the new value functionally, then, if
  the tensor is a view, scatters it back through the chain (`select_scatter`, `slice_scatter`,
  inverse permute/reshape, ...) to produce the base's new value and bumps the base's version. Every
  other view of that base is then stale and replays on its next read, so all aliases agree, as in
  eager.
- Every lazy tensor carries eager's layout metadata: the sizes, strides and storage offset the
  same op gives on the CPU (PyTorch's meta kernels compute them, see `meta.infer_layout`). So
  PyTorch's own composite ops decide copy-versus-alias as eager does: `b.t().contiguous()`,
  `reshape` and `flatten` of a non-contiguous tensor copy, `view` of one raises. The value itself
  is logical (a JAX array of the tensor's shape); the layout is metadata only, except where eager
  reads the storage directly (`as_strided`, whose view is taken from the root base's storage
  order).
- See Note [Fake data pointers] for `data_ptr()`.
- So that autograd never replays a view through `as_strided`, lazyxla turns on autograd's view
  replay (`torch._C._set_view_replay_enabled`), as XLA devices get by default from
  `Device::supports_as_strided() == false`. Only functional ops reach the lowering: in-place
  kernels are derived from functional rules.

# Note [Fake data pointers]
A lazy storage holds no bytes, but programs observe aliasing through `data_ptr()`: transformers'
`id_tensor_storage` (tied weights in `save_pretrained`), `untyped_storage().data_ptr()` equality,
`t.data_ptr()` of a slice. Each base storage therefore gets a unique, never-dereferenced address
range of its byte size (`_reserve`, an address space no allocation uses), and each view's storage
gets its root's address and size, so `data_ptr()`s compare as in eager: a view shares its base's
storage pointer and `t.data_ptr()` adds its storage offset; a copy gets a new range. The storage
is built by `_construct_storage_from_data_pointer` (a non-owning pointer, so nothing is ever freed
or read through it) and swapped into the tensor's own storage object, which keeps the `LazyState`.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from . import metrics
from .config import FLAGS
from .ir import DEVICE_DATA, Node, TensorSpec

DEVICE_TYPE = "jax"

Value = tuple[Node, int]
_weakref = weakref.ref


class ViewOp:
    """One step of a view chain: how to read the view from its parent, and write it back."""

    __slots__ = ("name", "apply", "scatter")

    def __init__(
        self,
        name: str,
        apply: Callable[[Value], Value],
        scatter: Callable[[Value, Value], Value] | None,
    ) -> None:
        self.name = name
        self.apply = apply
        self.scatter = scatter


class LazyState:
    """The value of one lazy storage (see Note [Lazy tensor identity] and [Views and mutation])."""

    __slots__ = (
        "value",
        "spec",
        "stride",
        "overlaps",
        "failed",
        "base",
        "chain",
        "version",
        "seen",
        "seq",
        "sharding",
        "ir_data",
        "fill",
        "__weakref__",
    )

    def __init__(self, value: Value, spec: TensorSpec, stride: tuple[int, ...] | None) -> None:
        # creation order: a sync's roots are ordered by it (stable keys)
        self.seq = seq = next(_seq)
        self.value = value
        self.spec = spec
        self.stride = stride  # a base's strides when not contiguous: its storage order
        self.overlaps = False  # a view whose elements share locations (see `write`)
        self.failed: BaseException | None = None  # Note [Failed graphs] in graph.py
        self.base: LazyState | None = None
        self.chain: tuple[ViewOp, ...] = ()
        self.version = 0
        self.seen = 0
        self.sharding: Any = None  # a sharding.ShardingAnnotation set by mark_sharding
        self.fill: Node | None = None  # Note [A state's first value is data]
        _live[seq] = _weakref(self)
        if len(_live) > _prune_at[0]:
            _prune()

    @property
    def is_pending(self) -> bool:
        return self.value[0].op != DEVICE_DATA


# Note [SPMD virtual device]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# In SPMD mode torch_xla keeps a CPU tensor moved to the device (`t.to(device)`, `model.to(device)`,
# a CPU fallback's result) on the host, on its virtual device `SPMD:0`, and uploads it only when
# it is needed: `mark_sharding` uploads it straight into its shards (no replicated copy on every
# device first: a large model's weights never exist once per device when they are sharded right
# after `.to()`), and a first use as an op's input, a read or a sync uploads it replicated.
# lazyxla does the same with a `HostState`: the storage state of such a tensor, whose value slot
# holds a private copy of the host data instead of an IR value. Reading its `value` (which every
# path does that records an op on it, reads it, views it, writes it in place, hands it to a
# compiled graph or checkpoint: `read`, `write`, the copy kernels, dynamo's replay) uploads the
# data replicated, binds a device-data leaf and turns the state back into a plain `LazyState`
# (`transfer.resolve_host`): the upload happens in one place, once, and nothing downstream ever
# sees anything but device data. Assigning its `value` (a whole-tensor write) drops the host copy.
# Only code that must not upload looks at a `HostState` as such: `mark_sharding` (the sharded
# upload, counted as torch_xla's `VirtualDeviceUsage`), the scans over live tensors that a sync or
# a donation check runs (a `HostState` is neither pending nor device data), the sharding spec and
# `_get_xla_tensor_debug_info` ("Tensor on host: with size [5, 5]"). A user sync uploads every
# deferred tensor, as torch_xla's sync does (`SyncTensorsToData`). Outside SPMD mode no tensor is
# deferred and nothing here runs: `HostState` exists only as a class nobody instantiates.
# `ir_data` (every state's, for the debug text only) is the device-data leaf that a tensor has as
# its IR value in torch_xla's sense: one uploaded on use or by `mark_sharding`, as opposed to an
# execution's result.
_VALUE = LazyState.value  # the slot itself (a HostState's `value` is a property over it)


class HostState(LazyState):
    """A lazy storage whose data is still on the host (Note [SPMD virtual device])."""

    __slots__ = ()

    is_pending = False

    @property
    def value(self) -> Value:  # type: ignore[override]
        from .transfer import resolve_host

        return resolve_host(self, None)

    @value.setter
    def value(self, v: Value) -> None:
        self.__class__ = LazyState
        _VALUE.__set__(self, v)

    @property
    def host(self) -> torch.Tensor:
        """The private host copy of the data."""
        return _VALUE.__get__(self)


def defer_upload(s: LazyState, host: torch.Tensor) -> None:
    """Make `s` (a fresh base) hold `host`, a private CPU copy, until it is needed."""
    s.__class__ = HostState
    _VALUE.__set__(s, host)


# The live registry: creation number -> weak reference, in creation order (a dict keeps its
# insertion order, and numbers only grow). A weakref without a callback is cheaper to make than a
# WeakSet entry, and a state has no finalizer: dead entries are dropped (and counted as
# DestroyXlaTensor) when the registry is read, when metrics are read, or when it doubles in size.
_live: dict[int, weakref.ref[LazyState]] = {}
_seq = itertools.count()
_prune_at = [4096]


def live_states() -> list[LazyState]:
    """Every live lazy storage, in creation order (a set's order would change the graph key)."""
    return _prune()


def _prune() -> list[LazyState]:
    out, dead = [], []
    for k, r in _live.items():
        s = r()
        if s is None:
            dead.append(k)
        else:
            out.append(s)
    for k in dead:
        del _live[k]
    if dead:
        metrics.counter_inc("DestroyXlaTensor", len(dead))
    _prune_at[0] = max(4096, 2 * len(_live))
    return out


metrics.flush_hooks.append(_prune)


def next_seq() -> int:
    """A creation number below every later state's (a gap in the numbering changes no order)."""
    return next(_seq)


def retire_since(first: int, error: BaseException) -> None:
    """Mark every live pending state created since `first` failed with `error`, so that no sync
    runs it: the intermediates of an abandoned trace-once trace, over placeholders that have no
    data (a reference cycle through the abandoning exception's traceback can keep them alive)."""
    for s in live_states():
        if s.seq >= first and s.failed is None and s.is_pending:
            s.failed = error


def _by_seq(s: LazyState) -> int:
    return s.seq


# --- device registration --------------------------------------------------------------------------


class _BackendModule:
    """`torch.jax`: the module PyTorch consults for a PrivateUse1 backend."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        from . import runtime

        return len(runtime.jax_devices())

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        from . import random_state

        random_state.manual_seed(seed)

    manual_seed = manual_seed_all

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        """The device RNG (seed, counter) as a byte tensor, like every backend's RNG state."""
        from . import random_state

        return torch.tensor(random_state.get_state(), dtype=torch.int64).view(torch.uint8)

    @staticmethod
    def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
        from . import random_state

        seed, counter = new_state.view(torch.int64).tolist()
        random_state.set_state(seed, counter)

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    # The stream API libraries use to overlap copies (torch.distributed.checkpoint's writer):
    # lazyxla has one in-order stream per device; synchronizing waits for every computation.
    @staticmethod
    def current_stream(device: Any = None) -> _Stream:
        return _STREAM

    @staticmethod
    def stream(stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    @staticmethod
    def synchronize(device: Any = None) -> None:
        _STREAM.synchronize()


class _Stream:
    """The device's single stream (see `_BackendModule.current_stream`)."""

    device_type = DEVICE_TYPE

    def synchronize(self) -> None:
        from . import xla_model

        xla_model.wait_device_ops()

    def wait_stream(self, other: Any) -> None:
        pass  # one in-order stream: nothing to wait for


_STREAM = _Stream()


# Note [Backward on the calling thread]
# PyTorch's autograd engine runs the backward of an accelerator's tensors on a thread of its own
# per device, so that C++ kernels can overlap with the caller. lazyxla's kernels are Python: such
# a thread only passes the GIL back and forth with the caller. Measured (bench/trace_once.py's
# step functions, the two settings alternated in one process): trace-once training steps GPT-2
# 9.12 -> 8.52 ms, MLP 3.63 -> 3.38 ms, the decoder 14.35 -> 14.07 ms; lazy steps 1-2 % faster.
# So at import lazyxla turns autograd multithreading off for the process
# (`torch.autograd.set_multithreading_enabled(False)`, which only changes where accelerators'
# backward runs; CPU backward always runs on the caller). LAZYXLA_AUTOGRAD_THREADS=1 keeps
# PyTorch's default.


class _DeviceGuard(torch._C._acc.DeviceGuard):
    """The device guard of a Python backend. The autograd engine asks it for its device type
    (C++ calling `type_` through pybind) once per backward node it runs: about 850 calls in a
    2-layer demo decoder step. A builtin callable answers without a Python frame (a builtin is
    not a descriptor: it is called without `self`): 3 % of that step's recording time."""

    type_ = itertools.repeat(torch._C._autograd.DeviceType.PrivateUse1).__next__


def _register_device() -> None:
    if torch._C._get_privateuse1_backend_name() == DEVICE_TYPE:
        return
    _setup_privateuseone_for_python_backend(
        DEVICE_TYPE, backend_module=_BackendModule(), device_guard=_DeviceGuard()
    )
    torch._C._set_view_replay_enabled(True)  # See Note [Views and mutation]
    if not FLAGS.autograd_threads:
        torch.autograd.set_multithreading_enabled(False)  # Note [Backward on the calling thread]
    _patch_tensor_str()
    _patch_storage_checks()
    _patch_module_to()


def _patch_tensor_str() -> None:
    """Print lazy tensors from a host copy, as PyTorch does for its own 'xla' and 'lazy' devices."""
    import torch._tensor_str as ts

    original = ts._tensor_str

    def _tensor_str(self: torch.Tensor, indent: int) -> str:
        if self.device.type == DEVICE_TYPE:
            self = self.to("cpu")
        return original(self, indent)

    ts._tensor_str = _tensor_str


def _patch_storage_checks() -> None:
    """Lazy tensors' 0-byte storages hold no data, so PyTorch must not copy them byte-wise.

    PyTorch already treats storage-less PrivateUse1 tensors this way in `deepcopy` (clone) and in
    pickling; we answer `_has_storage` = False for our device so those paths apply, and we pickle a
    lazy tensor as its CPU value, so `torch.save(model.state_dict())` loads on CPU anywhere (as
    `xm.save` does for torch_xla).
    """
    has_storage = torch._C._has_storage

    def _has_storage(t: torch.Tensor) -> bool:
        return t.device.type != DEVICE_TYPE and has_storage(t)

    torch._C._has_storage = _has_storage
    reduce_internal = torch.Tensor._reduce_ex_internal

    def _reduce_ex_internal(self: torch.Tensor, proto: int) -> Any:
        if self.device.type == DEVICE_TYPE:
            return reduce_internal(self.cpu().requires_grad_(self.requires_grad), proto)
        return reduce_internal(self, proto)

    torch.Tensor._reduce_ex_internal = _reduce_ex_internal
    _patch_loading()


def _patch_loading() -> None:
    """`torch.load(f, map_location=<lazyxla device>)` (or a mapping to one): each saved storage is
    read on the CPU and each tensor built from it is copied to the device, as `.to(device)`
    copies it. PyTorch's own path would allocate a device storage and copy bytes into it: a
    lazyxla storage has no bytes (PyTorch has no allocator for it), and that crashed the
    process. Tensors that shared a storage in the file are separate copies after the load, as
    those of `torch.save` of lazy tensors already are (they pickle as their CPU values)."""
    from torch import _utils, serialization

    def deserialize(storage: Any, location: str) -> Any:
        if location != DEVICE_TYPE and not location.startswith(DEVICE_TYPE + ":"):
            return None
        storage._lx_load_to = torch.device(location)
        return storage

    serialization.register_package(15, lambda obj: None, deserialize)
    rebuild = _utils._rebuild_tensor

    def _rebuild_tensor(storage: Any, storage_offset: int, size: Any, stride: Any) -> Any:
        t = rebuild(storage, storage_offset, size, stride)
        target = getattr(storage._untyped_storage, "_lx_load_to", None)
        return t if target is None else t.to(target)

    _utils._rebuild_tensor = _rebuild_tensor

    storage_new = torch.UntypedStorage.__new__

    def new_storage(cls: Any, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        if device is not None and torch.device(device).type == DEVICE_TYPE:
            raise RuntimeError(
                f"torch.UntypedStorage(..., device={str(device)!r}): lazyxla tensors' storages "
                "hold no bytes (their values live on the XLA device), so a storage cannot be "
                "made or filled byte-wise there; make a tensor (torch.empty(n, device=...)) or "
                "copy a CPU tensor to the device with .to(device)"
            )
        if device is not None:
            kwargs["device"] = device
        return storage_new(cls, *args, **kwargs)

    torch.UntypedStorage.__new__ = new_storage  # type: ignore[method-assign]


_unswapped_warned: list[bool] = []


def _warn_unswapped(why: str) -> None:
    if not _unswapped_warned:
        _unswapped_warned.append(True)
        warnings.warn(
            f"lazyxla: {why} in place (another tensor references it); the module's remaining "
            "parameters move as new Parameter objects instead, as torch_xla moves them: build "
            "the optimizer, and tie shared weights, after the move",
            stacklevel=4,
        )


def _patch_module_to() -> None:
    """Moving a module to or from a lazyxla device keeps each Parameter object (as a move to CUDA
    does), so tied weights stay tied and an optimizer built before the move keeps working.

    A CPU tensor and a PrivateUse1 tensor have no compatible shallow-copy type, so `Module._apply`
    would make a new Parameter per module (PyTorch/XLA's behaviour: GPT-2's tied embedding
    silently unties). For moves to lazyxla (`module.to(device)`) and for any conversion of a
    module holding lazyxla parameters (`.cpu()`, `.to(dtype)`), the parameters are swapped in
    place instead (`torch.__future__`'s swap-on-conversion); other modules are unaffected.
    """
    original_to, original_apply = torch.nn.Module.to, torch.nn.Module._apply
    future = torch.__future__

    def swapping(call: Any) -> Any:
        prev = future.get_swap_module_params_on_conversion()
        future.set_swap_module_params_on_conversion(True)
        try:
            return call()
        except RuntimeError as e:
            # PyTorch swaps only a tensor nothing else references: the old `weight_norm`'s
            # `weight` is computed at registration, and its autograd graph holds `weight_g`.
            if "Couldn't swap" not in str(e):
                raise
            _warn_unswapped(str(e))
            future.set_swap_module_params_on_conversion(prev)
            return call()  # (the parameters already swapped convert to themselves)
        finally:
            future.set_swap_module_params_on_conversion(prev)

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is not None and device.type == DEVICE_TYPE:
            return swapping(lambda: original_to(self, *args, **kwargs))
        return original_to(self, *args, **kwargs)

    def _apply(self: torch.nn.Module, fn: Any, recurse: bool = True) -> Any:
        if any(p.device.type == DEVICE_TYPE for p in self.parameters(recurse=recurse)):
            return swapping(lambda: original_apply(self, fn, recurse))
        return original_apply(self, fn, recurse)

    to.__doc__ = original_to.__doc__
    torch.nn.Module.to = to
    torch.nn.Module._apply = _apply


_register_device()

_create_empty = torch._C._acc.create_empty_tensor
_storage_at = torch._C._construct_storage_from_data_pointer
_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
# as_strided_'s meta kernel sets sizes/strides/offset (bounds-checked against the storage's size)
# without touching data: how a lazy tensor gets eager's layout.
_set_layout = torch.ops.aten.as_strided_.default._handle.redispatch_boxed
_DEVICE = torch.device(DEVICE_TYPE, 0)
_next_address = [1 << 44]  # see Note [Fake data pointers]
_counters = metrics._counters
_CREATE = "CreateXlaTensor"


def _reserve(nbytes: int) -> int:
    """A fresh address range of `nbytes` (64-byte aligned, never reused, never dereferenced)."""
    p = _next_address[0]
    _next_address[0] = p + (nbytes + 127) // 64 * 64
    return p


def storage_nbytes(shape: tuple[int, ...], stride: tuple[int, ...] | None, itemsize: int) -> int:
    """Bytes a layout spans: numel for a contiguous one, 1 + the farthest offset otherwise."""
    if stride is None:
        return math.prod(shape) * itemsize
    if 0 in shape:
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(shape, stride))) * itemsize


def new_tensor(
    value: Value,
    spec: TensorSpec,
    stride: tuple[int, ...] | None = None,
    nbytes: int | None = None,
) -> torch.Tensor:
    """A fresh lazy tensor whose value is `value` (a base, not a view).

    `stride`: eager's strides for this tensor when they are not the contiguous ones (an
    elementwise op on a transposed input keeps its layout, as on the CPU); `nbytes`: its
    storage size if known (`storage_nbytes`)."""
    t = _create_empty(spec.shape, spec.dtype)
    st = t.untyped_storage()
    if nbytes is None:
        nbytes = storage_nbytes(spec.shape, stride, spec.dtype.itemsize)
    p = _next_address[0]  # _reserve, inlined: see Note [Fake data pointers]
    _next_address[0] = p + (nbytes + 127) // 64 * 64
    st._swap_data_ptr_(_storage_at(p, _DEVICE, nbytes))
    if stride is not None or 0 in spec.shape:  # (create_empty_tensor's strides differ for empty)
        _set_layout(_META, t, spec.shape, stride or contiguous_strides(spec.shape), 0)
    st._lx = LazyState(value, spec, stride)
    _counters[_CREATE] = _counters.get(_CREATE, 0) + 1  # metrics.counter_inc, inlined
    return t


def new_tensor_code(value: str, stride: tuple[int, ...] | None, spec: TensorSpec) -> list[str]:
    """Statements creating `new_tensor(<value>, SPEC, STRIDE, NBYTES)` as `t`, for generated code
    (Note [Generated recording code] in recording.py). The constants are globals
    (`new_tensor_globals`: `SPEC` with its `SHAPE` and `DTYPE`, `STRIDE`, `NBYTES`, `SPAN`,
    `LAYOUT`); `stride` and `spec` decide only whether the layout is set. They use the globals
    in `NEW_TENSOR_CODE_GLOBALS` too."""
    lines = [
        "t = _create_empty(SHAPE, DTYPE)",
        "st = t.untyped_storage()",
        "p = _next_address[0]",
        "_next_address[0] = p + SPAN",
        "st._swap_data_ptr_(_storage_at(p, _DEVICE, NBYTES))",
    ]
    if stride is not None or 0 in spec.shape:
        lines.append("_set_layout(_META, t, SHAPE, LAYOUT, 0)")
    return lines + [
        f"st._lx = _LazyState({value}, SPEC, STRIDE)",
        "_counters[_CREATE] = _counters.get(_CREATE, 0) + 1",
    ]


def new_tensor_globals(
    spec: TensorSpec, stride: tuple[int, ...] | None, nbytes: int
) -> dict[str, Any]:
    """The constants `new_tensor_code`'s statements read for one output."""
    return {
        "SPEC": spec,
        "SHAPE": spec.shape,
        "DTYPE": spec.dtype,
        "STRIDE": stride,
        "NBYTES": nbytes,
        "SPAN": (nbytes + 127) // 64 * 64,
        "LAYOUT": stride or contiguous_strides(spec.shape),
    }


NEW_TENSOR_CODE_GLOBALS = {
    "_create_empty": _create_empty,
    "_next_address": _next_address,
    "_storage_at": _storage_at,
    "_DEVICE": _DEVICE,
    "_set_layout": _set_layout,
    "_META": _META,
    "_LazyState": LazyState,
    "_counters": _counters,
    "_CREATE": _CREATE,
}


def new_view(
    parent: torch.Tensor,
    op: ViewOp,
    spec: TensorSpec,
    stride: tuple[int, ...] | None = None,
    offset: int = 0,
    root: LazyState | None = None,
    overlap: bool | None = None,
    ps: LazyState | None = None,
    layout: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """A lazy tensor viewing `parent` through `op`; writes to it reach the parent's base.

    `stride`/`offset`: eager's layout for the view (None/0: contiguous at the storage start);
    `root`: `op` reads the root base itself (as_strided), not `parent`; `overlap`: whether the
    layout's elements share locations, if known (`overlaps`); `ps`: the parent's state, if known;
    `layout`: the view's strides spelled out (`stride`, or the contiguous ones), if known."""
    if ps is None:
        ps = state(parent)
    base = ps.base or ps
    value = op.apply(read(root or ps))
    t = _create_empty(spec.shape, spec.dtype)
    pst = parent.untyped_storage()
    st = t.untyped_storage()
    st._swap_data_ptr_(_storage_at(pst.data_ptr(), _DEVICE, pst.nbytes()))
    if stride is not None or offset or 0 in spec.shape:
        _set_layout(
            _META, t, spec.shape, layout or stride or contiguous_strides(spec.shape), offset
        )
    s = LazyState(value, spec, None)
    if overlap is None:
        overlap = stride is not None and overlaps(spec.shape, stride)
    s.overlaps = overlap
    s.base = base
    if root is not None:
        s.chain = (op,)
    else:
        s.chain = (*ps.chain, op) if ps.base is not None else (op,)
    s.seen = base.version
    st._lx = s
    _counters[_CREATE] = _counters.get(_CREATE, 0) + 1
    return t


def overlaps(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether two elements of this layout can share a location (a broadcast, windows)."""
    if 0 in shape:
        return False
    reach = 0  # the farthest offset the smaller-stride dimensions reach
    for st, n in sorted((st, n) for n, st in zip(shape, stride) if n > 1):
        if st <= reach:
            return True
        reach += (n - 1) * st
    return False


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def check_device(device: torch.device | None) -> None:
    """Refuse a lazyxla device other than jax:0 instead of silently using jax:0.

    lazyxla drives one device per process (as torch_xla's runtime does: `xla:0`); several devices
    are used through SPMD sharding over a mesh, or one process per device."""
    if device is None or device.type != DEVICE_TYPE or device.index in (None, 0):
        return
    raise RuntimeError(
        f"lazyxla places tensors on one device per process, '{DEVICE_TYPE}:0' "
        f"(lazyxla.device()), but '{device}' was requested. To use several devices, shard over a "
        "mesh (lazyxla.distributed.spmd.mark_sharding) or run one process per device."
    )


def state(t: torch.Tensor) -> LazyState:
    try:
        return t.untyped_storage()._lx
    except AttributeError:
        if t.device.type == "cpu":  # (an op writing a CPU tensor from lazyxla operands)
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found a CPU tensor of shape "
                f"{tuple(t.shape)} where a {DEVICE_TYPE}:0 one was expected (an in-place or out= "
                f"write to a CPU tensor from lazyxla tensors?): move it with "
                f".to(lazyxla.device()) first"
            ) from None
        raise RuntimeError(
            f"tensor of shape {tuple(t.shape)} on {t.device} has no lazyxla state; it was not "
            "created by lazyxla (e.g. an uninitialized storage from another backend)"
        ) from None


def is_lazy(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE_TYPE


def read(s: LazyState) -> Value:
    """The current IR value of a storage, replaying a stale view's chain."""
    base = s.base
    if base is None or s.seen == base.version:
        return s.value
    v = base.value
    for op in s.chain:
        v = op.apply(v)
    s.value = v
    s.seen = base.version
    return v


# Note [A state's first value is data]
# An optimizer creates its state on its first step (`exp_avg = torch.zeros_like(p)`) and updates it
# in place (`exp_avg.lerp_(grad, ...)`): step 1's graph computed the update from a zeros constant,
# every later step's from device data, so a training run compiled two graphs (torch_xla's too). A
# tensor written in place while its value is a fill of zeros or ones (zeros, zeros_like, ones,
# ones_like) keeps that fill's node (`LazyState.fill`, until a sync binds it data); a sync of that
# tensor reads the fill as a data input holding the same values (graph.Capture), so step 1's graph
# is step 2's: one compile. A fill that is only read (`x + torch.zeros(...)`), and one whose
# tensor is gone by the sync (a mask filled in place and used within the step), stays a constant,
# which XLA can fold and which costs no upload.
# The fills a state can start from, and the value each holds.
STATE_FILL_OPS = {"aten::zeros": 0, "aten::zeros_like": 0, "aten::ones": 1, "aten::ones_like": 1}


def write(s: LazyState, value: Value) -> None:
    """Give a storage a new value; through a view, the base gets the scattered value."""
    base = s.base
    if base is None:
        if s.value[0].op in STATE_FILL_OPS:  # Note [A state's first value is data]
            s.fill = s.value[0]
        s.value = value
        s.version += 1
        return
    if base.value[0].op in STATE_FILL_OPS:
        base.fill = base.value[0]
    parents = [base.value]
    for op in s.chain[:-1]:
        parents.append(op.apply(parents[-1]))
    new = value
    for op, parent in zip(reversed(s.chain), reversed(parents)):
        if op.scatter is None:
            raise RuntimeError(
                f"in-place write through a '{op.name}' view is not supported: more than one "
                "element of the written-to tensor refers to a single memory location; "
                "clone() it first"
            )
        new = op.scatter(parent, new)
    base.value = new
    base.version += 1
    if s.overlaps:  # aliased elements: its value is what the base now holds, read on demand
        return
    s.value = value
    s.seen = base.version


def bind_data(s: LazyState, data_node: Node) -> None:
    """After execution: the storage's value is device data (a view keeps its version)."""
    s.value = (data_node, 0)
    s.fill = None
