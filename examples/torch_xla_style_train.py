"""A torch_xla training script, written against torch_xla's API and left unmodified.

Run it on lazyxla with the `torch_xla` alias:

    lazyxla run examples/torch_xla_style_train.py --steps 8

It prints one `step N loss X` line per step (from a step closure, so reading the loss never splits
the step's graph) and torch_xla's short metrics report at the end.
"""

import argparse

import torch
import torch.nn as nn
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 8


def make_data(steps, batch_size, seed):
    """A regression problem: y = x @ w + noise, `steps` batches of `batch_size`."""
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(steps * batch_size, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(steps * batch_size, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False, drop_last=True)


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))


def make_optimizer(model, lr):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    device = torch_xla.device()
    model = make_model(args.seed).to(device)
    optimizer = make_optimizer(model, args.lr)
    loss_fn = nn.MSELoss()
    train_loader = pl.MpDeviceLoader(make_data(args.steps, args.batch_size, args.seed), device)

    @torch_xla.compile
    def train_step(x, y):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        xm.optimizer_step(optimizer)
        return loss

    def log(step, loss):
        xm.master_print(f"step {step} loss {loss.item():.8f}")

    model.train()
    for step, (x, y) in enumerate(train_loader):
        loss = train_step(x, y)
        xm.add_step_closure(log, args=(step, loss))

    xm.wait_device_ops()
    print(met.short_metrics_report())


if __name__ == "__main__":
    main()
