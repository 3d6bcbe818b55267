"""Cross-process collectives on 2 and 4 processes, each against NumPy (Note [Cross-process
collectives]); the processes are started by `torch_xla.launch` under `lazyxla run`."""

import json

import pytest
from mp_util import run_launch


@pytest.mark.parametrize("n", [2, 4])
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


def test_send_and_recv_between_two_of_three_processes(tmp_path):
    run_launch("progs_p2p.py", 3, [])


def test_collectives_inside_torch_compile_chain_with_recorded_ones():
    run_launch("progs_compiled.py", 2, [])
