"""`torch_xla._XLAC`: lazyxla's stand-in for torch_xla's C extension, the private functions that
torch_xla's Python modules (and programs written against them) call. `_make_xlac()` builds the
module the torch_xla alias serves (Note [The torch_xla alias] in compat.py)."""

from __future__ import annotations

import importlib
import types
from collections.abc import Sequence
from typing import Any

import torch

from . import api, debug, donation, graph, ir, metrics, runtime

VERSION = "2.9.0+lazyxla"  # torch_xla's `__version__`, as the alias reports it


def _sharding_module() -> Any:
    for name in ("lazyxla.debug", "lazyxla._src.sharding"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "sharding_spec"):
            return mod
    return None


def _get_xla_sharding_spec(tensor: torch.Tensor) -> str:
    mod = _sharding_module()
    return mod.sharding_spec(tensor) if mod is not None else ""


def _get_xla_sharding_type(tensor: torch.Tensor) -> int | None:
    try:
        from . import sharding
    except ImportError:
        return None
    t = sharding.sharding_type(tensor) if hasattr(sharding, "sharding_type") else None
    return None if t is None else int(t)


def _xla_increment_counter(name: str, value: int = 1) -> None:
    metrics.counter_inc(name, value)


def _set_allow_execution(allow: bool) -> None:
    graph.set_allow_execution(allow)


def _get_allow_execution() -> bool:
    return graph._allow_execution


def _get_graph_hash(tensors: Sequence[torch.Tensor]) -> bytes:
    return api.graph_hash(list(tensors))


def _init_computation_client() -> None:
    runtime.jax_devices()


_PRECISIONS = ("default", "high", "highest")


def _xla_set_mat_mul_precision(precision: str) -> None:
    if precision not in _PRECISIONS:
        raise ValueError(f"mat mul precision {precision!r} is not one of {_PRECISIONS}")
    import jax

    if jax.config.jax_default_matmul_precision != precision:
        jax.config.update("jax_default_matmul_precision", precision)
        graph.CACHE.clear()  # executables were compiled at the old precision


def _xla_get_mat_mul_precision() -> str:
    import jax

    return jax.config.jax_default_matmul_precision or "default"


def _xla_get_default_device() -> str:
    return str(api.device())


def _xla_sync_multi(
    tensors: Sequence[torch.Tensor], devices: Sequence[str] = (), wait: bool = True, **_: Any
) -> None:
    from .tensor import state

    graph.sync_states([state(t) for t in tensors], wait=wait)


def _xla_get_tensor_id(tensor: torch.Tensor) -> int:
    """A unique id of the lazy tensor's value holder (stable while the tensor lives)."""
    from .tensor import state

    return state(tensor).seq + 1


def _xla_device_str(index: int = 0) -> str:
    from .xla_model import xla_real_devices

    return xla_real_devices([api.device(index)])[0]


def _is_spmd() -> bool:
    from . import sharding

    return sharding.is_spmd()


def _get_xla_tensor_debug_info(tensor: torch.Tensor) -> str:
    """torch_xla's debug description of one tensor: id, device, shape, pending IR or data, and
    whether its data is still on the host (Note [SPMD virtual device])."""
    from . import ir
    from .tensor import HostState, is_lazy, read, state

    if not is_lazy(tensor):
        return "Not a XLATensor\n"
    s = state(tensor)
    spmd = _is_spmd()
    device = "SPMD:0" if spmd else _xla_device_str()  # torch_xla's virtual device in SPMD mode
    lines = [
        "XLATensor {",
        f"TensorID: {s.seq + 1}",
        f"AliasID: {(s.base or s).seq + 1}",
        f"Device: {device}",
        f"XLA Shape: {ir.shape_str(s.spec)}",
        f"ShardingSpec: {_get_xla_sharding_spec(tensor) or 'None'}",
    ]
    if type(s) is HostState:  # not uploaded yet: no IR, no device data
        size = ", ".join(map(str, s.spec.shape))
        lines += ["IR: None", "XLAData: None", f"Tensor on host: with size [{size}]", "}"]
        return "\n".join(lines) + "\n"
    node, k = read(s)
    spec = node.specs[k]
    # torch_xla's data shapes print without their layout.
    data_shape = ir.shape_str(spec).split("{")[0]
    if node.op == ir.DEVICE_DATA:
        # A tensor has the data leaf as its IR value once it was used or sharded (`ir_data`); an
        # execution's result holds data only.
        traced = getattr(s, "ir_data", None) is node
        lines.append(f"IR: {ir.node_shape_str(node)} {ir.DEVICE_DATA}" if traced else "IR: None")
    if node.op == ir.DEVICE_DATA and spmd:
        # torch_xla's sharded data: one virtual device, the OpSharding and shard count.
        arr = node.data
        shards = len(arr.sharding.device_set) if arr is not None else 0
        lines += [
            "XLAShardedData: ",
            "  Data Device: SPMD:0",
            f"  Data Shape: {data_shape}",
            f"  OpSharding: {_get_xla_sharding_spec(tensor) or '{replicated}'}",
            f"  NumShards: {shards}",
        ]
    elif node.op == ir.DEVICE_DATA:
        arr = node.data
        lines += [
            "XLAData: ",
            f"  Data Device: {_xla_device_str()}",
            f"  Data Shape: {data_shape}",
            "  Data Handle: None"
            if arr is None
            else "  Data Handle: Deleted"
            if arr.is_deleted()
            else f"  Data Handle: {id(arr):#x}",
        ]
    else:
        lines += [f"IR: {ir.node_shape_str(node)} {node.op}", "XLAData: None"]
    lines += ["Tensor on host: None", "}"]
    return "\n".join(lines) + "\n"


def _get_tensors_xla_device_data_node(
    tensors: Sequence[torch.Tensor],
) -> tuple[list[int], list[torch.Tensor]]:
    """The device-data inputs of the graph computing `tensors`: (tensor ids, tensors).

    An input that a live tensor holds is returned with that tensor's id; the tensors returned are
    new ones over the same device data."""
    from . import ir
    from .tensor import HostState, live_states, new_tensor, read, state

    roots = [read(state(t))[0] for t in tensors]
    owners = {
        id(s.value[0]): s
        for s in live_states()
        if type(s) is not HostState and s.value[0].op == ir.DEVICE_DATA  # (not on the host)
    }
    ids, out = [], []
    for n in ir.post_order(roots):
        if n.op != ir.DEVICE_DATA:
            continue
        t = new_tensor((n, 0), n.specs[0])
        owner = owners.get(id(n))
        ids.append((owner or state(t)).seq + 1)
        out.append(t)
    return ids, out


_DONATE = donation.DONATE


def _set_buffer_donation(tensor: torch.Tensor, should_donate: bool) -> bool:
    """Mark the tensor's device buffer as donatable to the next graph that reads it (XLA may
    write an output into it; the tensor must not be read afterwards). False if the tensor holds
    no device data (a pending value)."""
    from . import ir
    from .tensor import read, state

    node = read(state(tensor))[0]
    if node.op != ir.DEVICE_DATA or node.meta not in (None, _DONATE):
        return False
    if should_donate and runtime.is_shared_upload(node.data):
        return False  # a cached scalar upload other tensors share (Note [Device data cache])
    node.meta = _DONATE if should_donate else None
    if should_donate:
        donation.donation_marked[0] = True
    metrics.counter_inc("XlaSetBufferDonation")
    return True


def _get_buffer_donation(tensor: torch.Tensor) -> bool:
    from .tensor import read, state

    return read(state(tensor))[0].meta == _DONATE


def _xla_tensors_report(nodes_threshold: int = 0, device: str = "") -> str:
    """Every live pending tensor's IR (with Python frames when XLA_IR_DEBUG is on)."""
    from . import ir
    from .tensor import live_states

    pending = [s for s in live_states() if s.is_pending and s.base is None]
    if not pending:
        return ""
    return ir.to_text([s.value for s in pending])


def _xla_dot_general(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    dimension_numbers: Any,
    precision_config: Any = None,
    preferred_element_type: torch.dtype | None = None,
) -> torch.Tensor:
    """`lax.dot_general` on two tensors: dimension_numbers `((lhs_contract, rhs_contract),
    (lhs_batch, rhs_batch))`, negative dims counted from the end; the result's dims are batch,
    lhs free, rhs free (as in XLA). With `preferred_element_type` the products are accumulated in
    that dtype, as XLA's dot does: int8 operands give their exact int32 sum of products."""
    (lc, rc), batch = dimension_numbers
    lb, rb = batch if batch else ((), ())
    lc, lb = ([_dot_dim(d, lhs, "lhs") for d in x] for x in (lc, lb))
    rc, rb = ([_dot_dim(d, rhs, "rhs") for d in x] for x in (rc, rb))
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise ValueError(
            f"_xla_dot_general: {len(lc)} lhs and {len(rc)} rhs contracting dims, {len(lb)} lhs "
            f"and {len(rb)} rhs batch dims; each pair must have as many dims on both sides"
        )
    lfree = [d for d in range(lhs.dim()) if d not in lc and d not in lb]
    rfree = [d for d in range(rhs.dim()) if d not in rc and d not in rb]
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    ls, rs = [""] * lhs.dim(), [""] * rhs.dim()
    for a, b in zip(lb, rb):
        ls[a] = rs[b] = next(letters)
    for a, b in zip(lc, rc):
        ls[a] = rs[b] = next(letters)
    for d in lfree:
        ls[d] = next(letters)
    for d in rfree:
        rs[d] = next(letters)
    out = "".join(ls[d] for d in lb) + "".join(ls[d] for d in lfree) + "".join(rs[d] for d in rfree)
    operands = torch.promote_types(lhs.dtype, rhs.dtype)
    dtype = preferred_element_type or operands
    compute = torch.promote_types(operands, dtype)
    res = torch.einsum(f"{''.join(ls)},{''.join(rs)}->{out}", lhs.to(compute), rhs.to(compute))
    return res.to(dtype)


def _dot_dim(d: int, t: torch.Tensor, side: str) -> int:
    if not -t.dim() <= d < t.dim():
        raise IndexError(f"_xla_dot_general: {side} dim {d} out of range for a {t.dim()}-d tensor")
    return d % t.dim()


_dynamic_dims: dict[int, set[int]] = {}


def _xla_mark_dynamic(tensor: torch.Tensor, dim: int) -> None:
    """Accepted and recorded: lazyxla compiles static shapes (one executable per shape), which
    is what XLA's bounded dynamism gives on CPU; the mark is kept for export tools to read."""
    from .tensor import state

    if not -tensor.dim() <= dim < tensor.dim():
        raise IndexError(f"_xla_mark_dynamic: dim {dim} out of range for a {tensor.dim()}-d tensor")
    _dynamic_dims.setdefault(state(tensor).seq, set()).add(dim % tensor.dim())


def _xla_warm_up_cache(tensors: Sequence[torch.Tensor], devices: Sequence[str] = ()) -> None:
    """Compile (into the cache) the graph that computes `tensors`, without running it."""
    from .tensor import state

    states = graph.pending_states([state(t) for t in tensors])
    if states:
        graph.compile_capture(graph.Capture(states))


def _get_executed_fallback_ops() -> list[str]:
    return metrics.executed_fallback_ops()


def _check_tensor_need_materialization(tensors: Sequence[torch.Tensor]) -> list[bool]:
    """Per tensor: is its value a pending computation? (A CPU tensor's is not.)"""
    from .tensor import DEVICE_TYPE, read, state

    return [
        t.device.type == DEVICE_TYPE and read(state(t))[0].op != ir.DEVICE_DATA for t in tensors
    ]


# torch_xla's id of the seed in its dynamo bridge's seed bookkeeping (kSeedInfoId)
_SEED_INFO_ID = -127389


def _get_seed_info_id() -> int:
    return _SEED_INFO_ID


def _get_base_seed_as_tensor(device: str) -> torch.Tensor:
    """The device RNG's seed (`xm.set_rng_state`'s), as an int64 tensor on `device`."""
    from . import random_state

    return torch.tensor(random_state.get_state()[0], dtype=torch.int64).to(device)


def _clear_pending_irs(device: str) -> None:
    """Drop the pending computation of every live tensor that has one (torch_xla's dynamo bridge
    calls it after tracing on real tensors): each keeps its shape and dtype, and its value is
    undefined until written (lazyxla gives zeros). Nothing runs."""
    from .tensor import write

    for s in graph.pending_states(None):
        if s.base is None:
            spec = s.spec
            write(s, (ir.device_data(runtime.zeros(spec.shape, spec.dtype), spec), 0))


def _xla_tensors_from_aten(
    tensors: Sequence[torch.Tensor], devices: Sequence[str], shardings: Any = None
) -> list[torch.Tensor]:
    """CPU tensors -> lazy tensors (one upload each; `requires_grad` kept)."""
    from .xla_model import send_cpu_data_to_device

    if len(devices) != len(tensors):
        raise ValueError(
            f"_xla_tensors_from_aten: {len(tensors)} tensors but {len(devices)} devices"
        )
    if shardings is not None and any(s is not None for s in shardings):
        raise NotImplementedError(
            "_xla_tensors_from_aten(shardings=...): use xs.mark_sharding on the result, or "
            "xm.send_cpu_data_to_device(input_sharding=...)"
        )
    return [send_cpu_data_to_device(t, d)[0] for t, d in zip(tensors, devices)]


def _get_xla_tensor_dimension_size(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """The size of `dim` as an int32 lazy tensor (XLA's GetDimensionSize). lazyxla's shapes are
    static, so this is the exact size, data-dependent ops (nonzero, masked_select) included."""
    return torch.tensor(tensor.size(dim), dtype=torch.int32, device=tensor.device)


def _get_xla_tensor_shape_type(tensor: torch.Tensor) -> str:
    """The XLA element type of the tensor's shape (`f32`, `bf16`, `s64`, `pred`, ...)."""
    from .ir import _SHORT_DTYPE

    return _SHORT_DTYPE.get(tensor.dtype, str(tensor.dtype).replace("torch.", ""))


def _unsafe_buffer_pointer(tensor: torch.Tensor) -> int:
    """The address of the tensor's device buffer (computed first if pending)."""
    from . import transfer

    arr = transfer.materialize(tensor)
    return int(arr.addressable_shards[0].data.unsafe_buffer_pointer())


def _replace_xla_tensor(tensor: torch.Tensor, source: torch.Tensor) -> None:
    """Make `tensor` (the same Python object, a Parameter stays one) hold `source`'s value and
    shape: both then share one lazy value, as torch_xla's tensors then share one XLATensor.
    torch_xla's FSDP frees a full parameter this way (replacing it with a 1-element tensor)."""
    from .tensor import is_lazy

    if not (is_lazy(tensor) and is_lazy(source)):
        raise TypeError(
            f"_replace_xla_tensor takes two lazyxla tensors, got {tensor.device} and "
            f"{source.device}"
        )
    if tensor.dtype != source.dtype:
        raise TypeError(
            f"_replace_xla_tensor: dtypes differ ({tensor.dtype} vs {source.dtype}); cast first"
        )
    with torch.no_grad():
        tensor.data = source


def _get_git_revs() -> dict[str, str]:
    """The source revisions: `xla` (lazyxla's git commit, else its version) and `torch`."""
    import os
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return {"xla": rev or VERSION, "torch": getattr(torch.version, "git_version", "")}


def _xla_runtime_is_initialized() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def _set_use_eager_mode(enable: bool) -> None:
    from . import eager

    eager.eager_mode(enable)


def _get_use_eager_mode() -> bool:
    from . import eager

    return eager.is_eager_mode()


def _get_ir_debug() -> bool:
    from .config import FLAGS

    return bool(FLAGS.ir_debug)


def _set_ir_debug(enable: bool) -> None:
    """XLA_IR_DEBUG at run time: record the Python source line of each op from now on."""
    from .config import FLAGS

    FLAGS.set("ir_debug", bool(enable))


# The distributed checkpoint's entries (lazyxla/_src/dcp_manager.py), imported on first call:
# torch.distributed.checkpoint is slow to import.
_CHECKPOINT_ENTRIES = (
    "_ensure_xla_coordinator_initialized",
    "_activate_preemption_sync_manager",
    "_deactivate_preemption_sync_manager",
    "_sync_point_reached",
    "_get_local_shard_replica_and_indices",
)


def _checkpoint_entry(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        from . import dcp_manager

        return getattr(dcp_manager, dcp_manager.XLAC_ENTRIES[name])(*args, **kwargs)

    call.__name__ = name
    return call


def _make_xlac() -> types.ModuleType:
    m = types.ModuleType("torch_xla._XLAC", "lazyxla's stand-in for torch_xla's C extension.")
    m._get_xla_tensors_text = debug.ir_text
    m._get_xla_tensors_hlo = debug.hlo_text
    m._xla_metrics_report = metrics.metrics_report
    for f in (  # (each under its own name)
        _get_xla_sharding_spec,
        _get_xla_sharding_type,
        _xla_increment_counter,
        _set_allow_execution,
        _get_allow_execution,
        _get_graph_hash,
        _init_computation_client,
        _xla_set_mat_mul_precision,
        _xla_get_mat_mul_precision,
        _xla_get_default_device,
        _xla_sync_multi,
        _xla_get_tensor_id,
        _get_xla_tensor_debug_info,
        _get_tensors_xla_device_data_node,
        _set_buffer_donation,
        _get_buffer_donation,
        _xla_tensors_report,
        _xla_dot_general,
        _xla_mark_dynamic,
        _xla_warm_up_cache,
        _get_executed_fallback_ops,
        _check_tensor_need_materialization,
        _get_seed_info_id,
        _get_base_seed_as_tensor,
        _clear_pending_irs,
        _xla_runtime_is_initialized,
        _xla_tensors_from_aten,
        _get_xla_tensor_dimension_size,
        _get_xla_tensor_shape_type,
        _unsafe_buffer_pointer,
        _get_git_revs,
        _replace_xla_tensor,
        _set_use_eager_mode,
        _get_use_eager_mode,
        _get_ir_debug,
        _set_ir_debug,
    ):
        setattr(m, f.__name__, f)
    from . import op_builder, sharding

    m._xla_custom_call = op_builder.custom_call
    m._is_placecholder = op_builder.is_placeholder  # (torch_xla's spelling)
    m._get_tensors_handle = op_builder.tensors_handle
    from . import dynamo

    m._xla_get_enable_alias_with_buffer_donor_config = dynamo.get_alias_with_buffer_donor
    m._xla_set_enable_alias_with_buffer_donor_config = dynamo.set_alias_with_buffer_donor
    m._xla_tpu_custom_call = op_builder.tpu_custom_call
    m._xla_user_computation = op_builder.user_computation
    m._xla_computation_text = op_builder.get_computation_hlo
    m._global_tensor_from_cpu_shards = sharding.global_tensor_from_cpu_shards
    from . import manual

    m.OpSharding = manual.OpSharding
    m._spmd_full_to_shard_shape = manual.full_to_shard_shape
    m._spmd_shard_to_full_shape = manual.shard_to_full_shape
    m._mark_manual_sharding = manual.xlac_mark_manual_sharding
    for name in _CHECKPOINT_ENTRIES:
        setattr(m, name, _checkpoint_entry(name))
    m._xla_get_all_devices = lambda: [_xla_device_str(i) for i in range(api.device_count())]
    m._xla_real_devices = lambda devices: [
        _xla_device_str(torch.device(d).index or 0) for d in devices
    ]
    return m
