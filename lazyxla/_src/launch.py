"""Start one process per device: `torch_xla.launch` and `xmp.spawn` (Note [Processes]).

The launcher starts each child as `python -m lazyxla._src.launch`, hands it (over its stdin) what
`multiprocessing`'s spawn start method would (sys.path, the main script to import as
`__mp_main__`, the working directory), whether the torch_xla alias was installed, and then the
pickled function and arguments. A child installs the alias and joins the coordinator *before* it
imports the main script, so a script run by `lazyxla run` finds `torch_xla` in its children too.

The parent watches its children. When one fails, it stops the others at once and raises the
child's exception (the same type, when it can be unpickled) with a note naming the process and
carrying its traceback; a child that dies without a Python exception (a signal, `os._exit`) is
reported with its exit status. Ctrl-C stops every child.
"""

from __future__ import annotations

import multiprocessing.spawn
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

_PLATFORM_COUNT_VARS = {
    "CPU": "CPU_NUM_DEVICES",
    "CUDA": "GPU_NUM_DEVICES",
    "GPU": "GPU_NUM_DEVICES",
}


class ProcessExitedError(RuntimeError):
    """A launched process ended without a Python exception (killed, or `os._exit`)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_process_count() -> int:
    """How many processes `launch` starts on this host: one per device of the platform.

    On CPU that is `CPU_NUM_DEVICES` (1 if unset), as torch_xla counts CPU devices; on GPU
    `GPU_NUM_DEVICES`; `LAZYXLA_NUM_LOCAL_PROCESSES` overrides both.
    """
    override = os.environ.get("LAZYXLA_NUM_LOCAL_PROCESSES")
    if override:
        return int(override)
    platform = os.environ.get("PJRT_DEVICE", "CPU").upper()
    raw = os.environ.get(_PLATFORM_COUNT_VARS.get(platform, f"{platform}_NUM_DEVICES"), "")
    return int(raw) if raw else 1


def _alias_installed() -> bool:
    from . import compat

    return compat.is_installed()


def spawn(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int | None = None) -> None:
    """Run `fn(ordinal, *args)` in `nprocs` new processes (default `local_process_count()`).

    `nprocs=1` runs `fn(0, *args)` in this process, as torch_xla does.
    """
    n = local_process_count() if nprocs is None else int(nprocs)
    if n < 1:
        raise ValueError(f"nprocs must be at least 1, got {nprocs}")
    if n == 1:
        fn(0, *args)
        return
    spawn_processes(fn, args, n)


def spawn_processes(fn: Callable[..., Any], args: tuple[Any, ...], n: int) -> None:
    """`fn(ordinal, *args)` in `n` new processes, also when `n` is 1."""
    if os.environ.get("LAZYXLA_NUM_PROCESSES") or os.environ.get("WORLD_SIZE"):
        raise RuntimeError(
            "launch/spawn called inside a process that is already one of several "
            "(LAZYXLA_NUM_PROCESSES / WORLD_SIZE is set): under torchrun, call fn directly"
        )
    try:
        payload = pickle.dumps((fn, args))
    except Exception as e:
        raise TypeError(
            f"launch/spawn sends fn and args to new processes, so they must be picklable: {e}. "
            "Define fn at the top level of a module or script (not a lambda or nested function)"
        ) from None
    prep = multiprocessing.spawn.get_preparation_data("lazyxla-launch")
    prep.pop("authkey", None)
    header = pickle.dumps((prep, _alias_installed()))
    coordinator = f"localhost:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="lazyxla-launch-") as tmp:
        procs = []
        try:
            for rank in range(n):
                env = dict(os.environ)
                env.update(
                    LAZYXLA_COORDINATOR=coordinator,
                    LAZYXLA_NUM_PROCESSES=str(n),
                    LAZYXLA_PROCESS_ID=str(rank),
                    LAZYXLA_LOCAL_RANK=str(rank),
                    LAZYXLA_LOCAL_WORLD_SIZE=str(n),
                    PJRT_LOCAL_PROCESS_RANK=str(rank),
                    PJRT_LOCAL_PROCESS_COUNT=str(n),
                    LAZYXLA_LAUNCH_ERROR_FILE=os.path.join(tmp, f"error.{rank}"),
                    CPU_NUM_DEVICES="1",
                )
                p = subprocess.Popen(
                    [sys.executable, "-m", "lazyxla._src.launch"], env=env, stdin=subprocess.PIPE
                )
                assert p.stdin is not None
                p.stdin.write(header + payload)
                p.stdin.close()
                procs.append(p)
            _watch(procs, tmp)
        finally:
            _stop(procs)


def _watch(procs: list[subprocess.Popen], tmp: str) -> None:
    n = len(procs)
    while True:
        running = False
        for rank, p in enumerate(procs):
            rc = p.poll()
            if rc is None:
                running = True
            elif rc != 0:
                _stop(procs)
                _raise_child_error(rank, n, rc, os.path.join(tmp, f"error.{rank}"))
        if not running:
            return
        time.sleep(0.05)


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop every child still running: SIGTERM, then SIGKILL after 5 s."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in live:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _raise_child_error(rank: int, n: int, rc: int, error_file: str) -> None:
    where = f"process {rank} of {n}"
    try:
        with open(error_file, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        status = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        raise ProcessExitedError(
            f"{where} ended with {status} without raising a Python exception; the other "
            "processes were stopped (its output, above, may say why)"
        ) from None
    exc, text = None, ""
    try:
        exc, text = pickle.loads(blob)
    except Exception:  # the exception's class exists only in the child (its __main__)
        _, text = pickle.loads(blob.split(b"\n--text--\n", 1)[1])
    if exc is None:
        exc = ProcessRaisedError(text.strip().splitlines()[-1])
    exc.add_note(f"\nRaised in {where}; the other processes were stopped. Its traceback:\n{text}")
    raise exc


class ProcessRaisedError(RuntimeError):
    """A launched process raised an exception whose type the launcher cannot rebuild; the
    message is the child's last traceback line."""


# --- the child ------------------------------------------------------------------------------------


def _exit_with_parent(parent: int) -> None:
    """End this process when the launcher dies (killed by a signal, its own timeout), so no
    orphan is left waiting in a collective."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="lazyxla-parent-watch", daemon=True).start()


def _child_main() -> None:
    _exit_with_parent(os.getppid())
    stdin = sys.stdin.buffer
    prep, alias = pickle.load(stdin)
    rank = int(os.environ["LAZYXLA_PROCESS_ID"])
    try:
        if alias:
            from lazyxla import compat

            compat.install()
        from lazyxla._src import distributed

        distributed.ensure_initialized()
        multiprocessing.spawn.prepare(prep)
        fn, args = pickle.load(stdin)
        fn(rank, *args)
    except SystemExit as e:
        if e.code not in (None, 0):
            _report(e)
            os._exit(e.code if isinstance(e.code, int) else 1)
    except BaseException as e:  # noqa: BLE001 (every failure goes to the parent)
        _report(e)
        os._exit(1)


def _report(exc: BaseException) -> None:
    """Print the traceback and leave (the exception, its text) for the launcher; the text alone
    after a separator, for when the exception cannot be unpickled there."""
    text = "".join(traceback.format_exception(exc))
    sys.stderr.write(text)
    sys.stderr.flush()
    sys.stdout.flush()
    try:
        blob = pickle.dumps((exc, text))
    except Exception:
        blob = pickle.dumps((None, text))
    with open(os.environ["LAZYXLA_LAUNCH_ERROR_FILE"], "wb") as f:
        f.write(blob + b"\n--text--\n" + pickle.dumps((None, text)))


if __name__ == "__main__":
    _child_main()
