"""Helpers to run the same code on eager CPU and on lazyxla and compare the results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import lazyxla

DEV = lazyxla.device()


def to_lazy(t: Any) -> Any:
    """A lazy copy of a CPU tensor (leaf, same requires_grad), recursing into lists/tuples.

    The CPU tensor is cloned first: the device buffer must never alias a tensor the test keeps using
    (see test_upload_does_not_alias_host in tests/test_views.py).
    """
    if isinstance(t, torch.Tensor):
        out = t.detach().clone().to(DEV)
        return out.requires_grad_(t.requires_grad)
    if isinstance(t, (list, tuple)):
        return type(t)(to_lazy(x) for x in t)
    return t


def to_cpu(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return t.detach().cpu() if t.device.type != "cpu" else t.detach()
    if isinstance(t, (list, tuple)):
        return type(t)(to_cpu(x) for x in t)
    if isinstance(t, dict):
        return {k: to_cpu(v) for k, v in t.items()}
    return t


def leaf(t: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    return t.detach().clone().requires_grad_(requires_grad)


def assert_same(actual: Any, expected: Any, exact: bool = False, **kw: Any) -> None:
    """Compare a (structure of) lazy results with eager ones; dtypes and shapes must match."""
    if exact:
        kw.setdefault("rtol", 0)
        kw.setdefault("atol", 0)
    torch.testing.assert_close(to_cpu(actual), to_cpu(expected), equal_nan=True, **kw)


def _flat_tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat_tensors(o)]
    return []


def check(
    fn: Callable[..., Any],
    *inputs: Any,
    grad: bool = True,
    exact: bool = False,
    seed: int = 0,
    **tol: Any,
) -> tuple[Any, Any]:
    """Run `fn` on CPU inputs and on lazy copies; compare outputs and, if `grad`, input gradients.

    Gradients are taken with respect to every floating input that requires grad, for a fixed random
    cotangent on every floating output.
    """
    cpu_in = [leaf(x, x.requires_grad) if isinstance(x, torch.Tensor) else x for x in inputs]
    lz_in = [to_lazy(x) for x in cpu_in]
    out_c = fn(*cpu_in)
    out_l = fn(*lz_in)
    assert_same(out_l, out_c, exact=exact, **tol)
    if not grad:
        return out_l, out_c
    wrt_c = [x for x in cpu_in if isinstance(x, torch.Tensor) and x.requires_grad]
    wrt_l = [x for x in lz_in if isinstance(x, torch.Tensor) and x.requires_grad]
    outs_c = [o for o in _flat_tensors(out_c) if o.requires_grad]
    outs_l = [o for o in _flat_tensors(out_l) if o.requires_grad]
    assert wrt_c and outs_c, "nothing to differentiate"
    g = torch.Generator().manual_seed(seed)
    cot = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs_c]
    grads_c = torch.autograd.grad(outs_c, wrt_c, cot, allow_unused=True)
    grads_l = torch.autograd.grad(outs_l, wrt_l, [c.to(DEV) for c in cot], allow_unused=True)
    for gl, gc in zip(grads_l, grads_c):
        assert (gl is None) == (gc is None)
        if gc is not None:
            assert gl.device.type == DEV.type
            assert_same(gl, gc, exact=exact, **tol)
    return out_l, out_c


# The sizes of the tests' transformers Llama-style decoders (test_hf_models' Llama and Mixtral,
# test_generate's Llama): 2 layers, grouped-query attention; the vocabulary is each file's own.
TINY_DECODER = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    attention_dropout=0.0,
)
