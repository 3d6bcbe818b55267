"""Activation checkpointing on lazy tensors (Note [Checkpointing]): torch.utils.checkpoint and
torch_xla.utils.checkpoint, both `use_reentrant` modes and the matmul-saving policy, against
eager; the recomputation sits behind an optimization barrier; XLA's memory analysis shows the cut.
"""

import copy
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as tuc

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla.utils.checkpoint import checkpoint as xla_checkpoint
from lazyxla.utils.checkpoint import save_matmuls_context_fn

# The decoder stack and its measurement, shared with bench/large_models.py.
BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
from _checkpoint_decoder import Block, run  # noqa: E402

dev = lazyxla.device()

# torch's and torch_xla's entry points share the implementations: each mode once, across both
# (torch_nonreentrant and xla_reentrant run in the tests below).
MODES = ["torch_reentrant", "xla_nonreentrant", "save_matmuls"]


@pytest.mark.parametrize("mode", MODES)
def test_gradients_equal_eager(mode):
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(16, 2) for _ in range(2))
    x = torch.randn(2, 12, 16, requires_grad=True)
    ref = copy.deepcopy(blocks).double()
    xr = x.detach().double().requires_grad_()
    run(ref, xr, "none").square().mean().backward()
    lazy = copy.deepcopy(blocks).to(dev)
    xl = x.detach().to(dev).requires_grad_()
    met.clear_all()
    loss = run(lazy, xl, mode).square().mean()
    loss.backward()
    assert "xla::optimization_barrier" in lazyxla.debug.ir_text([xl.grad])
    for p, r in zip(lazy.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu().double(), r.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(xl.grad.cpu().double(), xr.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("reentrant", [True, False])
def test_dropout_recomputes_the_same_mask(reentrant):
    """The device RNG is restored for the recomputation: with dropout, checkpointed gradients
    equal the unchecked ones under the same seed."""
    torch.manual_seed(0)
    blk = Block(16, 2, p=0.5).to(dev)
    x = torch.randn(2, 8, 16).to(dev).requires_grad_()
    grads = []
    for ck in (False, True):
        lazyxla.manual_seed(7)
        blk.zero_grad()
        out = tuc.checkpoint(blk, x, use_reentrant=reentrant) if ck else blk(x)
        out.sum().backward()
        grads.append([p.grad.cpu().clone() for p in blk.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_compiles_once_across_steps():
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(16, 2) for _ in range(2)).to(dev)
    for step in range(3):
        if step == 1:  # the first step creates the .grad tensors; the next ones accumulate
            met.clear_all()
        x = torch.randn(2, 8, 16).to(dev).requires_grad_()
        run(blocks, x, "xla_reentrant").sum().backward()
        lazyxla.sync()
    assert met.counter_value("UncachedCompile") == 1
    assert met.counter_value("CachedCompile") == 1


def test_clear_errors():
    blk = nn.Linear(4, 4).to(dev)
    x = torch.randn(2, 4).to(dev)
    with pytest.raises(ValueError, match="context_fn .* needs use_reentrant=False"):
        xla_checkpoint(blk, x, context_fn=save_matmuls_context_fn)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: foo"):
        xla_checkpoint(blk, x, foo=1)


def test_checkpointing_halves_temp_memory():
    """XLA's memory analysis of an 8-layer decoder's training step: checkpointing every layer
    needs at most half the temp bytes (bench/large_models.py has the figures).

    XLA:CPU's default concurrency-optimized scheduler runs recomputation as early as its inputs
    allow, which keeps it alive as long as the forward's activations; the memory-minimizing
    scheduler (`--xla_cpu_enable_concurrency_optimized_scheduler=false`, read when the CPU client
    starts, hence the subprocess) is the one that gives checkpointing its effect on CPU.
    """
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=false",
        "CPU_NUM_DEVICES": "1",
    }
    args = ["--layers", "8", "--d", "64", "--seq", "128", "--modes", "none", "torch_nonreentrant"]
    out = subprocess.run(
        [sys.executable, str(BENCH / "_checkpoint_decoder.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    temp = json.loads(out.stdout.strip().splitlines()[-1])["temp"]
    assert temp["none"] >= 2 * temp["torch_nonreentrant"], temp
