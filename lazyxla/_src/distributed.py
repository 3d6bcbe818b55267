"""Processes: several lazyxla processes wired together by JAX's distributed runtime.

# Note [Processes]
torch_xla scales data parallelism with one process per device (`torch_xla.launch`, `xmp.spawn`,
torchrun) and SPMD with one process per host. lazyxla does both on `jax.distributed`: before the
first device use (`runtime.jax_devices()`), a process that was started as one of N connects to the
coordinator (`jax.distributed.initialize`), and from then on `jax.devices()` lists every process's
devices while each process drives its own (`jax.local_devices()`). On CPU the cross-process
collectives are gloo's (`jax_cpu_collectives_implementation`); on GPU/TPU the platform's.

Where a process learns that it is one of N, first match wins:
- `LAZYXLA_COORDINATOR`, `LAZYXLA_NUM_PROCESSES`, `LAZYXLA_PROCESS_ID` (set by the launcher,
  `launch.py`, for the processes it starts; set them yourself to start processes by hand);
- torchrun's `WORLD_SIZE`, `RANK`, `MASTER_ADDR`, `MASTER_PORT`: the coordinator listens on
  `MASTER_PORT + 1` of `MASTER_ADDR` (torchrun's own store holds `MASTER_PORT`).
`LOCAL_RANK` / `LAZYXLA_LOCAL_RANK` give the ordinal on the host (`xr.local_ordinal()`).

Out-of-graph exchanges (`xm.rendezvous`, `xm.mesh_reduce`, barriers) go through the
coordinator's key-value store, never through a compiled collective: they cost no compile and work
before any tensor exists. A process that dies is noticed by the coordinator's heartbeat
(`LAZYXLA_HEARTBEAT_TIMEOUT`, 30 s here instead of JAX's 100 s): the others then stop with JAX's
error naming the task, and the launcher, which watches its children, stops them at once.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax

_state: dict[str, Any] = {"initialized": False, "count": 1, "index": 0}
_generations: dict[str, int] = {}


class DistributedError(RuntimeError):
    """A process could not join or talk to the others (a clear cause, never a hang)."""


def _env_int(*names: str) -> int | None:
    for name in names:
        raw = os.environ.get(name)
        if raw not in (None, ""):
            try:
                return int(raw)
            except ValueError:
                raise DistributedError(f"{name}={raw!r} is not an integer") from None
    return None


def configuration() -> tuple[str, int, int] | None:
    """(coordinator address, process count, process id) if this process is one of several."""
    count = _env_int("LAZYXLA_NUM_PROCESSES")
    if count is not None:
        pid = _env_int("LAZYXLA_PROCESS_ID")
        coordinator = os.environ.get("LAZYXLA_COORDINATOR", "")
        source = "LAZYXLA_NUM_PROCESSES"
    else:
        count = _env_int("WORLD_SIZE")
        if count is None:
            return None
        pid = _env_int("RANK")
        addr, port = os.environ.get("MASTER_ADDR"), _env_int("MASTER_PORT")
        coordinator = f"{addr}:{port + 1}" if addr and port is not None else ""
        source = "WORLD_SIZE"
    if count <= 1:
        return None
    if pid is None or not 0 <= pid < count:
        raise DistributedError(
            f"{source}={count} but this process's id is {pid}: set "
            f"{'LAZYXLA_PROCESS_ID' if source.startswith('LAZYXLA') else 'RANK'} to a number in "
            f"[0, {count})"
        )
    if not coordinator:
        raise DistributedError(
            f"{source}={count} but no coordinator address: set LAZYXLA_COORDINATOR=host:port "
            "(or torchrun's MASTER_ADDR and MASTER_PORT) to the address of process 0"
        )
    return coordinator, count, pid


def _check_port_free(coordinator: str) -> None:
    host, _, port = coordinator.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("" if host in ("localhost", "127.0.0.1", "0.0.0.0") else host, int(port)))
        except OSError as e:
            raise DistributedError(
                f"process 0 cannot host the coordinator at {coordinator}: {e.strerror}. Choose "
                "a free port (LAZYXLA_COORDINATOR / MASTER_PORT) or stop what holds it"
            ) from None


def ensure_initialized() -> None:
    """Join the other processes, if this is one of several (before JAX's backend starts)."""
    if _state["initialized"]:
        if _state.get("error") is not None:
            raise _state["error"]  # a failed join fails every later device use the same way
        return
    _state["initialized"] = True
    try:
        _join()
    except DistributedError as e:
        _state["error"] = e
        raise


def _join() -> None:
    cfg = configuration()
    if cfg is None:
        return
    coordinator, count, pid = cfg
    if pid == 0:
        _check_port_free(coordinator)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    init_timeout = _env_int("LAZYXLA_INIT_TIMEOUT") or 120
    message = (
        f"process {pid} of {count} could not join the coordinator at {coordinator} within "
        f"{init_timeout} s: is process 0 running, do all {count} processes agree on the "
        f"process count, and is each id in [0, {count}) used once? (LAZYXLA_INIT_TIMEOUT sets "
        "the wait)"
    )
    # JAX ends the process from C++ when the wait times out, so the message is printed first;
    # and should the wait outlive its deadline (seen once, on a loaded CI machine, where the
    # join hung past 180 s), the watchdog ends the process itself.
    joined = threading.Event()
    threading.Thread(target=_watch_join, args=(joined, init_timeout, message), daemon=True).start()
    try:
        jax.distributed.initialize(
            coordinator,
            count,
            pid,
            initialization_timeout=init_timeout,
            heartbeat_timeout_seconds=_env_int("LAZYXLA_HEARTBEAT_TIMEOUT") or 30,
        )
    except Exception as e:  # JAX raises XlaRuntimeError / RuntimeError with gRPC detail
        raise DistributedError(f"{message} ({str(e).splitlines()[0]})") from None
    finally:
        joined.set()
    _state.update(count=count, index=pid)


_JOIN_GRACE_S = 20.0  # past the join's deadline, before the watchdog ends a hung process


def _watch_join(joined: threading.Event, timeout: float, message: str) -> None:
    if joined.wait(max(1.0, timeout - 1.5)):
        return
    _print_error(message)
    if joined.wait(1.5 + _JOIN_GRACE_S):
        return
    _print_error(f"the join is still waiting {_JOIN_GRACE_S:.0f} s past its deadline; exiting")
    os._exit(1)


def _print_error(message: str) -> None:
    sys.stderr.write(f"lazyxla.DistributedError: {message}\n")
    sys.stderr.flush()


def coordinator_host() -> str:
    """The host of the coordinator (process 0's host), or localhost alone."""
    cfg = configuration()
    return cfg[0].rpartition(":")[0] if cfg else "localhost"


def process_count() -> int:
    ensure_initialized()
    return _state["count"]


def process_index() -> int:
    ensure_initialized()
    return _state["index"]


def is_multiprocess() -> bool:
    return process_count() > 1


def local_rank() -> int:
    return _env_int("LAZYXLA_LOCAL_RANK", "LOCAL_RANK", "PJRT_LOCAL_PROCESS_RANK") or 0


def local_world_size() -> int:
    return _env_int("LAZYXLA_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", "PJRT_LOCAL_PROCESS_COUNT") or 1


def _client() -> Any:
    from jax._src import distributed

    return distributed.global_state.client


def _timeout_ms() -> int:
    return 1000 * (_env_int("LAZYXLA_RENDEZVOUS_TIMEOUT") or 300)


def rendezvous(tag: str, payload: bytes = b"", replicas: Sequence[int] = ()) -> list[bytes]:
    """Wait until every process (or each of `replicas`) reaches `tag`; everyone's payloads.

    Returns:
        The payloads of the participating processes, in ordinal order.
    """
    if not isinstance(payload, bytes):
        raise TypeError(f"rendezvous payload must be bytes, got {type(payload).__name__}")
    me, n = process_index(), process_count()
    members = sorted(replicas) if replicas else list(range(n))
    if me not in members:
        raise ValueError(f"rendezvous {tag!r}: replicas {list(replicas)} do not include {me}")
    if n == 1:
        return [payload]
    gen = _generations[tag] = _generations.get(tag, -1) + 1  # a tag may be reused
    prefix = f"lazyxla/rendezvous/{tag}/{gen}/{','.join(map(str, members))}"
    client = _client()
    client.key_value_set_bytes(f"{prefix}/{me}", payload)
    out = []
    for r in members:
        try:
            out.append(client.blocking_key_value_get_bytes(f"{prefix}/{r}", _timeout_ms()))
        except Exception as e:
            raise DistributedError(
                f"rendezvous {tag!r}: process {r} did not arrive within {_timeout_ms() // 1000} s "
                f"({str(e).splitlines()[0]})"
            ) from None
    return out


def mesh_reduce(tag: str, data: Any, reduce_fn: Callable[[list[Any]], Any]) -> Any:
    """`reduce_fn` of every process's `data` (any picklable value), outside the graph."""
    return reduce_fn([pickle.loads(b) for b in rendezvous(tag, pickle.dumps(data))])


def barrier(tag: str) -> None:
    rendezvous(f"barrier/{tag}")
