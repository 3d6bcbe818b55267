"""FSDPv2 (`SpmdFullyShardedDataParallel`) as torch_xla's: attribute forwarding, auto-wrapping,
`shard_output`, and training equal to eager on 8 virtual devices."""

import copy
import functools

import numpy as np
import pytest
import torch
from torch import nn

import lazyxla
import lazyxla.debug.metrics as met
import lazyxla.distributed.spmd as xs
from lazyxla.distributed.fsdp.wrap import transformer_auto_wrap_policy
from lazyxla.experimental.spmd_fully_sharded_data_parallel import (
    SpmdFullyShardedDataParallel as FSDPv2,
)

dev = lazyxla.device()


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 40)
        self.down = nn.Linear(40, 16)

    def forward(self, h):
        return h + self.down(torch.tanh(self.up(h)))


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(24, 16)
        self.layers = nn.ModuleList(_Layer() for _ in range(2))
        self.head = nn.Linear(16, 24)

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def _mesh():
    return xs.Mesh(np.arange(8), (8, 1), ("fsdp", "model"))


def _policy():
    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={_Layer})


def _batches(n=4):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randint(0, 24, (16, 6), generator=g), torch.randint(0, 24, (16, 6), generator=g))
        for _ in range(n)
    ]


def _train(model, batches, place):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for ids, target in batches:
        ids, target = place(ids), place(target)
        logits = model(ids)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).double(), target.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        if ids.device.type == dev.type:
            lazyxla.sync()
        losses.append(loss.item())
    return losses


def test_auto_wrap_trains_like_eager_and_forwards_attributes():
    torch.manual_seed(0)
    ref = _Model()
    model = FSDPv2(copy.deepcopy(ref), mesh=_mesh(), auto_wrap_policy=_policy())
    # Each decoder layer is its own FSDPv2; the root's attributes reach the wrapped module.
    assert all(isinstance(layer, FSDPv2) for layer in model.layers)
    assert isinstance(model.layers[0].up, nn.Linear)  # through two wrappers
    assert model.head is model.module.head
    assert next(model.parameters()).device.type == dev.type  # moved to the device by the wrapper
    # Largest dim over 'fsdp', as torch_xla (embedding [24, 16]: dim 0; up.weight [40, 16]: dim 0).
    assert lazyxla.debug.sharding_spec(model.embed.weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert (
        lazyxla.debug.sharding_spec(model.layers[1].down.weight) == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    )
    batches = _batches()
    ref_losses = _train(ref, batches, lambda t: t)
    met.clear_all()
    losses = _train(model, batches, lambda t: t.to(dev))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert met.counter_value("UncachedCompile") <= 2
    assert (
        lazyxla.debug.sharding_spec(model.layers[1].down.weight) == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    )


def test_shard_output_and_indexing():
    seen = []

    def shard_output(output, mesh):
        seen.append(mesh)
        xs.mark_sharding(output, mesh, (None, "fsdp"))

    mesh = _mesh()
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU()).to(dev)
    model = FSDPv2(seq, mesh=mesh, shard_output=shard_output)
    assert model[0] is seq[0]
    out = model(torch.randn(4, 8, device=dev))
    assert seen == [mesh]
    assert lazyxla.debug.sharding_spec(out) == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    # The default shards dim 0 of a tensor output, or of a tuple's first element (with a warning).
    tupled = FSDPv2(_TupleOut().to(dev), mesh=mesh)
    with pytest.warns(UserWarning, match="only the first element is sharded"):
        first, _ = tupled(torch.randn(8, 8, device=dev))
    assert lazyxla.debug.sharding_spec(first) == "{devices=[8,1]0,1,2,3,4,5,6,7}"


class _TupleOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y, y.sum()


class _DictOut(_TupleOut):
    def forward(self, x):
        return {"y": self.lin(x)}


def test_errors_say_what_to_do():
    mesh = _mesh()
    with pytest.raises(ValueError, match="axis named 'fsdp'"):
        FSDPv2(_TupleOut(), mesh=xs.Mesh(np.arange(8), (8,), ("data",)))
    with pytest.raises(ValueError, match="ddp axis is not in the mesh"):
        FSDPv2(_TupleOut(), mesh=mesh, extra_data_axis="ddp")
    with pytest.raises(RuntimeError, match="define `forward`"):
        FSDPv2(nn.ModuleList([nn.Linear(2, 2)]), mesh=mesh)
    wrapped = FSDPv2(_TupleOut(), mesh=mesh)
    with pytest.raises(RuntimeError, match="already wrapped"):
        FSDPv2(wrapped, mesh=mesh)
    with pytest.raises(RuntimeError, match="provide your own shard_output"):
        FSDPv2(_DictOut(), mesh=mesh)(torch.randn(8, 8, device=dev))
    inner = _Model()
    inner.layers[0] = FSDPv2(inner.layers[0], mesh=mesh)
    with pytest.raises(ValueError, match="NOT be SpmdFullyShardedDataParallel"):
        FSDPv2(inner, mesh=mesh, auto_wrap_policy=_policy())
