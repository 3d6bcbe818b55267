"""Data-parallel training on N launched processes against eager on the global batch (run by
test_data_parallel.py).

`python progs_train.py MODES OUT_DIR` under `CPU_NUM_DEVICES=N`, MODES comma-separated, run one
after the other in the same processes (one launch: each costs seconds of imports and joining).
MODE `optimizer_step`: each
process computes its shard of the batch and `xm.optimizer_step` all-reduces the gradients; MODE
`ddp`: `DistributedDataParallel` over `dist.init_process_group("xla", init_method="xla://")`;
MODE `zero1`: torch_xla's ZeRO-1 over AdamW (eager: AdamW after `clip_grad_norm_`); MODE `fsdp`
(`fsdp_wrap`): FSDP v1 over the whole model (each Linear its own unit, by a wrap policy).
Each process also trains the same model with eager PyTorch on the CPU on the whole batch, and
raises if a step's global loss or the final parameters differ by more than 1e-5 relative.
"""

import functools
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.runtime as xr
from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP
from torch_xla.distributed.fsdp import consolidate_sharded_model_checkpoints
from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch_xla.distributed.zero_redundancy_optimizer import ZeroRedundancyOptimizer

BATCH, STEPS = 8, 5


def model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(STEPS, BATCH, 8, generator=g)
    ys = torch.randn(STEPS, BATCH, 4, generator=g)
    return model, xs, ys


def make_optimizer(mode, params):
    if mode == "zero1":
        return ZeroRedundancyOptimizer(params, torch.optim.AdamW, lr=0.05, max_norm=0.5)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def eager_losses(mode):
    model, xs, ys = model_and_data()
    if mode == "zero1":  # ZeRO-1 clips by the global gradient norm (torch_xla's default)
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in zip(xs, ys):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if mode == "zero1":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def _mp_fn(index, modes, out_dir):
    for mode in modes.split(","):
        try:
            train(mode, out_dir)
        except Exception as e:
            e.add_note(f"in mode {mode!r}")
            raise


def train(mode, out_dir):
    n, rank = xr.world_size(), xr.global_ordinal()
    dev = torch_xla.device()
    model, xs, ys = model_and_data()
    model = model.to(dev)
    if mode in ("fsdp", "fsdp_wrap"):
        policy = None
        if mode == "fsdp_wrap":  # each Linear its own unit, the root holds the rest
            policy = functools.partial(
                transformer_auto_wrap_policy, transformer_layer_cls={nn.Linear}
            )
        model = FSDP(model, auto_wrap_policy=policy)
    if mode == "ddp":
        if not dist.is_initialized():
            dist.init_process_group("xla", init_method="xla://")
        assert dist.get_world_size() == n and dist.get_rank() == rank
        model = nn.parallel.DistributedDataParallel(
            model, broadcast_buffers=False, gradient_as_bucket_view=True
        )
    opt = make_optimizer(mode, model.parameters())
    shard = slice(rank * BATCH // n, (rank + 1) * BATCH // n)
    losses, per_step = [], [met.counter_value("UncachedCompile")]
    for x, y in zip(xs, ys):
        x, y = x[shard].to(dev), y[shard].to(dev)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if mode in ("ddp", "zero1", "fsdp", "fsdp_wrap"):
            opt.step()
        else:
            xm.optimizer_step(opt)
        global_loss = xm.all_reduce(xm.REDUCE_SUM, loss.detach(), scale=1.0 / n)
        xm.mark_step()
        losses.append(global_loss.item())
        per_step.append(met.counter_value("UncachedCompile"))
    want, want_params = eager_losses(mode)
    for step, (a, b) in enumerate(zip(losses, want)):
        if abs(a - b) > 1e-5 * abs(b):
            raise AssertionError(f"rank {rank} step {step}: loss {a} vs eager {b}")
    if mode.startswith("fsdp"):  # each rank saves its shards; the checkpoints are consolidated
        ckpt = {"model": model.state_dict(), "shard_metadata": model.get_shard_metadata()}
        prefix = os.path.join(out_dir, f"{mode}_ckpt")
        xm.save(ckpt, f"{prefix}_rank{rank}.pth", master_only=False)
        full, _ = consolidate_sharded_model_checkpoints(prefix, "_rank*.pth", save_model=False)
        assert list(full) == list(want_params), (list(full), list(want_params))
        params = list(full.values())
    else:
        params = [p.detach().cpu() for p in model.parameters()]
    want_params = list(want_params.values())
    for p, q in zip(params, want_params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    with open(os.path.join(out_dir, f"{mode}.rank{rank}.json"), "w") as f:
        json.dump({"losses": losses, "compiles": per_step}, f)


if __name__ == "__main__":
    torch_xla.launch(_mp_fn, args=(sys.argv[1], sys.argv[2]))
