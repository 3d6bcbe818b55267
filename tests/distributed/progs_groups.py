"""Collectives over process subgroups of the `xla` backend (run by test_collectives.py).

`python progs_groups.py` under `CPU_NUM_DEVICES=4`, or `main` called by progs_collectives.py in
its 4 processes: every process makes the row groups [0, 1], [2, 3] and the column groups [0, 2],
[1, 3] of a 2x2 mesh (`pg_options` asks torch_xla's inference for the rest of the mesh, Note
[Process group meshes]), then all-reduces rank + 1 over its row and over its column: each sum
must be over its group only, as in eager torch.distributed.
"""

import torch
import torch.distributed as dist
import torch_xla
import torch_xla.runtime as xr

SPMD = {"xla_pg_options": {"spmd": True}}


def main(index: int) -> None:
    dist.init_process_group("xla", init_method="xla://")
    rank, dev = xr.global_ordinal(), torch_xla.device()
    rows = [dist.new_group([0, 1], pg_options=SPMD), dist.new_group([2, 3], pg_options=SPMD)]
    cols = [dist.new_group([0, 2], pg_options=SPMD), dist.new_group([1, 3], pg_options=SPMD)]
    row, col = rows[rank // 2], cols[rank % 2]  # (a group without this rank is not a group here)
    assert row._mesh == [[0, 1], [2, 3]] and col._mesh == [[0, 2], [1, 3]], (row._mesh, col._mesh)
    t = torch.full((3,), float(rank + 1), device=dev)
    dist.all_reduce(t, group=row)
    expected_row = sum(r + 1 for r in ([0, 1] if rank < 2 else [2, 3]))
    assert t.cpu().tolist() == [expected_row] * 3, (rank, t.cpu())
    u = torch.full((3,), float(rank + 1), device=dev)
    dist.all_reduce(u, group=col)
    expected_col = sum(r + 1 for r in ([0, 2] if rank % 2 == 0 else [1, 3]))
    assert u.cpu().tolist() == [expected_col] * 3, (rank, u.cpu())
    dist.destroy_process_group()


if __name__ == "__main__":
    torch_xla.launch(main)
