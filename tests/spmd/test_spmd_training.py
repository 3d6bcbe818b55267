"""The seed notebook's 2-D sharding plan on a (4, 2) fsdp x tensor mesh trains like eager CPU."""

import copy

import numpy as np
import torch

import lazyxla
import lazyxla.debug.metrics as met
import lazyxla.distributed.spmd as xs
from lazyxla.models import Decoder, DecoderConfig, seed_partition_spec

dev = lazyxla.device()


def test_seed_plan_trains_like_eager():
    cfg = DecoderConfig(
        vocab_size=64,
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=128,
        max_seq_len=16,
        tie_embeddings=False,
    )
    torch.manual_seed(0)
    ref = Decoder(cfg)
    model = copy.deepcopy(ref).to(dev)
    mesh = xs.Mesh(np.arange(8), (4, 2), ("fsdp", "tensor"))
    specs = {}
    for name, p in model.named_parameters():
        spec = seed_partition_spec(name)
        if spec is not None:
            xs.mark_sharding(p, mesh, spec)
            specs[name] = lazyxla.debug.sharding_spec(p)
    assert specs["embed.weight"] == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    assert specs["blocks.0.attn.q_proj.weight"] == "{devices=[2,4]0,2,4,6,1,3,5,7}"
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    met.clear_all()
    for step in range(10):
        tokens = torch.randint(0, cfg.vocab_size, (8, 16), generator=gen)
        targets = torch.roll(tokens, -1, dims=1)
        loss_ref = ref.loss(tokens, targets)
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        t, y = tokens.to(dev), targets.to(dev)
        xs.mark_sharding(t, mesh, ("fsdp", None))
        xs.mark_sharding(y, mesh, ("fsdp", None))
        loss = model.loss(t, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
        assert abs(loss.item() - loss_ref.item()) <= 1e-5 * abs(loss_ref.item()), step
        for name, p in model.named_parameters():
            if name in specs:
                assert lazyxla.debug.sharding_spec(p) == specs[name], (step, name)
    for (name, p_ref), p in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(p.cpu(), p_ref.detach(), rtol=1e-5, atol=1e-5, msg=name)
    assert met.counter_value("UncachedCompile") <= 2
