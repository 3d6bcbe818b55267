"""torch.distributed.checkpoint through lazyxla's SPMD planners across processes: saved by 4
processes on one mesh, loaded by 2 processes on another (parameters and AdamW state bit-equal)."""

import json

from mp_util import free_port, start


def _run(mode: str, n: int, devices: int, out) -> None:
    port = free_port()
    procs = [
        start("progs_checkpoint.py", r, n, port, [mode, str(out)], devices=devices)
        for r in range(n)
    ]
    for r, p in enumerate(procs):
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, f"{mode}, process {r} of {n}:\n{err[-6000:]}"


def test_save_on_four_processes_load_on_two_with_another_mesh(tmp_path):
    _run("save", 4, 2, tmp_path)  # 4 processes x 2 devices: mesh (4, 2)
    assert (tmp_path / "ckpt" / "7" / ".metadata").exists()
    _run("load", 2, 2, tmp_path)  # 2 processes x 2 devices: mesh (4,), reversed devices
    loaded = json.loads((tmp_path / "loaded.json").read_text())
    assert loaded["processes"] == 2 and loaded["devices"] == 4
    assert "optim.0.exp_avg_sq" in loaded["keys"] and "model.2.weight" in loaded["keys"]
