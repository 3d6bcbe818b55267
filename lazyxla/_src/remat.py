"""Activation checkpointing on lazy tensors: recomputation XLA cannot merge back.

# Note [Checkpointing]
`torch.utils.checkpoint.checkpoint` runs the function without saving its activations and runs it
again in the backward. On a lazy device both runs are recorded into the same graph, and the
recomputation is the same ops on the same inputs: XLA's common-subexpression elimination merges
it with the forward, the activations live from forward to backward after all, and checkpointing
saves nothing. As torch_xla does, the recomputation here starts from its inputs passed through
one `lax.optimization_barrier` (`xla::optimization_barrier`), which XLA neither looks through nor
moves computation across: the recomputed values are new values, computed when the backward
needs them.

- `use_reentrant=True` (torch's `CheckpointFunction`): the backward puts the saved inputs, the
  incoming gradients and, when the function is a module's method, the module's parameters and
  buffers behind one barrier, in place (torch_xla's exact recipe); tying the inputs to the
  gradients keeps the recomputation from being scheduled before the backward reaches it.
- `use_reentrant=False` (the saved-tensor-hook implementation): the function runs first for the
  forward and again for each recomputation; every call after the first gets its lazy tensor
  arguments through a barrier (out of place; `requires_grad` kept).

Both are lazyxla's behaviour for `torch.utils.checkpoint.checkpoint` itself (installed on import,
acting only when an argument is a lazy tensor) and for torch_xla's
`torch_xla.utils.checkpoint.checkpoint` (which also takes `use_reentrant=False`, which torch_xla
rejects). The device RNG state is stashed and restored around the recomputation (the backend
module reports `_initialized` and has `device()`), so dropout inside a checkpoint draws the same
mask twice, as on CUDA.

Selective checkpointing: `save_matmuls_context_fn` (torch's `create_selective_checkpoint_contexts`
with a policy that saves matmul and attention outputs and recomputes the rest) for
`use_reentrant=False`; the cached matmul outputs then stay alive from forward to backward, the
cheap elementwise work is recomputed.

# Note [Checkpointing on XLA:CPU]
XLA:CPU's default scheduler (concurrency-optimized) places the recomputation as early as its
inputs allow, even with the incoming gradient behind the barrier: an 8-layer decoder step (d=256,
bench/large_models.py) needs 303 MiB of temp memory checkpointed against 270 MiB not. Its
memory-minimizing scheduler (`XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false`)
gives checkpointing its effect: 119-125 MiB against 227 MiB (1.8-1.9x less). lazyxla does not set
the flag itself: XLA reads it once, when the CPU client starts (per-compilation
`compiler_options` are ignored for it, measured), so it cannot follow the first checkpoint; set at
import it would change the schedule of every CPU program, and the concurrency-optimized scheduler
exists for multi-core CPUs this project cannot measure (on the 2-core machine here an unchecked
step took 1.02x as long under the memory scheduler, within noise). So the first checkpoint on
XLA:CPU without the flag warns once, saying which flag to set. GPU and TPU schedulers are
unaffected.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch
import torch.utils.checkpoint as tuc

from . import attention  # noqa: F401  (defines lazyxla::flash_attention_fwd, saved by the policy)
from .ir import Node, Ref
from .tensor import DEVICE_TYPE, new_tensor, read, state, write

aten = torch.ops.aten


def _barrier_rule(*xs: jax.Array) -> tuple[jax.Array, ...]:
    return tuple(jax.lax.optimization_barrier(xs))


def _barrier_node(tensors: Sequence[torch.Tensor]) -> Node:
    values = tuple(read(state(t)) for t in tensors)
    specs = tuple(v[0].specs[v[1]] for v in values)
    refs = tuple(Ref(i) for i in range(len(values)))
    return Node("xla::optimization_barrier", _barrier_rule, values, refs, (), specs)


def _lazy(xs: Sequence[Any]) -> list[torch.Tensor]:
    ts = [x for x in xs if isinstance(x, torch.Tensor) and x.device.type == DEVICE_TYPE]
    if ts:
        _check_cpu_scheduler()
    return ts


_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
_scheduler_checked = False


def _check_cpu_scheduler() -> None:
    """Warn once when checkpointing on XLA:CPU under its default scheduler (Note [Checkpointing
    on XLA:CPU])."""
    global _scheduler_checked
    if _scheduler_checked:
        return
    _scheduler_checked = True
    import os
    import warnings

    from . import runtime

    flags = os.environ.get("XLA_FLAGS", "")
    if (
        runtime.jax_devices()[0].platform == "cpu"
        and "concurrency_optimized_scheduler" not in flags
    ):
        warnings.warn(
            "activation checkpointing on XLA:CPU saves memory only under its memory-minimizing "
            f"scheduler: start the process with XLA_FLAGS={_SCHEDULER_FLAG} (XLA reads it when "
            "the CPU client starts); under the default scheduler the recomputation runs early "
            "and the step needs as much memory as without checkpointing",
            stacklevel=4,
        )


def barrier_(tensors: Sequence[Any]) -> None:
    """The lazy tensors among `tensors` behind one optimization barrier, in place."""
    ts = _lazy(tensors)
    if ts:
        node = _barrier_node(ts)
        for i, t in enumerate(ts):
            write(state(t), (node, i))


def barrier(args: Sequence[Any]) -> list[Any]:
    """`args` with each lazy tensor replaced by its value behind one optimization barrier."""
    ts = _lazy(args)
    if not ts:
        return list(args)
    node = _barrier_node(ts)
    fresh = {}
    for i, t in enumerate(ts):
        out = new_tensor((node, i), node.specs[i])
        if t.requires_grad:
            out.requires_grad_(True)
        fresh[id(t)] = out
    return [fresh.get(id(a), a) if isinstance(a, torch.Tensor) else a for a in args]


_TorchCheckpointFunction = tuc.CheckpointFunction
# Above zero while the reentrant checkpoint recomputes its function: its ops record as eager
# decomposes them (Note [Products kept whole]). (The non-reentrant one recomputes under its
# saved-tensor hooks, which the product kernels already see.)
recomputing = [0]


@contextlib.contextmanager
def _recomputation() -> Any:
    recomputing[0] += 1
    try:
        yield
    finally:
        recomputing[0] -= 1


class CheckpointFunction(_TorchCheckpointFunction):
    """torch's reentrant checkpoint with the recomputation behind a barrier on lazy tensors."""

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        if ctx.device_type == DEVICE_TYPE:
            extra: list[Any] = []
            fn = ctx.run_function
            if hasattr(fn, "__self__") and isinstance(fn.__self__, torch.nn.Module):
                extra = [*fn.__self__.parameters(), *fn.__self__.buffers()]
            elif isinstance(fn, torch.nn.Module):
                extra = [*fn.parameters(), *fn.buffers()]
            barrier_([*ctx.saved_tensors, *grads, *extra])
            with _recomputation():
                return _TorchCheckpointFunction.backward(ctx, *grads)
        return _TorchCheckpointFunction.backward(ctx, *grads)


def _recompute_behind_barrier(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` for the recomputation: its lazy inputs behind a barrier (torch's non-reentrant
    checkpoint calls the function itself for the forward, and this one only to recompute)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return fn(*barrier(args), **kwargs)

    return run


_original_generator = tuc._checkpoint_without_reentrant_generator


def _checkpoint_without_reentrant_generator(fn: Any, *rest: Any, **kwargs: Any) -> Any:
    # rest: preserve_rng_state, context_fn, determinism_check, debug, early_stop, *args
    if _lazy(rest[5:]):
        fn = _recompute_behind_barrier(fn)
    return _original_generator(fn, *rest, **kwargs)


def _save_matmuls_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    return (
        tuc.CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else tuc.CheckpointPolicy.PREFER_RECOMPUTE
    )


# The outputs a "save only matmuls" policy keeps: matrix products and attention.
SAVED_OPS = frozenset(
    [
        aten.mm.default,
        aten.bmm.default,
        aten.addmm.default,
        aten.baddbmm.default,
        aten._scaled_dot_product_attention_math.default,
        torch.ops.lazyxla.flash_attention_fwd.default,
    ]
)


def save_matmuls_context_fn() -> tuple[Any, Any]:
    """A `context_fn` for `checkpoint(..., use_reentrant=False)` that saves matmul (and
    attention) outputs and recomputes everything else (selective activation checkpointing).

    Example:
        >>> checkpoint(layer, x, use_reentrant=False, context_fn=save_matmuls_context_fn)
    """
    return tuc.create_selective_checkpoint_contexts(_save_matmuls_policy)


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    use_reentrant: bool = True,
    context_fn: Callable[[], tuple[Any, Any]] | None = None,
    **kwargs: Any,
) -> Any:
    """torch_xla's `torch_xla.utils.checkpoint.checkpoint`: see Note [Checkpointing].

    Args:
        function: the function (or module) whose activations are recomputed in the backward.
        args: its arguments.
        use_reentrant: torch's two implementations (torch_xla supports only True; lazyxla both).
        context_fn: `use_reentrant=False` only: e.g. `save_matmuls_context_fn` to save matmul
            outputs and recompute the rest.
        preserve_rng_state: restore the RNG for the recomputation (default True).

    Returns:
        `function(*args)`.
    """
    preserve = kwargs.pop("preserve_rng_state", True)
    if use_reentrant:
        if context_fn is not None:
            raise ValueError(
                "checkpoint: context_fn (selective checkpointing) needs use_reentrant=False"
            )
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        return CheckpointFunction.apply(function, preserve, *args)
    return tuc.checkpoint(
        function,
        *args,
        use_reentrant=False,
        preserve_rng_state=preserve,
        context_fn=context_fn or tuc.noop_context_fn,
        **kwargs,
    )


@contextlib.contextmanager
def _device(index: Any) -> Any:
    yield


def install() -> None:
    """Make `torch.utils.checkpoint` checkpoint lazy tensors as Note [Checkpointing] says."""
    tuc.CheckpointFunction = CheckpointFunction
    tuc._checkpoint_without_reentrant_generator = _checkpoint_without_reentrant_generator
    backend = getattr(torch, DEVICE_TYPE)
    backend._initialized = True  # torch's checkpoint then stashes and restores the device RNG
    if not hasattr(backend, "device"):
        backend.device = _device


install()
