"""torch_xla.experimental.assume_pure: trace a pure function once per input signature.

torch_xla converts the function to JAX (through torchax) and replays the JAX computation. lazyxla
gets the same effect from its trace-once path (Note [Trace once]): the function runs under
`torch.compile(backend="lazyxla")`, so its Python is traced once per guard set (input shapes,
dtypes, non-tensor arguments) and each later call splices the cached graph (forward and, through
AOTAutograd, backward) into the lazy IR without running the Python again. Purity is the caller's
promise, as in torch_xla: side effects of the Python body happen only while tracing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._dynamo.utils import counters as _dynamo_counters

from . import random_state


def assume_pure(
    fn: Callable[..., Any], *, add_rng_seed_argument: bool = False
) -> Callable[..., Any]:
    """`fn`, traced once per input signature and replayed (see the module docstring).

    `add_rng_seed_argument=True`: the returned function takes a keyword `rng_seed` (an int, or a
    0-d integer tensor, whose value is read), and its random ops draw from that seed alone, as
    torch_xla's do: the same seed gives the same numbers, on the tracing call and on replays.
    """
    compiled = torch.compile(fn, backend="lazyxla", options={"sync": False})
    if not add_rng_seed_argument:
        return functools.wraps(fn)(compiled)

    @functools.wraps(fn)
    def seeded(*args: Any, **kwargs: Any) -> Any:
        # torch_xla asserts (AssertionError) on a missing seed; the message says how to call it.
        assert "rng_seed" in kwargs and kwargs["rng_seed"] is not None, (
            f"Missing keyword argument rng_seed: {getattr(fn, '__name__', fn)} was made with "
            "assume_pure(add_rng_seed_argument=True); call it as f(..., rng_seed=<int>)"
        )
        seed = kwargs.pop("rng_seed")
        if isinstance(seed, torch.Tensor):
            if seed.numel() != 1 or seed.is_floating_point() or seed.is_complex():
                raise TypeError(
                    f"assume_pure: rng_seed must be an int or a one-element integer tensor, got a "
                    f"{seed.dtype} tensor of shape {tuple(seed.shape)}"
                )
            seed = int(seed.item())
        elif not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"assume_pure: rng_seed must be an int, got {type(seed).__name__}")
        # Each random op takes (seed, counter) from the device RNG when it is recorded or replayed
        # (random_state.py): run from (rng_seed, 0), then give the caller's stream back.
        # A call that traces draws (seed, counter) pairs for the trace and again for its run, so
        # its numbers would differ from the replays': it is run once more, as a replay, from
        # (rng_seed, 0) (its first outputs are never used, so never computed).
        saved = random_state.get_state()
        try:
            traced = _dynamo_counters["stats"]["unique_graphs"]
            random_state.set_state(seed, 0)
            out = compiled(*args, **kwargs)
            if _dynamo_counters["stats"]["unique_graphs"] != traced:
                random_state.set_state(seed, 0)
                out = compiled(*args, **kwargs)
            return out
        finally:
            random_state.set_state(*saved)

    return seeded


# torch_xla's cache of traced computations; lazyxla's traces live in dynamo's cache and in the
# compile cache, so this stays empty (tests clear it between cases).
_XLA_COMPUTATION_CACHE: dict[Any, Any] = {}


def assume_pure_torch(fn: Callable[..., Any], use_cache: bool = False) -> Callable[..., Any]:
    """torch_xla's torch-only variant of `assume_pure` (`use_cache`: trace once); here the same
    trace-once function."""
    return assume_pure(fn)


def _pure_forward(module: nn.Module, params: Any, buffers: Any, args: Any, kwargs: Any) -> Any:
    return torch.func.functional_call(module, (params, buffers), args, kwargs)


class PureModule(nn.Module):
    """A module whose forward pass is pure: traced once, replayed (forward and backward)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._module = module
        self._pure_forward = assume_pure(functools.partial(_pure_forward, self._module))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        params = dict(self._module.named_parameters())
        buffers = dict(self._module.named_buffers())
        return self._pure_forward(params, buffers, args, kwargs)
