"""Run a program of this directory under `lazyxla run`, as N launched processes."""

import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def run_launch(
    prog: str, n: int, args: list[str], env: dict | None = None, expect_rc: int = 0, timeout=240
) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    full_env.update(CPU_NUM_DEVICES=str(n), PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-m", "lazyxla", "run", str(HERE / prog), *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != expect_rc:
        raise AssertionError(
            f"{prog} on {n} processes: exit {proc.returncode} (expected {expect_rc})\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}"
        )
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(
    prog: str,
    rank: int,
    n: int,
    port: int,
    args=(),
    devices: int = 1,
    torchrun: bool = False,
    init_timeout: int = 10,
) -> subprocess.Popen:
    """Process `rank` of a job of `n` started by hand (as on N hosts), through the environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env.update(
        CPU_NUM_DEVICES=str(devices), LAZYXLA_INIT_TIMEOUT=str(init_timeout), PYTHONUNBUFFERED="1"
    )
    if torchrun:  # torchrun's names; the coordinator takes MASTER_PORT + 1
        env.update(WORLD_SIZE=str(n), RANK=str(rank), MASTER_ADDR="localhost")
        env.update(MASTER_PORT=str(port - 1), LOCAL_RANK=str(rank))
    else:
        env.update(LAZYXLA_COORDINATOR=f"localhost:{port}")
        env.update(LAZYXLA_NUM_PROCESSES=str(n), LAZYXLA_PROCESS_ID=str(rank))
    return subprocess.Popen(
        [sys.executable, "-m", "lazyxla", "run", str(HERE / prog), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
