"""torch_xla's `torch_xla._dynamo.dynamo_backend2`: the FX graph as one JAX function, called lazily.

torch_xla's second dynamo backend lowers each AOTAutograd graph to a JAX function (through
torchax) and calls it with `xla_builder.JaxCallable`: one call op in the lazy graph, with a fresh
RNG key per call and no sync. lazyxla's trace-once graphs already are that (Note [Trace once]):
the FX graph is traced once into a pure JAX program, and each call splices one
`xla::dynamo_graph` node into the lazy IR, with fresh random seeds, left pending (`sync=False`)
so it fuses with what follows until the next sync.

Example:
    >>> from torch_xla._dynamo import dynamo_backend2
    >>> f = torch.compile(fn, backend=dynamo_backend2.dynamo_backend)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._src.dynamo import CompiledGraph


def _dynamo_backend(model: torch.fx.GraphModule, sample_args: Sequence[Any]) -> Callable:
    """Compile one FX graph: a boxed callable that records it as one lazy node per call.

    Args:
        model: the graph to compile (AOTAutograd's forward or backward graph).
        sample_args: example inputs; `model(*sample_args)` computes the outputs.

    Returns:
        A boxed function `f` (AOTAutograd's calling convention) computing what `model` does.
    """
    from functorch.compile import make_boxed_func

    compiled = CompiledGraph(model, sync=False)

    def equivalent(*args: Any) -> list:
        return compiled(*args)

    return make_boxed_func(equivalent)


def dynamo_backend(fx: torch.fx.GraphModule, args: Sequence[Any]) -> Callable:
    """A `torch.compile` backend: `torch.compile(fn, backend=dynamo_backend)`.

    AOTAutograd (`aot_function`) splits the graph into forward and backward graphs, each compiled
    by `_dynamo_backend`.
    """
    from functorch.compile import aot_function

    return aot_function(fx, fw_compiler=_dynamo_backend)


__all__ = ["dynamo_backend"]
