"""Failures end the whole run with an error naming the process, never a hang; a bad start
(port in use, wrong process count, no coordinator) says so at once."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mp_util import HERE, free_port, run_launch, start


def test_a_rank_that_raises_fails_the_launch_with_its_exception_and_rank():
    t0 = time.monotonic()
    proc = run_launch("progs_faults.py", 2, ["raise"], expect_rc=1)
    assert "StepError: bad batch on rank 1" in proc.stderr
    assert "Raised in process 1 of 2; the other processes were stopped" in proc.stderr
    assert time.monotonic() - t0 < 120


def test_a_rank_that_dies_ends_the_run_naming_it():
    proc = run_launch("progs_faults.py", 2, ["exit"], expect_rc=1)
    assert "ProcessExitedError: process 1 of 2 ended with exit code 3" in proc.stderr


def _start(rank: int, n: int, port: int, torchrun: bool = False, init_timeout: int = 10):
    return start("progs_join.py", rank, n, port, torchrun=torchrun, init_timeout=init_timeout)


@pytest.mark.parametrize("torchrun", [False, True])
def test_processes_started_by_hand_join_through_the_environment(torchrun):
    port = free_port()
    procs = [_start(r, 2, port, torchrun) for r in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "sum [5.0, 5.0, 5.0] world 2" in out
        assert "gloo [0, 1]" in out


def test_a_missing_process_is_a_clear_error_at_start():
    port = free_port()
    # a job of 3 whose third process never starts: each waits its join timeout (4 s), then fails
    procs = [_start(r, 3, port, init_timeout=4) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode != 0
        assert "could not join the coordinator" in err, err[-3000:]
        assert "do all 3 processes agree on the process count" in err


_HUNG_JOIN = """
import time, jax
import lazyxla._src.distributed as d
jax.distributed.initialize = lambda *a, **k: time.sleep(600)  # a join that never returns
d._JOIN_GRACE_S = 1.0
d.ensure_initialized()
"""


def test_a_join_that_hangs_past_its_deadline_ends_the_process():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(LAZYXLA_COORDINATOR="localhost:1", LAZYXLA_NUM_PROCESSES="2")
    env.update(LAZYXLA_PROCESS_ID="1", LAZYXLA_INIT_TIMEOUT="2")
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", _HUNG_JOIN], env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 1, p.stderr[-3000:]
    assert "process 1 of 2 could not join the coordinator" in p.stderr
    assert "still waiting 1 s past its deadline; exiting" in p.stderr
    assert time.monotonic() - t0 < 60


def test_a_coordinator_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = _start(0, 2, port)
        _, err = p.communicate(timeout=120)
    assert p.returncode != 0
    assert f"cannot host the coordinator at localhost:{port}" in err, err[-3000:]


def test_an_inconsistent_environment_is_a_clear_error():
    p = _start(5, 2, free_port())
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0
    assert "LAZYXLA_NUM_PROCESSES=2 but this process's id is 5" in err, err[-3000:]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _start_waiting_launcher(env: dict, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "lazyxla", "run", str(HERE / "progs_faults.py"), "wait", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_ctrl_c_stops_every_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["CPU_NUM_DEVICES"] = "2"
    env["PYTHONFAULTHANDLER"] = "1"  # (SIGABRT on a timeout: every thread's stack, below)
    # The launcher starts with Ctrl-C deliverable, as from a terminal, whatever this test process
    # inherited or was left with (an ignored SIGINT is inherited through exec; a handler is not).
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    try:
        parent = _start_waiting_launcher(env, tmp_path)
    finally:
        if old is not None:  # (None: a handler installed outside Python, left as it is)
            signal.signal(signal.SIGINT, old)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    pids = []
    deadline = time.monotonic() + 180
    while len(pids) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        pids = [int(p.read_text()) for p in tmp_path.glob("pid*") if p.read_text()]
    assert len(pids) == 2, parent.stderr.read().decode()[-3000:] if parent.poll() else "no pids"
    parent.send_signal(signal.SIGINT)
    try:
        parent.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        with open(f"/proc/{parent.pid}/status") as f:
            masks = [line.strip() for line in f if line.startswith(("SigBlk", "SigIgn", "SigCgt"))]
        parent.send_signal(signal.SIGABRT)  # faulthandler prints where each thread is
        _, err = parent.communicate(timeout=30)
        alive = [pid for pid in pids if _alive(pid)]
        pytest.fail(
            f"the launcher did not stop on SIGINT; its signal masks {masks}; children alive: "
            f"{alive}\n{err.decode()[-6000:]}"
        )
    assert parent.returncode == 130  # `lazyxla run`'s status for KeyboardInterrupt
    time.sleep(1)
    assert not [pid for pid in pids if _alive(pid)]
