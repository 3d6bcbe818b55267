"""torch_xla's `torch_xla.distributed.fsdp.utils`: the `nn.Linear` patch FSDP uses to free full
parameters, and stand-ins for FSDP's collectives when debugging.

# Note [Patched nn.Linear]
PyTorch's `nn.Linear` backward (`addmm`/`mm` saved for backward) keeps the weight as autograd
saw it in the forward. Under FSDP the forward runs on a full parameter gathered for the layer and
freed right after; a backward that holds an intermediate derived from it keeps the full parameter
alive. `XLAPatchedLinear` saves the weight parameter itself and spells the backward out with `mm`
(flattening leading dims), so the backward reads the weight FSDP re-gathers.
`apply_xla_patch_to_nn_linear(module)` switches every `nn.Linear` under `module` whose forward is
still `nn.Linear.forward` (also the original forward `checkpoint_module` keeps) to it. Values and
gradients are eager's `F.linear`.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MethodType
from typing import Any

import torch
from torch import nn

from . import runtime_api, xla_model


class XLAPatchedLinear(torch.autograd.Function):
    """`F.linear(input, weight, bias)` with the backward written out (Note [Patched nn.Linear])."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor, bias: Any = None) -> Any:
        ctx.save_for_backward(input, weight, bias)
        with torch.no_grad():
            return torch._C._nn.linear(input, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        input, weight, bias = ctx.saved_tensors
        flat_in = input.flatten(0, -2) if input.dim() > 2 else input
        flat_grad = grad_output.flatten(0, -2) if input.dim() > 2 else grad_output
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = flat_grad.mm(weight).view(input.shape)
        if ctx.needs_input_grad[1]:
            grad_weight = flat_grad.t().mm(flat_in)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = flat_grad.sum(0)
        return grad_input, grad_weight, grad_bias


def _xla_patched_nn_linear_forward(m: nn.Linear, input: torch.Tensor) -> torch.Tensor:
    return XLAPatchedLinear.apply(input, m.weight, m.bias)


def apply_xla_patch_to_nn_linear(
    module: nn.Module,
    patched_function: Callable[[nn.Linear, torch.Tensor], torch.Tensor] = (
        _xla_patched_nn_linear_forward
    ),
) -> nn.Module:
    """Make every `nn.Linear` in `module` (itself included) run `patched_function` as its forward
    (Note [Patched nn.Linear]). Layers whose forward was already replaced otherwise are left as
    they are. Returns `module`."""

    def patch(m: nn.Module, attr: str) -> None:
        method = getattr(m, attr, None)
        if getattr(method, "__func__", None) is not nn.Linear.forward:
            return
        m._nn_linear_forward_original = method
        setattr(m, attr, MethodType(patched_function, m))

    for m in module.modules():
        if isinstance(m, nn.Linear):
            patch(m, "forward")
            patch(m, "_xla_checkpointed_forward_original")  # see checkpoint_module
    return module


def checkpoint_module(module: nn.Module) -> nn.Module:
    """Run `module.forward` under activation checkpointing: torch_xla's reentrant
    `torch_xla.utils.checkpoint.checkpoint` (Note [Checkpointing]), which runs the whole forward
    again in the backward (step closures, hooks and dropout masks included, with the RNG state
    restored). Keyword arguments are packed after the positional ones, as torch_xla does. A call
    where no input requires a gradient runs the plain forward. Returns `module`.
    """
    from . import remat

    if not isinstance(module, nn.Module):
        raise TypeError(f"checkpoint_module takes an nn.Module, got {type(module).__name__}")

    def unpacked(m: nn.Module, num_args: int, num_kwargs: int, *packed: Any) -> Any:
        args, rest = packed[:num_args], packed[num_args:]
        kwargs = dict(zip(rest[:num_kwargs], rest[num_kwargs:]))
        return m._xla_checkpointed_forward_original(*args, **kwargs)

    def forward(m: nn.Module, *args: Any, **kwargs: Any) -> Any:
        packed = args + tuple(kwargs.keys()) + tuple(kwargs.values())
        if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in packed):
            return m._xla_checkpointed_forward_original(*args, **kwargs)
        run = m._xla_checkpointed_forward_no_kwargs
        return remat.checkpoint(run, len(args), len(kwargs), *packed)

    # torch_xla's attribute names: apply_xla_patch_to_nn_linear patches the original forward.
    module._xla_checkpointed_forward_original = module.forward
    module._xla_checkpointed_forward_no_kwargs = MethodType(unpacked, module)
    module.forward = MethodType(forward, module)
    return module


def dummy_all_gather(value: torch.Tensor, dim: int = 0, groups: Any = None) -> torch.Tensor:
    """Debugging stand-in for `xm.all_gather`: the output shape, without communication."""
    repeats = [1] * value.dim()
    repeats[dim] = runtime_api.world_size()
    return value.repeat(tuple(repeats))


def dummy_all_reduce(reduce_type: str, inputs: Any, scale: float = 1.0, groups: Any = None) -> Any:
    """Debugging stand-in for `xm.all_reduce`: `inputs * scale` (a list scaled in place)."""
    if isinstance(inputs, torch.Tensor):
        return inputs * scale
    return [t.mul_(scale) for t in inputs]


class DummyReduceScatter:
    """Debugging stand-in for FSDP's reduce-scatter: passes this rank's slice of dim 0, unreduced,
    to the callback."""

    def __init__(self, shard_count: int) -> None:
        if shard_count != runtime_api.world_size():
            raise ValueError(
                f"DummyReduceScatter(shard_count={shard_count}): the shard count must be the "
                f"world size ({runtime_api.world_size()})"
            )
        self.scale = 1.0

    def __call__(self, input: torch.Tensor, callback: Callable[[torch.Tensor], Any]) -> None:
        shard = input.size(0) // runtime_api.world_size()
        begin = shard * runtime_api.global_ordinal()
        callback(input[begin : begin + shard])

    def flush(self) -> None:
        pass


class BucketizedReduceScatter:
    """A reduce-scatter that groups its inputs into buckets of `bucket_size_mb` (0: one tensor per
    call) before reducing them, calling each input's callback with its shard."""

    def __init__(self, bucket_size_mb: float, shard_count: int, groups: Any, pin_layout: bool):
        self.bucket_size_bytes = bucket_size_mb * 1024 * 1024
        self.shard_count = shard_count
        self.groups = groups
        self.pin_layout = pin_layout
        self.scale = 1.0
        self.callbacks: list[Callable[[torch.Tensor], Any]] = []
        self.bucket: list[torch.Tensor] = []
        self.bucket_watermark = 0

    def __call__(self, input: torch.Tensor, callback: Callable[[torch.Tensor], Any]) -> None:
        self.bucket.append(input)
        self.callbacks.append(callback)
        self.bucket_watermark += input.element_size() * input.numel()
        if self.bucket_watermark > self.bucket_size_bytes:
            self.flush()

    def flush(self) -> None:
        if not self.bucket:
            return
        inputs: Any = self.bucket[0] if len(self.bucket) == 1 else list(self.bucket)
        results = xla_model.reduce_scatter(
            xla_model.REDUCE_SUM,
            inputs,
            scale=self.scale,
            scatter_dim=0,
            shard_count=self.shard_count,
            groups=self.groups,
            pin_layout=self.pin_layout,
        )
        if isinstance(results, torch.Tensor):
            results = [results]
        for callback, result in zip(self.callbacks, results):
            callback(result)
        self.bucket.clear()
        self.callbacks.clear()
        self.bucket_watermark = 0
