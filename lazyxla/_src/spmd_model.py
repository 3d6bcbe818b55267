"""Model-level SPMD helpers: the patched linear, backward barriers, FSDPv2, sharding pictures."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import sharding as xs


class XLAPatchedLinear(torch.autograd.Function):
    """`F.linear` through einsum, so a sharded batch dim is never flattened away.

    `torch.matmul` reshapes N-d inputs to 2-D, merging a sharded dim with others and making
    sharding propagation hard; einsum keeps every dim.
    """

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor, bias: Any = None) -> Any:
        ctx.save_for_backward(input, weight, bias)
        with torch.no_grad():
            product = torch.einsum("...n,mn->...m", input, weight)
            return product if bias is None else product + bias

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = torch.einsum("...m,mn->...n", grad_output, weight)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.einsum("...m,...n->mn", grad_output, input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = torch.einsum("...m->m", grad_output)
        return grad_input, grad_weight, grad_bias


def xla_patched_nn_linear_forward(m: nn.Linear, input: torch.Tensor) -> torch.Tensor:
    return XLAPatchedLinear.apply(input, m.weight, m.bias)


def apply_backward_optimization_barrier(m: nn.Module) -> None:
    """Keep XLA from fusing this module's backward with others (bounds gradient buffers)."""
    from .xla_model import optimization_barrier_

    def barrier(module: nn.Module, grad_input: Any, grad_output: Any) -> None:
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        grads += [g for g in grad_input if isinstance(g, torch.Tensor)]
        optimization_barrier_(grads)

    m.register_full_backward_hook(barrier)


def _fsdp_spec(t: torch.Tensor, extra_data_axis: str | None = None, maximal: bool = False) -> tuple:
    """torch_xla's FSDPv2 partition spec: dim 0 (or the largest dim, `maximal`) over 'fsdp' (with
    `extra_data_axis` before it); the rest replicated. An uneven split is padded by XLA."""
    if t.dim() == 0:
        return ()
    spec: list[Any] = [None] * t.dim()
    index = list(t.shape).index(max(t.shape)) if maximal else 0
    spec[index] = (extra_data_axis, "fsdp") if extra_data_axis else "fsdp"
    return tuple(spec)


def _shard_first_output(output: Any, mesh: xs.Mesh, extra_data_axis: str | None) -> None:
    """FSDPv2's default `shard_output`: the output's batch dim over 'fsdp' (a tuple: its first
    element)."""
    real = None
    if isinstance(output, torch.Tensor):
        real = output
    elif isinstance(output, tuple):
        real = output[0] if output and isinstance(output[0], torch.Tensor) else None
        warnings.warn(
            "The output is a tuple, but only the first element is sharded. If this is not "
            "intended, please provide your own shard_output callable.",
            stacklevel=3,
        )
    if real is None:
        raise RuntimeError(
            f"The output type is not supported: {type(output)}. Please provide your own "
            "shard_output callable."
        )
    xs.mark_sharding(real, mesh, _fsdp_spec(real, extra_data_axis))


class SpmdFullyShardedDataParallel(nn.Module):
    """FSDP through SPMD (torch_xla's FSDPv2): parameters sharded over the mesh's 'fsdp' axis.

    Each parameter not already sharded gets its largest dim split over 'fsdp'; the forward's
    output gets its batch dim split over 'fsdp' (`shard_output`), which makes XLA gather each
    weight where it is used and reduce-scatter its gradient: FSDP's algorithm, by the compiler.

    Args:
        module: the model; moved to the lazyxla device if it is not there.
        mesh: a mesh with an 'fsdp' axis (default: the global mesh).
        shard_output: `f(output, mesh)` annotating the output; default: the output (or the first
            element of a tuple) sharded over 'fsdp' on dim 0.
        auto_wrap_policy: a `torch_xla.distributed.fsdp.wrap` policy: the submodules it selects
            (e.g. each decoder layer) are wrapped first, each its own FSDPv2 (their parameters
            are sharded the same way; each gets its output sharded and its backward barrier).
        auto_wrapper_callable: what wraps those submodules, called as `f(module, mesh=...,
            shard_output=...)` (default: this class).
        extra_data_axis: a second data-parallel mesh axis, sharded together with 'fsdp'.

    Attributes the wrapper does not have are looked up on the wrapped module (`model.layers`),
    and indexing reaches it too (`model[0]` for an `nn.Sequential`).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        mesh: xs.Mesh | None = None,
        shard_output: Callable[[Any, xs.Mesh], None] | None = None,
        auto_wrap_policy: Callable[..., bool] | None = None,
        auto_wrapper_callable: Callable[..., nn.Module] | None = None,
        extra_data_axis: str | None = None,
    ) -> None:
        if isinstance(module, SpmdFullyShardedDataParallel):
            raise RuntimeError(
                "Cannot wrap a module that is already wrapped with FSDP. For nested FSDP, first "
                "wrap the inner child modules before wrapping the outer parent module."
            )
        forward = getattr(type(module), "forward", None)
        if forward is None or forward is nn.Module.forward:
            raise RuntimeError(
                f"SpmdFullyShardedDataParallel wraps modules that define `forward`; "
                f"{type(module).__name__} does not (do not wrap nn.ModuleList or nn.ModuleDict: "
                "wrap the module that calls them)"
            )
        if mesh is None:
            mesh = xs.get_global_mesh()
            if mesh is None:
                raise ValueError(
                    "No mesh is provided and no global mesh is set. Please provide a mesh."
                )
        if mesh.axis_names is None or "fsdp" not in mesh.axis_names:
            raise ValueError(f"The mesh must have an axis named 'fsdp'; it has {mesh.axis_names}.")
        if extra_data_axis and extra_data_axis not in mesh.axis_names:
            raise ValueError(f"The provided {extra_data_axis} axis is not in the mesh.")
        super().__init__()
        if auto_wrap_policy is not None:
            from .fsdp_wrap import recursive_wrap

            for name, m in module.named_modules():
                if isinstance(m, SpmdFullyShardedDataParallel):
                    raise ValueError(
                        f"Expected {name} to NOT be SpmdFullyShardedDataParallel if using an "
                        "`auto_wrap_policy`"
                    )
            wrapper_cls = auto_wrapper_callable or SpmdFullyShardedDataParallel

            def wrap(m: nn.Module) -> nn.Module:
                return wrapper_cls(m, mesh=mesh, shard_output=shard_output)

            recursive_wrap(module, auto_wrap_policy, wrap, only_wrap_children=True)

        from .tensor import DEVICE_TYPE

        if any(p.device.type != DEVICE_TYPE for p in module.parameters()):
            from .api import device

            module = module.to(device())
        self._orig_module = module
        self._mesh = mesh
        # Parameters already sharded (by an inner wrapper, or by the user) keep their sharding.
        for p in module.parameters():
            if not xs.sharding_spec(p):
                xs.mark_sharding(p, mesh, _fsdp_spec(p, maximal=True))
        apply_backward_optimization_barrier(module)
        if shard_output is None:

            def shard_output(output: Any, mesh: xs.Mesh) -> None:
                _shard_first_output(output, mesh, extra_data_axis)

        self._shard_output = shard_output

    @property
    def module(self) -> nn.Module:
        """The wrapped module (as DDP's `.module`)."""
        return self._orig_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        output = self.module(*args, **kwargs)
        self._shard_output(output, self._mesh)
        return output

    def __getattr__(self, name: str) -> Any:
        """Attributes the wrapper lacks come from the wrapped module (`model.layers`)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)

    def __getitem__(self, key: Any) -> nn.Module:
        """Indexing reaches the wrapped module (an `nn.Sequential`)."""
        return self.module.__getitem__(key)


# --- pictures ------------------------------------------------------------------------------------


def visualize_tensor_sharding(t: torch.Tensor, **kwargs: Any) -> Any:
    """Print which devices hold which tile of `t`: `visualize_sharding` of its sharding spec.

    Args:
        t: a lazyxla tensor or XLAShardedTensor.
        **kwargs: passed to `visualize_sharding` (use_color, scale, min_width, max_width).

    Returns:
        The rich table, as torch_xla returns it.
    """
    return visualize_sharding(xs.sharding_spec(xs.unwrap(t)), **kwargs)


def _tiles_of(sharding: str) -> tuple[int, int, dict[tuple[int, int], Any]]:
    """(rows, cols, {(row, col): device id, or the list of ids holding that tile}) of a torch_xla
    sharding string, as torch_xla's visualizer reads it: a replicated tensor is one tile held by
    every device; a 1-D tiling is one row."""
    from . import runtime

    if sharding in ("{replicated}", ""):
        return 1, 1, {(0, 0): list(range(len(runtime.jax_devices())))}
    parsed = xs.parse_v1(sharding)
    if parsed is None:
        raise ValueError(
            f"not a torch_xla V1 sharding string: {sharding!r} (expected e.g. "
            "'{devices=[2,4]0,1,2,3,4,5,6,7}' or '{replicated}')"
        )
    dims, devs, group = parsed
    if len(dims) == 1:
        dims = [1, dims[0]]
    if len(dims) != 2:
        raise ValueError(f"visualize_sharding shows 1-D and 2-D tilings, got {sharding}")
    rows, cols = dims
    partial = "last_tile_dim_replicate" in sharding
    tiles: dict[tuple[int, int], Any] = {}
    for k in range(len(devs) // group):
        held = devs[k * group : (k + 1) * group]
        tiles[k // cols, k % cols] = held if partial else held[0]
    return rows, cols, tiles


def visualize_sharding(
    sharding: str,
    use_color: bool = True,
    scale: float = 1.0,
    min_width: int = 9,
    max_width: int = 80,
) -> Any:
    """Print a torch_xla sharding string as a rich table of tiles, each naming the devices that
    hold it, rendered as torch_xla renders it (`CPU 3` for a tile held by one device,
    `CPU [0, 1]` for a replicated or partially replicated tile).

    Args:
        sharding: a torch_xla V1 sharding string (`Mesh.get_op_sharding`, `sharding_spec`).
        use_color: draw without lines when the console has colors (torch_xla's rule).
        scale, min_width: accepted for torch_xla's signature (its cells do not use them).
        max_width: the console width.

    Returns:
        The rich table.

    Example:
        >>> visualize_sharding("{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}")
    """
    import rich.align
    import rich.box
    import rich.console
    import rich.padding
    import rich.style
    import rich.table

    from .runtime_api import device_type

    print(f"Visualizing {sharding} (showing up to the first two dimensions)")
    rows, cols, tiles = _tiles_of(sharding)
    console = rich.console.Console(width=max_width)
    lines = not (use_color and console.color_system is not None)
    table = rich.table.Table(
        show_header=False,
        show_lines=lines,
        padding=0,
        highlight=lines,
        pad_edge=False,
        box=rich.box.SQUARE if lines else None,
    )
    style = rich.style.Style(bgcolor=None, color=None)
    kind = device_type()
    for r in range(rows):
        cells = [
            rich.padding.Padding(
                rich.align.Align(f"{kind} {tiles[r, c]}", "center", vertical="middle"),
                (1, 1, 1, 1),
                style=style,
            )
            for c in range(cols)
        ]
        table.add_row(*cells)
    console.print(table, end="\n\n")
    return table
