"""Data-parallel training over launched processes equals eager on the global batch."""

import json

import pytest
from mp_util import run_launch


@pytest.mark.parametrize(
    "mode,n",
    [
        ("optimizer_step", 2),
        # (4 processes: the all-reduce over more than two ranks is test_collectives' [4] case)
        pytest.param("optimizer_step", 4, marks=pytest.mark.slow),
        ("ddp", 2),
        ("zero1", 2),
        ("fsdp", 2),
        ("fsdp_wrap", 2),
    ],
)
def test_training_equals_eager_on_the_global_batch(tmp_path, mode, n):
    run_launch("progs_train.py", n, [mode, str(tmp_path)])
    runs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    assert all(r["losses"] == runs[0]["losses"] for r in runs)  # every rank saw the same loss
    # the program compared every step's loss and the final parameters with eager (rtol 1e-5)
    assert len(runs[0]["losses"]) == 5
    # the first steps compile (momentum buffers appear after step 1; DDP rebuilds its buckets
    # after step 1); from step 4 on, same program, new data: no compile
    assert all(r["compiles"][-1] == r["compiles"][-3] for r in runs), [r["compiles"] for r in runs]
