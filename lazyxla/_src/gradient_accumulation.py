"""torch_xla's `gradient_accumulation`: forward and backward of several micro-batches as one loop.

# Note [Gradient accumulation loop]
torch_xla traces `train_step` plus `loss.backward()` once into an HLO computation and runs it in an
XLA `While` whose carry holds the iteration, the summed loss, the summed gradients and the carried
tensors. lazyxla builds the same program from its loop node (Note [Loop nodes]): one
`xla::scan` over the leading dimension of the iterable tensors, whose body is traced once on
placeholder tensors (Note [Sub-graph nodes]). Inside the body, grad mode is switched back on, the
parameters' `.grad` are set aside, `train_step` runs on one slice of each iterable tensor, and
`(loss / steps).backward()` leaves this micro-batch's gradients on the parameters: those lazy
values (they depend on the slice placeholders) are added to the gradient carries, and the
parameters' own `.grad` are put back. The parameters are not loop operands: they are values the
body captures (read once, outside the loop). After the loop the summed gradients are added to
`.grad` (or become it), as in torch_xla.

What follows from the loop node:
- random ops in `train_step` draw different numbers in each iteration (their seed is offset by the
  iteration index) and in each call;
- every call re-traces `train_step` (it closes over the model and may change), but the body has
  the same structure, so the graph key is the same and a second call with new data compiles
  nothing;
- the loss carry is float32, as torch_xla's (`loss` must be a scalar); a gradient carry has its
  parameter's dtype and, under SPMD, its parameter's sharding.

The body must be pure, as torch_xla requires: an in-place write to a carried tensor, an iterable
slice, a parameter or a buffer of the model inside `train_step` raises AssertionError (torch_xla's
type), and a parameter or buffer written that way gets its value back. Writes that only put a
value behind an optimization barrier (activation checkpointing does, to the layer's parameters)
change no value and are allowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import control_flow, graph, metrics
from .control_flow import LoopError
from .ir import TensorSpec
from .subgraph import spec_of
from .tensor import DEVICE_TYPE, LazyState, state


@dataclasses.dataclass(frozen=True)
class GradientAccumulationContext:
    """Context for the gradient accumulation loop (torch_xla's names).

    Attributes:
        num_gradient_steps: number of micro-batches accumulated over (the iterations).
        num_iterable_tensors: number of tensors iterated over along their leading dimension.
        num_carried_tensors: number of tensors carried from one iteration to the next.
    """

    num_gradient_steps: int
    num_iterable_tensors: int
    num_carried_tensors: int


def gradient_accumulation(
    train_step: Callable[..., Any],
    iterable_tensors: Sequence[torch.Tensor],
    model: torch.nn.Module,
    *carried_tensors: torch.Tensor,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Accumulate `model`'s gradients over the leading dimension of `iterable_tensors` in one loop.

    Equivalent to (but compiled as one XLA loop, see Note [Gradient accumulation loop]):

        total = 0
        for i in range(steps):
            loss, *carried = train_step(*(t[i] for t in iterable_tensors), *carried)
            loss = loss / steps
            loss.backward()
            total += loss.detach()
        return total, *carried

    Args:
        train_step: `train_step(*slices, *carried) -> loss` or `(loss, *new_carried)`; `slices`
            are one slice of each iterable tensor (leading dimension removed). It must be pure:
            it may read `model` and its arguments but not write to them in place.
        iterable_tensors: lazyxla tensors with the same leading dimension (the number of steps).
        model: the module whose parameters get the accumulated gradients in `.grad` (added to
            any gradient already there).
        *carried_tensors: tensors passed from one step to the next (each step's new values must
            keep their shapes and dtypes).

    Returns:
        The accumulated loss (the sum of the per-step losses divided by the number of steps,
        float32), followed by the final carried tensors when there are any.

    Example:
        >>> loss, counter = gradient_accumulation(step, (data, target), model, counter)
        >>> optimizer.step()
    """
    if not iterable_tensors:
        raise ValueError(
            "gradient_accumulation: iterable_tensors cannot be empty; give at least one tensor "
            "whose leading dimension is the number of accumulation steps"
        )
    steps = None
    for i, t in enumerate(iterable_tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(
                f"gradient_accumulation: element {i} of iterable_tensors is not a tensor, "
                f"but a {type(t).__name__}"
            )
        if t.dim() == 0 or t.numel() == 0:
            raise ValueError(
                f"gradient_accumulation: element {i} of iterable_tensors is empty (shape "
                f"{tuple(t.shape)}); it needs a leading dimension to iterate over"
            )
        if steps is None:
            steps = int(t.shape[0])
        elif t.shape[0] != steps:
            raise ValueError(
                f"gradient_accumulation: element {i} of iterable_tensors has inconsistent first "
                f"dimension {t.shape[0]} (element 0 has {steps}); all must have the same length"
            )
    assert steps is not None
    context = GradientAccumulationContext(steps, len(iterable_tensors), len(carried_tensors))
    return _gradient_accumulation(
        context, train_step, tuple(iterable_tensors), model, carried_tensors
    )


def _check_device(tensors: Sequence[Any], what: str) -> None:
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(
                f"gradient_accumulation: {what} {i} is a {type(t).__name__}, not a tensor"
            )
        if t.device.type != DEVICE_TYPE:
            raise ValueError(
                f"gradient_accumulation: {what} {i} is on {t.device}; the loop runs on the lazyxla "
                "device: move it with .to(torch_xla.device())"
            )


def _init_grad(p: torch.Tensor) -> torch.Tensor:
    """A zero gradient carry for `p`, sharded like `p` (torch_xla's `_make_init_grad`)."""
    from .sharding import ShardingAnnotation, annotate

    grad = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
    ann = state(p).sharding
    if isinstance(ann, ShardingAnnotation):
        annotate(grad, ann, ann.named)
    return grad


class _Snapshot:
    """The values and versions of some lazy storages, to detect and undo in-place writes."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.saved: list[tuple[LazyState, Any, int]] = []
        seen: set[int] = set()
        for t in tensors:
            s = state(t)
            s = s.base if s.base is not None else s
            if id(s) not in seen:
                seen.add(id(s))
                self.saved.append((s, s.value, s.version))

    def changed(self) -> list[LazyState]:
        """The storages written since the snapshot, except by an optimization barrier alone."""
        return [
            s
            for s, value, v in self.saved
            if s.version != v and not _behind_barrier(s.value, value)
        ]

    def restore(self) -> None:
        for s, value, version in self.saved:
            s.value, s.version = value, version


def _behind_barrier(value: Any, old: Any) -> bool:
    """Whether `value` is `old` behind optimization barriers only (the identity in value).

    Activation checkpointing puts the tensors its recomputation reads (the layer's parameters
    included) behind a barrier in place; the value does not change, so the write is not a
    mutation of the input and the snapshot's value is put back after the body is traced."""
    while value != old:
        node, k = value
        if node.op != _BARRIER:
            return False
        value = node.inputs[k]
    return True


_BARRIER = "xla::optimization_barrier"


def _gradient_accumulation(
    context: GradientAccumulationContext,
    train_step: Callable[..., Any],
    iterable_tensors: tuple[torch.Tensor, ...],
    model: torch.nn.Module,
    carried_tensors: tuple[torch.Tensor, ...],
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    params = list(model.parameters())
    grad_params = [p for p in params if p.requires_grad]
    _check_device(iterable_tensors, "iterable tensor")
    _check_device(carried_tensors, "carried tensor")
    _check_device(params, "model parameter")
    buffers = [b for b in model.buffers() if b.device.type == DEVICE_TYPE]
    # Materialize the inputs first (torch_xla does too): the body then captures parameters and
    # buffers as device data, and the loop's graph does not change with what computed them.
    module_tensors = [*params, *buffers]
    graph.sync_states([state(t) for t in (*iterable_tensors, *module_tensors, *carried_tensors)])

    n_grads, n_carried = len(grad_params), context.num_carried_tensors
    init = [
        torch.zeros((), dtype=torch.float32, device=DEVICE_TYPE),
        *(_init_grad(p) for p in grad_params),
        *carried_tensors,
    ]
    carried_specs = [spec_of(t) for t in carried_tensors]
    module_snapshot = _Snapshot(module_tensors)
    no_grad: list[bool] = []

    def body(carry: list[torch.Tensor], xs: list[torch.Tensor]) -> tuple[list, list]:
        loss_acc, grads_acc, carried = carry[0], carry[1 : 1 + n_grads], carry[1 + n_grads :]
        inputs = _Snapshot([*xs, *carried])
        saved_grads = [p.grad for p in params]
        for p in params:
            p.grad = None
        try:
            with torch.enable_grad():
                result = train_step(*xs, *carried)
                if n_carried:
                    if not isinstance(result, (tuple, list)) or len(result) != 1 + n_carried:
                        got = len(result) if isinstance(result, (tuple, list)) else 1
                        raise LoopError(
                            f"gradient_accumulation: train_step must return (loss, *carried) "
                            f"with {n_carried} carried tensors, but returned {got} values"
                        )
                    loss, *new_carried = result
                else:
                    loss, new_carried = result, []
                _check_loss(loss)
                loss = loss / context.num_gradient_steps
                loss.backward()
            # A parameter the loss does not reach keeps `.grad` None, as in eager (the trace is
            # the same for every iteration, so this is known here).
            no_grad[:] = [p.grad is None for p in grad_params]
            grads = [
                torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in grad_params
            ]
        finally:
            for p, g in zip(params, saved_grads):
                p.grad = g
            changed = inputs.changed() + module_snapshot.changed()
            # Restored in every case: a parameter or buffer must not keep a value computed
            # inside the body (it would depend on the loop's placeholders).
            module_snapshot.restore()
        if changed:
            raise AssertionError(
                "gradient_accumulation: train_step wrote in place to one of its inputs (a tensor "
                f"of shape {tuple(changed[0].spec.shape)}: a carried tensor, an iterable slice, "
                "a model parameter or buffer); the loop body must be pure. Return the new value "
                "of a carried tensor instead of updating it (e.g. `counter = counter + 1`); a "
                "module that updates buffers in training mode (BatchNorm's running statistics) "
                "cannot run inside the loop"
            )
        for i, (t, want) in enumerate(zip(new_carried, carried_specs)):
            if not isinstance(t, torch.Tensor) or t.device.type != DEVICE_TYPE:
                raise LoopError(
                    f"gradient_accumulation: train_step's carried output {i} is not a lazyxla "
                    "tensor; return tensors on torch_xla.device()"
                )
            if spec_of(t) != want:
                raise LoopError(
                    f"gradient_accumulation: train_step changed carried tensor {i} from "
                    f"{_describe(want)} to {_describe(spec_of(t))}; a carried tensor must keep "
                    "its shape and dtype"
                )
        new_loss = loss_acc + loss.detach().reshape(()).to(torch.float32)
        new_grads = [a + g.to(a.dtype) for a, g in zip(grads_acc, grads)]
        return [new_loss, *new_grads, *new_carried], []

    x_specs = [TensorSpec(tuple(t.shape[1:]), t.dtype) for t in iterable_tensors]
    metrics.counter_inc("GradientAccumulationTrace")
    loop_body, _ = control_flow.trace_scan_body(
        body, [spec_of(t) for t in init], x_specs, what="gradient_accumulation's train_step"
    )
    with torch.no_grad():
        final, _ = control_flow.scan_flat(loop_body, init, list(iterable_tensors))
    loss, grads, carried = final[0], final[1 : 1 + n_grads], final[1 + n_grads :]
    with torch.no_grad():
        for p, g, skip in zip(grad_params, grads, no_grad):
            if skip:
                continue
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)
    if not carried:
        return loss
    return (loss, *carried)


def _describe(spec: TensorSpec) -> str:
    return f"{str(spec.dtype).replace('torch.', '')}{list(spec.shape)}"


def _check_loss(loss: Any) -> None:
    if not isinstance(loss, torch.Tensor) or loss.device.type != DEVICE_TYPE:
        raise LoopError(
            "gradient_accumulation: train_step must return the loss as a lazyxla tensor (first), "
            f"got {type(loss).__name__}"
        )
    if loss.numel() != 1:
        raise LoopError(
            f"gradient_accumulation: the loss train_step returns must be a scalar, got shape "
            f"{tuple(loss.shape)}; reduce it (e.g. `.mean()`)"
        )
    if not loss.requires_grad:
        raise LoopError(
            "gradient_accumulation: the loss train_step returns does not require grad: it does "
            "not depend on any model parameter that requires grad"
        )


__all__ = ["GradientAccumulationContext", "gradient_accumulation"]
