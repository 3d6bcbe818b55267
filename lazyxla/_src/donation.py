"""Buffer donation: which inputs of a sync's graph XLA may overwrite, and with which outputs.

Split from graph.py, whose `Capture` asks these questions of each graph it captures.
"""

from __future__ import annotations

import collections

from .ir import DEVICE_DATA, Node, post_order
from .tensor import HostState, live_states

# Note [Buffer donation]
# With LAZYXLA_DONATE_BUFFERS=1, a full sync donates the buffers of inputs nothing will read
# again: a device-data node that no live tensor holds as its value (its tensor was overwritten, as
# a parameter is by optimizer.step()) is reachable only through the graph being run, so XLA may
# write an output into its buffer. The data a stale view's cached value reads counts as held (the
# view may still read it); data a trace-once graph keeps as a constant is never donated
# (`node.meta == KEEP`). Only inputs whose spec matches an output are donated, so XLA can alias
# every one, and never an array two inputs share. The donation mask is part of the graph key.
# Partial syncs (`.item()`) never donate. A donated buffer is gone once the execution starts, also
# when it then fails (out of memory): what the failed graph computed from it cannot be recomputed
# and fails when read, which is why donation is opt-in here (Note [Failed graphs]).
KEEP = "keep"
DONATE = "donate"  # marked by torch_xla._XLAC._set_buffer_donation: donatable though held
donation_marked = [False]  # has any buffer been marked DONATE in this process (a cheap gate)


def alias_with_buffer_donor() -> bool:
    from .dynamo import get_alias_with_buffer_donor

    return get_alias_with_buffer_donor()


def held_data() -> set[int]:
    """Ids of the device-data nodes some live tensor holds, and of their arrays."""
    held: set[int] = set()
    stale: list[Node] = []
    for s in live_states():
        if type(s) is HostState:  # no device data yet (Note [SPMD virtual device])
            continue
        node = s.value[0]
        if s.base is not None and s.seen != s.base.version:
            stale.append(node)  # its cached value may still read old data: all of it is held
        elif node.op == DEVICE_DATA:
            held.add(id(node))
            held.add(id(node.data))  # an array several nodes share (Note [Device data cache])
    for node in post_order(stale) if stale else ():
        if node.op == DEVICE_DATA:
            held.add(id(node))
            held.add(id(node.data))
    return held


def donation_mask(data_nodes: list[Node], root_values: list[tuple[Node, int]]) -> tuple[bool, ...]:
    """One flag per data input (`data_nodes`, in argument order): may XLA reuse its buffer? See
    Note [Buffer donation]."""
    held = held_data()
    free = collections.Counter(n.specs[k] for n, k in root_values)
    # An array several of this graph's inputs share (two nodes over one buffer: a gradient
    # seeded with the tensor itself) is read through the others: never donated.
    uses = collections.Counter(id(n.data) for n in data_nodes)
    mask = []
    for n in data_nodes:
        free_input = (id(n) not in held and id(n.data) not in held) or n.meta == DONATE
        ok = free_input and uses[id(n.data)] == 1 and n.meta != KEEP and free[n.specs[0]] > 0
        if ok:
            free[n.specs[0]] -= 1
        mask.append(ok)
    return tuple(mask)


# Note [Donated buffers pair with their updates]
# JAX aliases donated inputs to outputs by shape and dtype alone: each output, in order, takes the
# first donated input of its shape left (`mlir._set_up_aliases`). A sync's outputs come in graph
# order (Note [Roots in graph order]): a training step's gradients first, then the optimizer's
# states, then the parameters, while its inputs come parameters first. So a (128, 128) weight's
# buffer was aliased to a gradient's output, and XLA must keep the weight's old value alive
# until the last read of it while the gradient is written into its buffer: it inserts a copy
# (the demo decoder's donating step: 131 copies, against 39 without donation). A donated buffer's
# own update (`p.addcdiv_(...)` writing the parameter, `exp_avg.lerp_(...)` its state) is an
# output computed from it through in-place ops' `self` arguments: input 0, or input k of a
# foreach op's output k. Those outputs go first, in the order of the inputs they update, so the
# k-th donated input of each shape is paired with its own update; the other outputs follow in
# graph order. The order is a function of the
# graph, so keys stay stable across steps. A pairing only decides where XLA writes: whatever it
# pairs, the program computes the same values (XLA copies where an alias would overwrite a value
# still to be read). Measured on the demo decoder, steps interleaved in one process: 58 copies;
# the donating step 61.8 -> 56.0 ms, against 55.1 and 51.1 ms without donation in the same runs.
# Donation is still slower here (its executable ~2.7 ms, `held_data` and the split arguments the
# rest), so it stays off by default.
_OWN_INPUT_DEPTH = 8
_FOREACH = "aten::_foreach_"


def _updated_input(
    v: tuple[Node, int], donated: dict[Node, int], fill_data: dict[int, Node]
) -> Node | None:
    """The donated data node `v` was computed from in place (through `self` arguments of the
    output's shape), if any."""
    n, k = v
    spec = n.specs[k]
    for _ in range(_OWN_INPUT_DEPTH):
        if n.op == DEVICE_DATA or id(n) in fill_data:
            n = fill_data.get(id(n), n)
            return n if n in donated else None
        if not n.inputs:
            return None
        x, kx = n.inputs[k] if k < len(n.inputs) and n.op.startswith(_FOREACH) else n.inputs[0]
        if x.specs[kx] != spec:
            return None
        n, k = x, kx
    return None


def paired_root_order(
    data_nodes: list[Node],
    donate: tuple[bool, ...],
    root_values: list[tuple[Node, int]],
    fill_data: dict[int, Node],
) -> list[int] | None:
    """The roots reordered so that each donated input's own update comes first, in the donated
    inputs' order (Note [Donated buffers pair with their updates]); None to keep their order."""
    donated = {n: i for i, (n, d) in enumerate(zip(data_nodes, donate)) if d}
    claimed: dict[int, int] = {}  # donated input's position -> the root updating it
    for r, v in enumerate(root_values):
        d = _updated_input(v, donated, fill_data)
        if d is not None and donated[d] not in claimed:
            claimed[donated[d]] = r
    order = [claimed[i] for i in sorted(claimed)]
    first = set(order)
    order += [r for r in range(len(root_values)) if r not in first]
    return None if order == list(range(len(order))) else order
