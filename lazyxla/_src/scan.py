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

# Note [Tensors a scan body closes over]
torch_xla's scan cannot trace a body that uses a device tensor it closes over while gradients are
on (AOTAutograd meets a real tensor among its fake ones and stops). lazyxla does better: unless
`is_fn_pure` promises there are none, `fn` is first run on lazy stand-ins of one iteration under a
TorchFunctionMode that records the lazyxla tensors it uses without creating them or receiving them
as arguments (`_closed_over`; the lazy ops it records are dropped unexecuted, the RNG state is put
back). Those tensors are then lifted into the carry: the traced body is `fn` run under a mode that
substitutes the carried stand-ins for them, and passes them on unchanged. Their gradient is thus
the carry's gradient, accumulated over the iterations by the backward loop, and lands on the
tensors through autograd like `init`'s. A body that writes such a tensor in place is refused
(the probe stops before the write) with an AssertionError, the type torch_xla's AOTAutograd
raises. In no-grad mode the body is traced on lazy placeholders, where such tensors are simply
captured inputs of the loop (Note [Sub-graph nodes]).

# Note [Scan under SPMD]
Shardings inside `fn` are kept: `mark_sharding_with_gradients` is a custom op AOTAutograd keeps in
the FX graphs (Note [Sharding inside traced functions] in sharding.py), so each iteration of the
loop carries the constraint, in the forward and, on the gradient, in the backward. As in torch_xla,
under SPMD the backward body also pairs each gradient with its input (`grad_init` with `init`,
`grad_xs[i]` with `xs[0]`) through `shard_as`, so the partitioner gives a gradient its input's
sharding instead of the one it settles on inside the loop (a 2-D sharded weight's gradient would
otherwise come out replicated over one mesh axis). That backward body closes over the inputs, so
it is traced per call (the graph cache still compiles it once).

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
    carry_requires_grad: Sequence[bool] | None = None,
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
        carry_requires_grad: per non-None carry leaf, whether it needs a gradient (default:
            every floating leaf); a leaf without one gets a zero gradient carry in the backward.

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

    flat_init, spec_init = tree_flatten(init)
    wants = iter(carry_requires_grad or ())
    fake_carry = tree_unflatten(
        [
            fake(v, True if carry_requires_grad is None or v is None else next(wants))
            for v in flat_init
        ],
        spec_init,
    )
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
    # (shapes only: holding the stand-ins would keep pending tensors alive into the next sync)
    carry_specs = [(tuple(c.shape), c.dtype) for c in flat_c_nn]

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
        grads = list(bwd_graph(*acts, *tangents))
        # A carry leaf without a gradient (an integer, a frozen tensor) gets zeros, so the
        # gradient carry keeps the carry's structure from one iteration to the next.
        for i, (shape, dtype) in enumerate(carry_specs):
            if grads[i] is None:
                grads[i] = torch.zeros(shape, dtype=dtype, device=DEVICE_TYPE)
        return unflatten_grads(grads)

    result = (forward, alias_input, backward)
    if is_fn_pure:
        try:
            _SCAN_COMPUTATION_CACHE.setdefault(fn, {})[key] = result
        except TypeError:  # not weakly referenceable: no caching
            pass
    return result


# --- the autograd Function ------------------------------------------------------------------------


def _is_spmd() -> bool:
    from . import sharding

    return sharding.is_spmd()


def _backward_shard_alike(backward: Callable, init: PyTree, xs: PyTree) -> Callable:
    """`backward` whose gradients are sharded like the forward's inputs (torch_xla's
    `_backward_shard_alike`; see Note [Scan under SPMD])."""
    from .spmd_extra import shard_as

    def is_none(v: Any) -> bool:
        return v is None

    def fn(carry: PyTree, x: PyTree) -> tuple[PyTree, PyTree]:
        grad_carry, grad_x = backward(carry, x)
        out = []
        for grads, like in ((grad_carry, init), (grad_x, xs)):
            flat_g, spec = tree_flatten(grads, is_leaf=is_none)
            flat_like = tree_flatten(like, is_leaf=is_none)[0]
            if like is xs:
                flat_like = [None if v is None else v[0] for v in flat_like]
            pairs = [(g, v) for g, v in zip(flat_g, flat_like) if g is not None and v is not None]
            sharded = iter(shard_as([v for _, v in pairs], [g for g, _ in pairs])[1])
            flat_g = [
                next(sharded) if g is not None and v is not None else g
                for g, v in zip(flat_g, flat_like)
            ]
            out.append(tree_unflatten(flat_g, spec))
        return out[0], out[1]

    return fn


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
        ctx.spmd_inputs = (init, xs) if _is_spmd() else None
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
        backward, cache = ctx.backward_fn, ctx.cache
        if ctx.spmd_inputs is not None:
            backward, cache = _backward_shard_alike(backward, *ctx.spmd_inputs), False
        grad_init, grad_xs = _scan_impl_pytree(
            backward, grad_carry, (grad_ys, activations), reverse=True, cache=cache
        )
        flat_grads, _ = tree_flatten((grad_init, grad_xs))
        grads = [g for g, keep in zip(flat_grads, ctx.in_keep) if keep]
        return (None, *(g if need else None for g, need in zip(grads, ctx.needs_input_grad[1:])))


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
    consts = [] if is_fn_pure else _closed_over(fn, init, xs)
    if consts:
        return _scan_lifting_closures(fn, init, xs, consts, partition_fn)
    fns = value_and_grad_partitioned(fn, init, xs, partition_fn=partition_fn, is_fn_pure=is_fn_pure)
    return _apply_scan(fns, init, xs, cache=is_fn_pure)


class _WritesOutside(Exception):
    """The probe run met an in-place write to a tensor `fn` closes over."""


class _RecordClosures(torch.overrides.TorchFunctionMode):
    """Records the lazyxla tensors a function uses that it neither received nor created."""

    def __init__(self, inputs: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.seen = {id(t): t for t in inputs}  # kept alive: ids stay unique during the run
        self.found: dict[int, torch.Tensor] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args else None
        writes = getattr(func, "__name__", "").endswith("_") or "out" in kwargs
        outside = isinstance(target, torch.Tensor) and (
            id(target) in self.found or id(target) not in self.seen
        )
        if writes and outside and target.device.type == DEVICE_TYPE:
            raise _WritesOutside(f"{func.__name__} on a tensor of shape {tuple(target.shape)}")
        for v in tree_iter((args, kwargs)):
            if (
                isinstance(v, torch.Tensor)
                and id(v) not in self.seen
                and v.device.type == DEVICE_TYPE
            ):
                self.found[id(v)] = v
                self.seen[id(v)] = v
        out = func(*args, **kwargs)
        for v in tree_iter(out):
            if isinstance(v, torch.Tensor):
                self.seen.setdefault(id(v), v)
        return out


class _Substitute(torch.overrides.TorchFunctionMode):
    """Replaces given tensors (by identity) in every torch call's arguments."""

    def __init__(self, replace: dict[int, torch.Tensor]) -> None:
        super().__init__()
        self.replace = replace

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        def sub(v: Any) -> Any:
            return self.replace.get(id(v), v) if isinstance(v, torch.Tensor) else v

        return func(*tree_map(sub, tuple(args)), **tree_map(sub, kwargs or {}))


def _closed_over(fn: Callable, init: PyTree, xs: PyTree) -> list[torch.Tensor]:
    """The lazyxla tensors `fn` uses without receiving them (Note [Tensors a scan body closes
    over]); runs `fn` once on lazy stand-ins, executing nothing."""
    from . import random_state

    carry = tree_map(lambda v: None if v is None else torch.empty_like(v), init)
    x = tree_map(lambda v: None if v is None else torch.empty_like(v[0]), xs)
    rng = random_state.get_state()
    mode = _RecordClosures([v for v in tree_iter((carry, x)) if v is not None])
    try:
        with torch.no_grad(), mode:
            fn(carry, x)
    except _WritesOutside as e:
        # Stopped before the write: nothing outside changed. torch_xla fails here too, with
        # AOTAutograd's AssertionError about FakeTensors (and after the write); same type here.
        raise AssertionError(
            f"scan: `fn` writes in place to a tensor it closes over ({e.args[0]}); a write to an "
            "outside tensor cannot be repeated per iteration (AOTAutograd would meet it as a "
            "real tensor among its FakeTensors). Return the new value through the carry instead"
        ) from None
    finally:
        random_state.set_state(*rng)
    return list(mode.found.values())


def _scan_lifting_closures(
    fn: Callable, init: PyTree, xs: PyTree, consts: list[torch.Tensor], partition_fn: Callable
) -> tuple[PyTree, PyTree]:
    """`scan` with the tensors `fn` closes over carried through the loop, so they get gradients."""
    ids = [id(c) for c in consts]

    def lifted(carry: tuple, x: PyTree) -> tuple:
        inner, carried = carry
        with _Substitute(dict(zip(ids, carried))):
            new, y = fn(inner, x)
        return (new, list(carried)), y

    # The carry itself always needs gradients (they flow between iterations); a carried constant
    # only if it requires grad (it passes through unchanged).
    wants = [True] * len(tree_flatten_none(init)[0]) + [c.requires_grad for c in consts]
    fns = value_and_grad_partitioned(
        lifted, (init, consts), xs, partition_fn, is_fn_pure=False, carry_requires_grad=wants
    )
    (carry, _), ys = _apply_scan(fns, (init, consts), xs, cache=False)
    return carry, ys


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
