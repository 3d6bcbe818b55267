"""torch_xla's `scan(fn, init, xs)`: autograd and pytrees on top of the `xla::scan` loop node.

# Note [Scan autograd]
As in torch_xla 2.9, `fn` is traced with AOTAutograd (`aot_function` on fake copies of one
iteration's carry and x; the carry always requires grad so gradients flow between iterations),
and `partition_fn` splits the joint graph into a forward FX graph, which also returns the
activations the backward needs, and a backward FX graph. `Scan` (an autograd Function) then
records two loop nodes (Note [Loop nodes]):
- forward: a `lax.scan` of the forward graph over `xs`, stacking `ys` and the activations;
- backward: a reversed `lax.scan` of the backward graph over `(grad_ys, activations)`, carrying
  the carry's gradient; it yields the gradients of `init` and `xs`.
Activations that are just slices of `xs` are not stacked again: the original `xs` is saved
(torch_xla's `alias_input`). `default_partition` saves every activation the backward needs;
`min_cut_rematerialization_partition` (or any AOTAutograd partitioner: offloading, custom
policies) recomputes some of the forward inside the backward loop.

Gradients flow to `init` and `xs` only; tensors `fn` closes over are constants of the loop (as in
torch_xla: pass weights through `xs`, as `scan_layers` does).

With grad mode off (`torch.no_grad()`, inference) there is no backward to build: `fn` itself is
traced on placeholder tensors, without AOTAutograd.

Caching. `is_fn_pure=True` promises that `fn` depends only on its arguments: then the partitioned
graphs are cached per `(fn, partition_fn, input shapes/dtypes/pytree)` in
`_SCAN_COMPUTATION_CACHE` (torch_xla's name), and each loop body traced from them is cached too
(per function and signature), so a repeated call traces nothing. Without it, `fn` is traced on
every call, but the traced body has the same structure, so the graph cache still compiles once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch.utils._pytree import PyTree, tree_flatten, tree_iter, tree_map, tree_unflatten

from . import control_flow, metrics
from .control_flow import LoopError
from .ir import TensorSpec
from .subgraph import spec_of
from .tensor import DEVICE_TYPE


def _default_partition() -> Callable:
    from functorch.compile import default_partition

    return default_partition


# {fn: {signature key: (forward, alias_input, backward)}}, weakly keyed by fn (torch_xla's name).
_SCAN_COMPUTATION_CACHE: WeakKeyDictionary = WeakKeyDictionary()
# {body function: {signature key: (SubGraph, y treespec-with-None-mask)}}: traced loop bodies.
_BODY_CACHE: WeakKeyDictionary = WeakKeyDictionary()


# --- pytrees with None leaves ---------------------------------------------------------------------


def tree_flatten_none(pytree: PyTree) -> tuple[list[Any], Callable[[Sequence[Any]], PyTree]]:
    """Flatten `pytree`, dropping `None` leaves; the function puts them back when unflattening.

    Example:
        >>> flat, unflatten = tree_flatten_none(((1, 2), (None, 3), None))
        >>> flat, unflatten(flat)
        ([1, 2, 3], ((1, 2), (None, 3), None))
    """
    flat, spec = tree_flatten(pytree)
    keep = [v is not None for v in flat]
    filtered = [v for v in flat if v is not None]

    def unflatten(values: Sequence[Any]) -> PyTree:
        it = iter(values)
        return tree_unflatten([next(it) if k else None for k in keep], spec)

    return filtered, unflatten


def split(seq: Sequence[Any], *part_lengths: int) -> tuple[Sequence[Any], ...]:
    """`seq` cut into parts of the given lengths, plus the rest: split((1,2,3,4,5), 2, 2) ->
    ((1, 2), (3, 4), (5,))."""
    parts, start = [], 0
    for n in part_lengths:
        parts.append(seq[start : start + n])
        start += n
    parts.append(seq[start:])
    return tuple(parts)


# --- the loop over pytrees ------------------------------------------------------------------------


def _signature(flat: Sequence[torch.Tensor]) -> tuple:
    return tuple((tuple(t.shape), t.dtype) for t in flat)


def _scan_impl_pytree(
    fn: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]],
    init: PyTree,
    xs: PyTree,
    reverse: bool = False,
    cache: bool = True,
) -> tuple[PyTree, PyTree]:
    """Scan `fn` over `xs` without autograd: one `xla::scan` node (see Note [Loop nodes]).
    `cache`: reuse the body traced for `fn` at this signature (fn must then be pure)."""
    flat_init, unflatten_carry = tree_flatten_none(init)
    flat_xs, unflatten_xs = tree_flatten_none(xs)
    key = (
        tree_flatten(init)[1],
        tree_flatten(xs)[1],
        tuple(v is None for v in tree_flatten(init)[0]),
        tuple(v is None for v in tree_flatten(xs)[0]),
        _signature(flat_init),
        tuple((tuple(t.shape[1:]), t.dtype) for t in flat_xs),
    )
    try:
        per_fn = _BODY_CACHE.get(fn) if cache else None
    except TypeError:  # not weakly referenceable: no caching
        per_fn, cache = None, False
    hit = per_fn.get(key) if per_fn is not None else None
    if hit is None:
        holder: list[Callable] = []

        def flat_fn(carry: list[torch.Tensor], x: list[torch.Tensor]) -> tuple[list, list]:
            new_carry, y = fn(unflatten_carry(carry), unflatten_xs(x))
            flat_carry, carry_unflatten = tree_flatten_none(new_carry)
            if len(flat_carry) != len(carry):
                raise LoopError(
                    f"the scan body `fn` returned a carry with {len(flat_carry)} tensors, but "
                    f"`init` has {len(carry)}; the carry must keep the structure of `init`"
                )
            flat_y, unflatten_y = tree_flatten_none(y)
            holder.append(unflatten_y)
            return flat_carry, flat_y

        specs_x = [TensorSpec(tuple(t.shape[1:]), t.dtype) if t.dim() else None for t in flat_xs]
        if any(s is None for s in specs_x):
            raise LoopError("every leaf of `xs` must have a leading dimension to scan over")
        body, _ = control_flow.trace_scan_body(flat_fn, [spec_of(t) for t in flat_init], specs_x)
        hit = (body, holder[-1])
        if cache:
            _BODY_CACHE.setdefault(fn, {})[key] = hit
    body, unflatten_y = hit
    carry, ys = control_flow.scan_flat(body, flat_init, flat_xs, reverse=reverse)
    return unflatten_carry(carry), unflatten_y(ys)


# --- AOTAutograd partitioning ---------------------------------------------------------------------


def _graph_catcher() -> tuple[Callable, Callable[[], torch.fx.GraphModule]]:
    """An AOTAutograd compiler that keeps the FX graph it is given, and a getter for it."""
    from functorch.compile import make_boxed_func

    caught: list[torch.fx.GraphModule] = []

    def compiler(gm: torch.fx.GraphModule, _: Any) -> Callable:
        caught.append(gm)
        return make_boxed_func(gm)

    return compiler, lambda: caught[-1]


def value_and_grad_partitioned(
    fn: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]],
    init: PyTree,
    xs: PyTree,
    partition_fn: Callable | None = None,
    is_fn_pure: bool = True,
) -> tuple[Callable, Callable, Callable]:
    """Trace `fn(carry, x) -> (new_carry, y)` with AOTAutograd and split it into three functions:

    - `forward(carry, x) -> (new_carry, (y, partial_activations))`;
    - `alias_input(stack(partial_activations), xs) -> stack(activations)`, putting back the
      activations that are slices of `xs` (not stacked twice);
    - `backward(grad_new_carry, (grad_y, activations)) -> (grad_carry, grad_x)`.

    Args:
        fn: the function scanned (see `scan`).
        init: the initial carry (its shapes and dtypes are what is traced).
        xs: the stacked inputs (their slices' shapes and dtypes are traced).
        partition_fn: an AOTAutograd partitioner (default: `default_partition`).
        is_fn_pure: cache the result per `(fn, partition_fn, signature)`.

    Returns:
        `(forward, alias_input, backward)`.
    """
    from functorch.compile import aot_function

    if partition_fn is None:
        partition_fn = _default_partition()

    def fake(v: torch.Tensor | None, requires_grad: bool) -> torch.Tensor | None:
        if v is None:
            return None
        return torch.empty_like(v, requires_grad=requires_grad and v.dtype.is_floating_point)

    fake_carry = tree_map(lambda v: fake(v, True), init)
    fake_x = tree_map(
        lambda v: fake(None if v is None else v[0], v is not None and v.requires_grad), xs
    )
    flat_c, spec_c = tree_flatten(fake_carry)
    flat_x, spec_x = tree_flatten(fake_x)
    key = (id(partition_fn), _signature(flat_c), _signature(flat_x), spec_c, spec_x)
    key += (tuple(t.requires_grad for t in flat_x),)
    if is_fn_pure:
        try:
            cached = _SCAN_COMPUTATION_CACHE.get(fn, {}).get(key)
        except TypeError:
            cached = None
        if cached is not None:
            return cached

    def fn_no_output_aliasing(*args: Any) -> Any:
        # AOTAutograd handles an output that aliases an input outside its graphs: clone it so the
        # captured graphs compute every output (torch_xla does the same).
        inputs = {id(v) for v in tree_iter(args)}
        return tree_map(lambda v: v.clone() if id(v) in inputs else v, fn(*args))

    metrics.counter_inc("ScanAOTTrace")
    with torch.enable_grad():
        fw_compiler, get_fwd = _graph_catcher()
        bw_compiler, get_bwd = _graph_catcher()
        compiled = aot_function(
            fn_no_output_aliasing,
            fw_compiler=fw_compiler,
            bw_compiler=bw_compiler,
            partition_fn=partition_fn,
        )
        _, unflatten_grads = tree_flatten_none((fake_carry, fake_x))
        out = compiled(fake_carry, fake_x)
        # The forward graph returns every output leaf, `None`s included, then the activations.
        all_out, out_spec = tree_flatten(out)
        num_out = len(all_out)
        flat_out, _ = tree_flatten_none(out)
        needs_tangent = [o.requires_grad for o in flat_out]
        flat_out_grad = [o for o in flat_out if o.requires_grad]
        if flat_out_grad:
            torch.autograd.backward(flat_out_grad, [torch.ones_like(o) for o in flat_out_grad])
    fwd_graph = get_fwd()
    try:
        bwd_graph = get_bwd()
    except IndexError:
        bwd_graph = None

    # Activations that are the x inputs themselves: saved as the stacked xs instead.
    flat_x_nn, _ = tree_flatten_none(fake_x)
    flat_c_nn, _ = tree_flatten_none(fake_carry)
    with torch.no_grad():
        probe = fwd_graph(*flat_c_nn, *flat_x_nn)
    activations_probe = probe[num_out:]
    x_index = {id(v): i for i, v in enumerate(flat_x_nn)}
    aliases: dict[int, int] = {}  # activation index -> x leaf index
    for a_idx, a in enumerate(activations_probe):
        if id(a) in x_index and x_index[id(a)] not in aliases.values():
            aliases[a_idx] = x_index[id(a)]
    del probe, activations_probe

    def forward(carry: PyTree, x: PyTree) -> tuple[PyTree, tuple[PyTree, tuple]]:
        c, _ = tree_flatten_none(carry)
        xv, _ = tree_flatten_none(x)
        out = fwd_graph(*c, *xv)
        actual, acts = split(list(out), num_out)
        new_carry, y = tree_unflatten(list(actual), out_spec)
        partial = tuple(v for i, v in enumerate(acts) if i not in aliases)
        return new_carry, (y, partial)

    def alias_input(partial_activations: Sequence[Any], xs: PyTree) -> tuple:
        flat, _ = tree_flatten_none(xs)
        acts = list(partial_activations)
        for a_idx in sorted(aliases):
            acts.insert(a_idx, flat[aliases[a_idx]])
        return tuple(acts)

    def backward(carry: PyTree, x: tuple) -> tuple[PyTree, PyTree]:
        if bwd_graph is None:
            raise RuntimeError("scan: nothing in `fn`'s outputs requires grad")
        grad_new_carry, _ = tree_flatten_none(carry)
        grad_y, acts = x
        grad_y, _ = tree_flatten_none(grad_y)
        tangents = [g for g, need in zip((*grad_new_carry, *grad_y), needs_tangent) if need]
        out = bwd_graph(*acts, *tangents)
        return unflatten_grads(list(out))

    result = (forward, alias_input, backward)
    if is_fn_pure:
        try:
            _SCAN_COMPUTATION_CACHE.setdefault(fn, {})[key] = result
        except TypeError:  # not weakly referenceable: no caching
            pass
    return result


# --- the autograd Function ------------------------------------------------------------------------


class _Scan(torch.autograd.Function):
    """Flat-argument autograd Function; `Scan.apply` takes and returns pytrees."""

    @staticmethod
    def forward(ctx: Any, meta: dict, *flat: torch.Tensor) -> tuple:  # type: ignore[override]
        forward, alias_input, backward = meta["fns"]
        init = meta["unflatten_in"](list(flat))[0]
        xs = meta["unflatten_in"](list(flat))[1]
        carry, (ys, partial) = _scan_impl_pytree(forward, init, xs, cache=meta["cache"])
        activations = alias_input(partial, xs)
        ctx.backward_fn = backward
        ctx.cache = meta["cache"]
        ctx.n_act = len(activations)
        ctx.in_keep = [v is not None for v in tree_flatten((init, xs))[0]]
        ctx.save_for_backward(*activations)
        flat_out, unflatten_out = tree_flatten_none((carry, ys))
        ctx.unflatten_out = unflatten_out
        meta["unflatten_out"] = unflatten_out
        return tuple(flat_out)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:  # type: ignore[override]
        activations = tuple(ctx.saved_tensors)
        grad_carry, grad_ys = ctx.unflatten_out(list(grads))
        grad_init, grad_xs = _scan_impl_pytree(
            ctx.backward_fn, grad_carry, (grad_ys, activations), reverse=True, cache=ctx.cache
        )
        flat_grads, _ = tree_flatten((grad_init, grad_xs))
        return (None, *(g for g, keep in zip(flat_grads, ctx.in_keep) if keep))


def _apply_scan(
    fns: tuple[Callable, Callable, Callable], init: PyTree, xs: PyTree, cache: bool
) -> tuple[PyTree, PyTree]:
    flat, unflatten_in = tree_flatten_none((init, xs))
    meta: dict[str, Any] = {"fns": fns, "unflatten_in": unflatten_in, "cache": cache}
    flat_out = _Scan.apply(meta, *flat)
    return meta["unflatten_out"](list(flat_out))


def _check_inputs(fn: Any, init: PyTree, xs: PyTree) -> None:
    if not callable(fn):
        raise ValueError(f"scan: `fn` {fn!r} must be callable")
    length = None
    for i, leaf in enumerate(tree_iter(xs)):
        if leaf is None:
            continue
        if not isinstance(leaf, torch.Tensor):
            raise ValueError(f"scan: leaf {i} of `xs` is a {type(leaf).__name__}, not a tensor")
        if leaf.dim() == 0:
            raise ValueError(
                f"scan: leaf {i} of `xs` is 0-dimensional; it has nothing to scan over"
            )
        if length is None:
            length = leaf.shape[0]
        elif leaf.shape[0] != length:
            raise ValueError(
                f"scan: the leaves of `xs` must have the same leading dimension size, got "
                f"{length} and {leaf.shape[0]} (leaf {i})"
            )
    if length is None:
        raise ValueError(f"scan: `xs` {xs!r} is an empty PyTree; give at least one tensor")
    for what, tree in (("init", init), ("xs", xs)):
        for i, leaf in enumerate(tree_iter(tree)):
            if isinstance(leaf, torch.Tensor) and leaf.device.type != DEVICE_TYPE:
                raise ValueError(
                    f"scan: leaf {i} of `{what}` is on {leaf.device}; scan runs on the lazyxla "
                    "device: create it with device=torch_xla.device() or move it with .to()"
                )
            if leaf is not None and not isinstance(leaf, torch.Tensor):
                raise ValueError(
                    f"scan: leaf {i} of `{what}` is a {type(leaf).__name__}, not a tensor"
                )


def _mutation_guard() -> Callable[[], None]:
    """Checks that the traced body wrote no tensor that existed before it ran."""
    from .tensor import live_states

    before = {id(s): (s, s.version) for s in live_states()}

    def check() -> None:
        for s, v in before.values():
            if s.version != v:
                raise RuntimeError(
                    "scan: `fn` modified a tensor in place that is not one of its own "
                    f"(a tensor of shape {tuple(s.spec.shape)} created outside `fn`); in-place "
                    "updates of outside tensors cannot be repeated per iteration. Return the "
                    "new value through the carry instead"
                )

    return check


def scan(
    fn: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]],
    init: PyTree,
    xs: PyTree,
    partition_fn: Callable | None = None,
    is_fn_pure: bool = False,
) -> tuple[PyTree, PyTree]:
    """Apply `fn` over the leading dimension of `xs` while carrying state, as `jax.lax.scan`.

    Equivalent to (but compiled as one XLA `while` loop, see Note [Loop nodes]):

        carry, ys = init, []
        for i in range(len(xs)):
            carry, y = fn(carry, xs[i])
            ys.append(y)
        return carry, torch.stack(ys)

    Args:
        fn: `fn(carry, x) -> (new_carry, y)`; `carry`, `x` and `y` are pytrees of tensors
            (`y` may hold `None`s or be `()`/`None`); the carry keeps its structure, shapes and
            dtypes. `fn` must be traceable by AOTAutograd when gradients are needed.
        init: the initial carry.
        xs: a pytree of tensors with a common leading dimension, scanned over.
        partition_fn: the AOTAutograd partitioner splitting forward from backward
            (`functorch.compile.default_partition`, the default, saves activations;
            `min_cut_rematerialization_partition` recomputes some in the backward).
        is_fn_pure: `fn` depends only on its arguments: cache its traces (see Note [Scan
            autograd]).

    Returns:
        `(carry, ys)`: the last carry, and `fn`'s `y`s stacked along a new leading dimension.

    Example:
        >>> def cumsum(acc, x):
        ...     acc = acc + x
        ...     return acc, acc
        >>> final, ys = scan(cumsum, torch.zeros(2, device=dev), torch.ones(3, 2, device=dev))
    """
    _check_inputs(fn, init, xs)
    if partition_fn is None:
        partition_fn = _default_partition()
    if not torch.is_grad_enabled():
        check = _mutation_guard()
        out = _scan_impl_pytree(fn, init, xs, cache=is_fn_pure)
        check()
        return out
    fns = value_and_grad_partitioned(fn, init, xs, partition_fn=partition_fn, is_fn_pure=is_fn_pure)
    return _apply_scan(fns, init, xs, cache=is_fn_pure)


def body_traces_cached(fn: Callable) -> int:
    """How many loop bodies are cached for `fn` (for tests)."""
    return len(_BODY_CACHE.get(fn, {}))


__all__ = [
    "scan",
    "split",
    "tree_flatten_none",
    "value_and_grad_partitioned",
    "_SCAN_COMPUTATION_CACHE",
]
