"""One process of a job started by hand (test_faults.py): joins, all-reduces, prints the sum."""

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr

t = torch.ones(3, device=torch_xla.device()) * (xr.global_ordinal() + 2)
print("sum", xm.all_reduce(xm.REDUCE_SUM, t).cpu().tolist(), "world", xr.world_size(), flush=True)

# host-side collectives through torch.distributed's gloo backend, rendezvous over xla://
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo", init_method="xla://")
ranks = [None] * dist.get_world_size()
dist.all_gather_object(ranks, dist.get_rank())
print("gloo", ranks, flush=True)
