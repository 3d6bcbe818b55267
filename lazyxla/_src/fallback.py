"""The CPU fallback: an op without a lowering runs through eager PyTorch on CPU.

Inputs are synced and copied to the host, the op runs there, results are copied back, and arguments
the
op mutates get their new values written back (so in-place and `out=` ops keep their semantics). Each
op
bumps counter `aten::<op>` and warns once. With `LAZYXLA_CPU_FALLBACK=0` it raises instead, naming
the op
and the user's source line.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch._ops import OpOverload

from . import metrics
from .config import FLAGS
from .ir import _user_frame
from .tensor import DEVICE_TYPE, state, write
from .transfer import download, upload
from .writes import non_overlapping_and_dense

_warned: set[str] = set()
_lib = torch.library.Library("_", "IMPL")


class NoLoweringError(NotImplementedError):
    pass


def _to_cpu(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.device.type == DEVICE_TYPE:
        out = download(v)
        return out.requires_grad_(False)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu(x) for x in v)
    if isinstance(v, torch.device) and v.type == DEVICE_TYPE:
        return torch.device("cpu")
    return v


def _to_device(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        if v.layout != torch.strided:
            # Lazy tensors are dense (as torch_xla's): a sparse result (embedding_bag's backward
            # with sparse=True) comes back as its dense equivalent, as torch_xla's dense fallback.
            v = v.to_dense()
        # Eager's layout comes with the values: nonzero's and argwhere's column-major results,
        # a channels_last output (a dense permutation; anything else comes back contiguous).
        keep = not v.is_contiguous() and non_overlapping_and_dense(v)
        return upload(v, stride=tuple(v.stride()) if keep else None)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_device(x) for x in v)
    return v


class FallbackWhileTracing(Exception):
    """An op without a lowering inside a graph being traced once (see dynamo.py), or an op that
    reads a traced value (`linspace` of tensor bounds reads them): the graph is partitioned
    around it instead of running it on placeholder values."""

    def __init__(self, op: Any) -> None:
        super().__init__(str(op))
        self.op = op
        # The FX node's target being traced: `op` may run inside it (masked_scatter_backward
        # decomposes into masked_select), and the partition must leave out the node itself.
        self.node = tracing_target


tracing_graph = False  # set by the trace-once backend while it traces an FX graph
tracing_target: Any = None  # the FX node it is running (what a value read partitions out)


def cpu_fallback(op: OpOverload, *args: Any, **kwargs: Any) -> Any:
    name = op._schema.name.split("::", 1)[-1]
    if tracing_graph:
        raise FallbackWhileTracing(op)
    if not FLAGS.cpu_fallback:
        src = _user_frame()
        raise NoLoweringError(
            f"aten::{name} ({op._overloadname}) has no lazyxla lowering (called at {src}); add "
            f"@lowering(aten.{name}.{op._overloadname}) in lazyxla/_src/ops/<family>.py, or set "
            "LAZYXLA_CPU_FALLBACK=1 to run it on the CPU"
        )
    # torch_xla's counter name: the overload is part of it unless it is the default one
    counted = (
        f"aten::{name}" if op._overloadname == "default" else f"aten::{name}.{op._overloadname}"
    )
    metrics.counter_inc(counted)
    if counted not in _warned:
        _warned.add(counted)
        warnings.warn(
            f"lazyxla: {counted} has no lowering and runs on the CPU (inputs are synced and "
            f"copied); counted as '{counted}' in lazyxla.debug.metrics",
            stacklevel=2,
        )
    if "device" in kwargs:
        kwargs = dict(kwargs)
    cpu_args = _to_cpu(args)
    cpu_kwargs = {k: _to_cpu(v) for k, v in kwargs.items()}
    schema_args = op._schema.arguments
    for i, a in enumerate(schema_args):
        if a.is_out:  # eager may resize it: a resizable copy (a download's storage is not)
            if i < len(cpu_args):
                cpu_args = (*cpu_args[:i], _resizable(cpu_args[i]), *cpu_args[i + 1 :])
            elif a.name in cpu_kwargs:
                cpu_kwargs[a.name] = _resizable(cpu_kwargs[a.name])
    out = op(*cpu_args, **cpu_kwargs)
    # Write back every argument the op mutates.
    returned_alias: dict[int, torch.Tensor] = {}
    for i, a in enumerate(schema_args):
        if not (a.alias_info and a.alias_info.is_write):
            continue
        orig = args[i] if i < len(args) else kwargs.get(a.name)
        new = cpu_args[i] if i < len(args) else cpu_kwargs.get(a.name)
        if orig is None:
            continue
        origs = orig if isinstance(orig, (list, tuple)) else [orig]
        news = new if isinstance(new, (list, tuple)) else [new]
        for o, n in zip(origs, news):
            _assign(o, n)
            returned_alias[id(n)] = o
    return _wrap(out, returned_alias)


def _resizable(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, (list, tuple)):
        return type(v)(_resizable(x) for x in v)
    return v


def _assign(target: torch.Tensor, cpu_value: torch.Tensor) -> None:
    new = upload(cpu_value)
    if tuple(target.shape) != tuple(cpu_value.shape):
        target.data = new  # an out= argument resized by the op
        return
    write(state(target), state(new).value)


def _wrap(out: Any, aliases: dict[int, torch.Tensor]) -> Any:
    if isinstance(out, torch.Tensor):
        alias = aliases.get(id(out))
        return alias if alias is not None else _to_device(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap(o, aliases) for o in out)
    return out


def install() -> None:
    _lib.fallback(cpu_fallback, "PrivateUse1")
