"""Cross-process collectives on 4 processes, each against NumPy (Note [Cross-process collectives]);
the processes are started by `torch_xla.launch` under `lazyxla run`. Four processes hold every
case two do (the full group) and the replica subgroups besides; a run of two took 11 s more. The
same processes then run progs_groups.py's process subgroups (torch.distributed's `new_group`)."""

import json

import pytest
from mp_util import run_launch


@pytest.mark.parametrize("n", [4])
def test_every_collective_matches_numpy(tmp_path, n):
    run_launch("progs_collectives.py", n, [str(tmp_path)])
    summaries = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    for r, s in enumerate(summaries):
        assert s["rank"] == s["ordinal"] == s["local_ordinal"] == r
        assert s["world_size"] == n
        assert s["master"] == (r == 0)
        assert s["checked"] >= 80 * (2 if n == 4 else 1)
        # the second step (new data, same program) compiles nothing
        assert s["compiles"][0] >= 1 and s["compiles"][1] == s["compiles"][0]
        assert s["rendezvous"] == [f"r{i}" for i in range(n)]
        assert s["mesh_reduce"] == n * (n + 1) // 2
        assert s["groups"]  # progs_groups.py ran in the same processes (its checks raise)


def test_send_and_recv_between_two_of_three_processes(tmp_path):
    run_launch("progs_p2p.py", 3, [])


def test_collectives_inside_torch_compile_chain_with_recorded_ones():
    run_launch("progs_compiled.py", 2, [])


def test_process_group_mesh_inference_as_torch_xla():
    from lazyxla._src.xla_backend import _infer_mesh

    assert _infer_mesh([4, 5, 6, 7], 12) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert _infer_mesh([1, 5, 9], 12) == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    for bad in ([4, 5, 6], [0, 1, 2, 3, 4], [7, 8, 9, 10], [1, 5], [4, 7, 10], [1, 5, 10]):
        with pytest.raises(ValueError):
            _infer_mesh(bad, 12)
