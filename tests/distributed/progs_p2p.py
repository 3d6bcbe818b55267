"""Point-to-point transfers over the `xla` process group (run by test_collectives.py).

`python progs_p2p.py` under `CPU_NUM_DEVICES=3`: `torch_xla.launch` starts 3 processes; process 0
sends a float32 tensor to process 2 while process 1 takes no part, then process 2 sends a
bfloat16 tensor (computed lazily, still pending) to process 1. The received values are compared
with what was sent, exactly; a second round with new values compiles nothing new.
"""

import torch
import torch.distributed as dist
import torch_xla
import torch_xla.debug.metrics as met
import torch_xla.runtime as xr


def sent(step: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    return torch.randint(-8, 8, (5, 3), generator=g).to(dtype)


def main(index: int) -> None:
    dist.init_process_group("xla", init_method="xla://")
    rank, dev = xr.global_ordinal(), torch_xla.device()
    compiles = []
    for step in range(2):
        a, b = sent(step, torch.float32), sent(100 + step, torch.bfloat16)
        if rank == 0:
            dist.send(a.to(dev) * 1, dst=2)
        elif rank == 2:
            got = torch.zeros(5, 3, device=dev)
            dist.recv(got, src=0)
            assert torch.equal(got.cpu(), a), (got.cpu(), a)
            dist.send(b.to(dev) + 0, dst=1)  # pending until sent
        else:
            got = torch.zeros(5, 3, dtype=torch.bfloat16, device=dev)
            dist.recv(got, src=2)
            assert torch.equal(got.cpu(), b), (got.cpu(), b)
        compiles.append(met.counter_value("UncachedCompile") or 0)
    assert compiles[1] == compiles[0], compiles  # new data: nothing compiled again
    dist.destroy_process_group()


if __name__ == "__main__":
    torch_xla.launch(main)
