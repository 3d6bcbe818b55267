"""torch_xla's `scan_layers(layers, input)`: a stack of identical modules as one `lax.scan`.

The layers' parameters and buffers are stacked along a new leading dimension (`torch.stack`, so
each layer keeps its own ordinary `nn.Parameter`: gradients flow back through the stack onto
every layer's parameters, and optimizers see nothing new) and scanned over with a copy of the
first layer run through `torch.func.functional_call`. The loop body is traced once for all layers:
XLA compiles one layer, whatever the depth (see Note [Loop nodes]).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from .scan import _default_partition, scan

# (id(partition_fn), id(first layer)) -> the wrapped one-layer function, for pure layers: the same
# function object each call, so scan's caches hit (torch_xla's name and behaviour).
_ONE_LAYER_CACHE: dict[tuple[int, int], Callable] = {}


def _one_layer_fn(first_layer: nn.Module, partition_fn: Callable, is_layer_pure: bool) -> Callable:
    key = (id(partition_fn), id(first_layer))
    if is_layer_pure and key in _ONE_LAYER_CACHE:
        return _ONE_LAYER_CACHE[key]
    # The template's own tensors are never read (functional_call swaps in each layer's): let it
    # share the first layer's instead of cloning them, which would leave pending copies that the
    # first step's graph computes for nothing.
    shared = {id(t): t for t in (*first_layer.parameters(), *first_layer.buffers())}
    template = copy.deepcopy(first_layer, memo=shared)

    def one_layer(carry: Any, params_buffers: tuple[dict, dict]) -> tuple[Any, None]:
        params, buffers = params_buffers
        out = torch.func.functional_call(template, {**params, **buffers}, carry, strict=True)
        return out, None

    if is_layer_pure:
        _ONE_LAYER_CACHE[key] = one_layer
    return one_layer


# Note [Per-layer gradients are not views]
# `torch.stack`'s backward hands each layer the gradient `grad.select(0, i)`, a view of the
# stacked gradient, and AccumulateGrad keeps it as `p.grad`. From the next step on, every in-place
# update of a layer's `.grad` (`zero_()`, the accumulation, the optimizer's `mul_`) writes through
# to the shared base: one `select_scatter` of the whole stacked tensor per layer, O(layers²) bytes
# and one dynamic-update-slice kernel per layer and parameter for XLA to compile (160 of a
# 16-layer decoder's 283 CPU kernels). `_stack` gives each layer a gradient of its own instead.


class _Stack(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, *ts: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.stack(ts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        if grad.device.type == "cpu":
            return tuple(g.clone() for g in grad.unbind(0))
        index = torch.ops.aten.index.Tensor  # (`grad[i]` of a 0-d tensor reads i on the host)
        return tuple(index(grad, [i]) for i in _layer_indices(grad.shape[0], grad.device))


# (device, layers) -> each layer's index as a 0-d tensor on the device. `grad[i]` by a Python int
# is a slice at a constant offset, which XLA fuses into each layer's gradient consumers (the
# optimizer's update), so every layer's kernels differ by that constant and XLA:CPU compiles
# them all; indexed by a device tensor, it is a dynamic slice whose index is an argument, and
# the layers share kernels (a 16-layer step: 164 slice kernels fewer, 2x faster to compile).
_LAYER_INDICES: dict[tuple[torch.device, int], tuple[torch.Tensor, ...]] = {}


def _layer_indices(n: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    hit = _LAYER_INDICES.get((device, n))
    if hit is None:
        hit = tuple(torch.tensor(i).to(device) for i in range(n))
        _LAYER_INDICES[(device, n)] = hit
    return hit


def _stack(*ts: torch.Tensor) -> torch.Tensor:
    if not any(t.requires_grad for t in ts):
        return torch.stack(ts, dim=0)
    return _Stack.apply(*ts)


def _weights_and_buffers(
    layer: nn.Module,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    return dict(layer.named_parameters()), dict(layer.named_buffers())


def _ensure_same_structure(dicts: Sequence[Mapping[str, torch.Tensor]], what: str) -> None:
    if not dicts:
        return
    ref = dicts[0]
    for i, d in enumerate(dicts[1:], start=1):
        if set(d) != set(ref):
            missing, extra = set(ref) - set(d), set(d) - set(ref)
            msg = f"Layer {i} has mismatched keys ({what}) compared with layer 0."
            if missing:
                msg += f" Missing: {sorted(missing)}."
            if extra:
                msg += f" Extra: {sorted(extra)}."
            raise ValueError(msg + " scan_layers needs layers of the same structure")
        for name in ref:
            if d[name].shape != ref[name].shape or d[name].dtype != ref[name].dtype:
                raise ValueError(
                    f"Shape mismatch for '{name}' in layer {i}: expected "
                    f"{tuple(ref[name].shape)} {ref[name].dtype}, got {tuple(d[name].shape)} "
                    f"{d[name].dtype}. scan_layers needs layers with the same parameter shapes"
                )


def scan_layers(
    layers: Iterable[nn.Module],
    input_data: Any,
    partition_fn: Callable | None = None,
    is_layer_pure: bool = False,
) -> Any:
    """Run `layers` in sequence on `input_data`, compiled as one loop over stacked weights.

    Equivalent to `nn.Sequential(*layers)(input_data)`; all layers must have the same structure
    (same parameter names and shapes) and compute the same function of their parameters.

    Args:
        layers: the modules, applied in order; each takes the previous one's output.
        input_data: the first layer's input (a tensor or pytree of tensors).
        partition_fn: AOTAutograd partitioner splitting each layer's forward and backward
            (`default_partition`: save activations; `min_cut_rematerialization_partition`:
            recompute them in the backward, like activation checkpointing).
        is_layer_pure: the layers depend only on their parameters and input: cache the traces
            (a second call traces nothing).

    Returns:
        The output of the last layer.

    Example:
        >>> layers = [nn.Linear(16, 16).to(dev) for _ in range(10)]
        >>> out = scan_layers(layers, torch.randn(4, 16, device=dev))
    """
    layers = list(layers)
    if not layers:
        return input_data
    if partition_fn is None:
        partition_fn = _default_partition()
    first = layers[0]
    pb = [_weights_and_buffers(layer) for layer in layers]
    params = [p for p, _ in pb]
    buffers = [b for _, b in pb]
    _ensure_same_structure(params, "parameters")
    _ensure_same_structure(buffers, "buffers")
    stacked_params = tree_map(_stack, *params)  # Note [Per-layer gradients are not views]
    stacked_buffers = tree_map(_stack, *buffers)
    one_layer = _one_layer_fn(first, partition_fn, is_layer_pure)
    out, _ = scan(
        one_layer,
        input_data,
        (stacked_params, stacked_buffers),
        partition_fn=partition_fn,
        is_fn_pure=is_layer_pure,
    )
    return out
