"""Value reads answered on the host, without compiling a graph.

# Note [Small integer reads on the host]
A program reads small integer and boolean values to decide what to do next: transformers'
`generate()` checks its special tokens (`isin(eos, pad).any()`, `(eos < 0).any()`), the
attention mask (`(mask == 1).all()`), its input ids, and returns the generated sequence (a `cat`
of the tokens, data already). Compiling an XLA program for each such read costs tens of
milliseconds and a cache entry, for a few integer operations. So a value read that has to
execute is answered on the host, with eager CPU PyTorch (lazyxla's oracle), in two cases:
- *Integer bookkeeping*: everything the read would run (Note [What a value read syncs]: every
  live pending tensor) is at most `_MAX_NODES` nodes, each an integer or boolean value of at
  most `_MAX_ELEMENTS` elements. Integer and boolean ops are exact, so the host gives the values
  the device would.
- *Data movement over data*: the tensor read is a `cat`/slice/view/... of device data (the
  generated sequence), any dtype: moving values is exact. Other pending tensors stay pending, as
  when a tensor that is data is read.
- *Integer bookkeeping beside a small pending graph*: the tensor read is itself integer
  bookkeeping, but other pending tensors are not (transformers' SDPA mask builders read
  `padding_mask.sum() == numel` right after the embedding lookup of a training step). The read is
  answered alone, and the rest stays pending, as under torch_xla's policy: no mid-step execution,
  one graph per step. Only while the pending graph is at most `_MAX_LEFT_PENDING` nodes: a loop
  that reads such a value each iteration while it grows other tensors is still cut, at a bounded
  size, so its graph stops growing and repeats (Note [What a value read syncs]).
The leaves are downloaded, each node runs its aten overload (`Node.aten`: the kernel's own op,
whose recorded arguments are in schema order) on the host values, and every value evaluated is
uploaded and bound as device data, as a sync would bind it, so later graphs take it as an input
(the graph of a loop is cut as a read cuts it) and every later read agrees. A node without an
aten overload (a cast or scatter lazyxla emits), a result whose shape or dtype differs from the
recorded one, or any error on the host sends the read down the compiling path unchanged.
Programs with several processes, SPMD or open manual-sharding regions always compile.
`LAZYXLA_HOST_READS=0` turns it off. Counted as `HostRead`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import collectives, metrics
from .config import FLAGS
from .ir import CONSTANT, DEVICE_DATA, SCALAR, Node, Ref, post_order
from .tensor import DEVICE_TYPE, LazyState, bind_data

_MAX_NODES = 64
_MAX_LEFT_PENDING = 256
_MAX_ELEMENTS = 4096
_MAX_MOVED = 1 << 20  # elements a data-movement read may assemble on the host
_EXACT = frozenset((torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64))
_CPU = torch.device("cpu")


def try_read(s: LazyState, moves: frozenset[str]) -> bool:
    """Answer the read of pending `s` on the host (Note [Small integer reads on the host]);
    False: it was not, nothing changed. `moves`: the op names that only move values."""
    from . import graph

    if not FLAGS.host_reads or s.failed is not None or not graph._allow_execution:
        return False  # (a read where execution is refused raises as before)
    if collectives.active() or _sharded():
        return False
    if _moves_over_data(s.value, moves):
        order = _host_order([s], _MAX_MOVED, exact_only=False)
        return order is not None and _evaluate_and_bind([s], order)
    own = _host_order([s], _MAX_ELEMENTS)
    if own is None:
        return False  # (what the read itself needs cannot be answered: nor can more)
    states = graph.pending_states(None) if FLAGS.read_syncs_all else [s]
    if not any(x is s for x in states):
        states.append(s)
    if len(states) > 1:
        order = _host_order(states, _MAX_ELEMENTS)
        if order is not None:
            return _evaluate_and_bind(states, order)
        # The read alone, if what it leaves pending is small (see the Note).
        if post_order([x.value[0] for x in states], limit=_MAX_LEFT_PENDING) is None:
            return False
    return _evaluate_and_bind([s], own)


def _sharded() -> bool:
    from .sharding import is_spmd

    return is_spmd()  # manual sharding regions exist only in SPMD mode


def _moves_over_data(v: tuple[Node, int], moves: frozenset[str]) -> bool:
    if v[0].op not in moves:
        return False
    order = post_order([v[0]], limit=4 * _MAX_NODES)
    if order is None:
        return False
    return all(n.op in moves or n.op == DEVICE_DATA for n in order)


def _host_order(
    states: list[LazyState], max_elements: int, exact_only: bool = True
) -> list[Node] | None:
    """The nodes the host runs to compute `states`, or None when it cannot answer them (more
    than `_MAX_NODES` of them, or 4x that for data movement; a value of more than
    `max_elements` elements, an inexact dtype when `exact_only`, a node without an aten op)."""
    most = _MAX_NODES if exact_only else 4 * _MAX_NODES
    order = post_order([x.value[0] for x in states], limit=most)
    if order is None:
        return None
    for n in order:
        if n.op == SCALAR or n.op == CONSTANT:
            continue
        if n.op != DEVICE_DATA and n.aten is None:
            return None
        for sp in n.specs:
            if (exact_only and sp.dtype not in _EXACT) or math.prod(sp.shape) > max_elements:
                return None
        if n.op == DEVICE_DATA and not getattr(n.data, "is_fully_addressable", False):
            return None
    return order


def _evaluate_and_bind(states: list[LazyState], order: list[Node]) -> bool:
    """Run `order` (`_host_order` of `states`) on the host and bind each state's value."""
    roots = [x.value for x in states]
    try:
        values = _evaluate(order)
    except Exception:  # the compiling path gives the error, if it is one
        return False
    if values is None:
        return False
    from .transfer import upload_node

    bound: dict[tuple[int, int], Node] = {}
    for x, (n, k) in zip(states, roots):
        node = bound.get((id(n), k))
        if node is None:
            node = bound[(id(n), k)] = upload_node(values[id(n)][k])
        bind_data(x, node)
    metrics.counter_inc("HostRead")
    return True


def _evaluate(order: list[Node]) -> dict[int, tuple] | None:
    from .runtime import device_to_host

    values: dict[int, tuple] = {}
    for n in order:
        if n.op == DEVICE_DATA:
            values[id(n)] = (device_to_host(n.data, n.specs[0].dtype),)
        elif n.op == SCALAR:
            values[id(n)] = (n.data,)
        elif n.op == CONSTANT:
            values[id(n)] = (n.args[0],)
        else:
            ins = [values[id(x)][k] for x, k in n.inputs]
            args = [_fill(a, ins) for a in n.args]
            kwargs = {k: _fill(v, ins) for k, v in n.kwargs}
            # A view's node holds its keyword-only arguments in order after the positional ones.
            schema = n.aten._schema.arguments
            for a, v in zip(schema, args):
                if a.kwarg_only:
                    kwargs[a.name] = v
            args = [v for a, v in zip(schema, args) if not a.kwarg_only]
            if n.aten in _STORAGE_STRIDED:  # See Note [Host values are logical]
                return None
            name = n.aten._schema.name
            if name in _INTEGER_DIVISIONS and _traps(name, args):
                return None  # See Note [Division traps on the host]
            if n.aten is _RESHAPE_ALIAS:
                out = args[0].reshape(args[1])
            else:
                out = n.aten(*args, **kwargs)
            outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
            if len(outs) != len(n.specs):
                return None
            for o, sp in zip(outs, n.specs):
                if not isinstance(o, torch.Tensor) or tuple(o.shape) != sp.shape:
                    return None
                if o.dtype != sp.dtype:
                    return None
            values[id(n)] = outs
    return values


# Note [Host values are logical]
# A host value is a tensor's logical value (downloads and host results are whatever layout eager
# gives them), but a recorded stride argument describes the lazy tensor's eager layout, which the
# host value need not have: `_reshape_alias(x, size, strides)` of a transposed x read a contiguous
# download with the transposed strides and scrambled the elements. `_reshape_alias` is a
# reshape (its lowering ignores the strides, as here); the as_strided family addresses storage
# and is left to the compiling path.
_RESHAPE_ALIAS = torch.ops.aten._reshape_alias.default
_STORAGE_STRIDED = frozenset(
    (
        torch.ops.aten.as_strided.default,
        torch.ops.aten.as_strided_.default,
        torch.ops.aten.as_strided_copy.default,
        torch.ops.aten.as_strided_scatter.default,
    )
)


# Note [Division traps on the host]
# x86's integer division instruction traps on the one quotient that overflows, the most negative
# int32 or int64 divided by -1, and eager's CPU kernels do not all guard it: `torch.div(x, -1,
# rounding_mode="trunc")` of a vector holding INT64_MIN kills the process with SIGFPE (an
# exception could be caught here and left to the compiling path; a signal cannot), and so does
# the vectorized `lcm(INT32_MIN, INT32_MAX)` (its gcd's remainder loop ends at -1). XLA defines
# those values, so a read whose division meets INT_MIN over -1, or whose gcd/lcm meets INT_MIN at
# all, compiles.
_INTEGER_DIVISIONS = frozenset(
    ("aten::div", "aten::floor_divide", "aten::remainder", "aten::fmod", "aten::gcd", "aten::lcm")
)


def _traps(name: str, args: list[Any]) -> bool:
    """Whether eager's integer `name` of `args[0]` and `args[1]` may trap (see the Note)."""
    a, b = args[0], args[1]
    dtype = torch.result_type(a, b)
    if dtype not in (torch.int32, torch.int64):
        return False
    lo = torch.iinfo(dtype).min
    a, b = torch.as_tensor(a) == lo, torch.as_tensor(b)
    if name in ("aten::gcd", "aten::lcm"):
        return bool(a.any() or (b == lo).any())
    return bool((a & (b == -1)).any())


def _fill(a: Any, ins: list[Any]) -> Any:
    """A recorded argument with its Refs replaced by host values, on the CPU."""
    if type(a) is Ref:
        return ins[a]
    if type(a) is tuple:
        filled = [_fill(x, ins) for x in a]
        return filled if any(isinstance(x, torch.Tensor) for x in filled) else tuple(filled)
    if type(a) is torch.device and a.type == DEVICE_TYPE:
        return _CPU
    return a
