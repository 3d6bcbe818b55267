"""Data-parallel training over launched processes equals eager on the global batch."""

import json

import pytest
from mp_util import run_launch

MODES = ("optimizer_step", "ddp", "zero1", "fsdp", "fsdp_wrap")


def _check(out_dir, mode: str, n: int) -> None:
    runs = [json.loads((out_dir / f"{mode}.rank{r}.json").read_text()) for r in range(n)]
    assert all(r["losses"] == runs[0]["losses"] for r in runs), mode  # every rank: the same loss
    # the program compared every step's loss and the final parameters with eager (rtol 1e-5)
    assert len(runs[0]["losses"]) == 5, mode
    # the first steps compile (momentum buffers appear after step 1; DDP rebuilds its buckets
    # after step 1); from step 4 on, same program, new data: no compile
    assert all(r["compiles"][-1] == r["compiles"][-3] for r in runs), (
        mode,
        [r["compiles"] for r in runs],
    )


def test_training_equals_eager_on_the_global_batch(tmp_path):
    """Every mode, one after the other in one launch of 2 processes (a launch costs seconds of
    imports and joining; the program names the mode it fails in)."""
    run_launch("progs_train.py", 2, [",".join(MODES), str(tmp_path)])
    for mode in MODES:
        _check(tmp_path, mode, 2)


@pytest.mark.slow  # (the all-reduce over more than two ranks is test_collectives' [4] case)
def test_training_equals_eager_on_four_processes(tmp_path):
    run_launch("progs_train.py", 4, ["optimizer_step", str(tmp_path)])
    _check(tmp_path, "optimizer_step", 4)
