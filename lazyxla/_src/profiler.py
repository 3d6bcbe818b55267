"""torch_xla's `torch_xla.debug.profiler` (`xp`) over `jax.profiler`.

Traces are XProf traces (`<logdir>/plugins/profile/<run>/*.xplane.pb`), viewable in TensorBoard's
profile plugin or XProf, as torch_xla's are.
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from . import analysis, graph, runtime_api

_servers: dict[int, Any] = {}


def start_server(port: int, only_on_master: bool = True) -> Any:
    """Start a profiler server on `port`, for `trace()` or TensorBoard to capture from.

    Args:
        port: the port to serve on.
        only_on_master: start it only on the host's first process (local ordinal 0), as
            torch_xla does; the other processes start none and get None.

    Returns:
        The server (keep a reference to it, or it stops), or None where none was started.
    """
    if only_on_master and runtime_api.local_ordinal() != 0:
        return None
    if port not in _servers:
        _servers[port] = jax.profiler.start_server(port)
    return _servers[port]


def _is_local(host: str) -> bool:
    if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0", ""):
        return True
    try:
        return socket.gethostbyname(host) == socket.gethostbyname(socket.gethostname())
    except OSError:
        return False


def trace(
    service_addr: str,
    logdir: str,
    duration_ms: int = 1000,
    num_tracing_attempts: int = 3,
    host_tracer_level: int = 2,
    device_tracer_level: int = 1,
    delay_ms: int = 0,
    **kwargs: Any,
) -> None:
    """Capture `duration_ms` of profile from the server at `service_addr` into `logdir`.

    A remote server needs the `xprof` package (its capture client); a server in this process
    (`start_server` here) is traced directly.
    """
    host, _, port = service_addr.rpartition(":")
    if delay_ms:
        time.sleep(delay_ms / 1000)
    try:
        from xprof.convert import _pywrap_profiler_plugin  # type: ignore[import-not-found]
    except ImportError:
        _pywrap_profiler_plugin = None
    if _pywrap_profiler_plugin is not None:
        options = {
            "host_tracer_level": host_tracer_level,
            "device_tracer_level": device_tracer_level,
            "python_tracer_level": kwargs.get("python_tracer_level", 1),
        }
        _pywrap_profiler_plugin.trace(
            service_addr.removeprefix("grpc://"), str(logdir), "", True, duration_ms,
            num_tracing_attempts, options,
        )  # fmt: skip
        return
    if not (_is_local(host) and port.isdigit() and int(port) in _servers):
        raise RuntimeError(
            f"cannot capture a trace from {service_addr}: tracing another process needs the "
            "xprof package (pip install xprof); a server started in this process with "
            "start_server() can be traced without it"
        )
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = host_tracer_level
    options.device_tracer_level = device_tracer_level
    jax.profiler.start_trace(str(logdir), profiler_options=options)
    try:
        time.sleep(duration_ms / 1000)
    finally:
        jax.profiler.stop_trace()


# Note [Detached traces]
# torch_xla's trace_detached captures on a daemon thread. A daemon thread still capturing when the
# interpreter exits is killed mid-capture: the trace is lost, or the profiler's C++ state is torn
# down under it (an abort). The thread here is not a daemon: the interpreter's shutdown joins it
# before any exit hook runs (each capture ends after its delay_ms + duration_ms), so the
# program's exit waits for its traces and each is written whole.


def trace_detached(
    service_addr: str,
    logdir: str,
    duration_ms: int = 1000,
    num_tracing_attempts: int = 3,
    host_tracer_level: int = 2,
    device_tracer_level: int = 1,
    delay_ms: int = 0,
    **kwargs: Any,
) -> threading.Thread:
    """`trace(...)` on a background thread; returns the thread (join it to wait for the trace).

    The capture finishes even if the program ends first: exit waits for it (Note [Detached
    traces]).
    """
    t = threading.Thread(
        target=trace,
        args=(service_addr, logdir, duration_ms, num_tracing_attempts),
        kwargs=dict(
            host_tracer_level=host_tracer_level,
            device_tracer_level=device_tracer_level,
            delay_ms=delay_ms,
            **kwargs,
        ),
        daemon=False,
        name="lazyxla-trace",
    )
    t.start()
    return t


# Note [Trace scopes]
# torch_xla's `xp.Trace` also pushes an IR scope (`<name>.<k>`, `k` counting the scopes pushed
# since the last step), and a step that resets scopes (`torch_xla.sync()`, `reset_scope=True`)
# inside an open one fails with "Expecting scope to be empty but it is <scope>": a region traced
# by name must not span a step boundary. lazyxla keeps the same per-thread stack and check
# (`check_scopes_empty`, called by `sync`), though its IR carries no scope names.
_scopes = threading.local()


def _scope_stack() -> list[str]:
    stack = getattr(_scopes, "stack", None)
    if stack is None:
        stack = _scopes.stack = []
        _scopes.count = 0
    return stack


def check_scopes_empty() -> None:
    """A step that resets scopes: raise torch_xla's error if a `Trace` is open, and restart the
    scope numbering (Note [Trace scopes])."""
    stack = _scope_stack()
    _scopes.count = 0
    if stack:
        raise RuntimeError(
            f"Expecting scope to be empty but it is {stack[-1]}: torch_xla.sync() / "
            "xm.mark_step() ran inside `xp.Trace` (or `@xp.trace_me`); end the trace before the "
            "step, or sync with reset_scope=False"
        )


class Trace:
    """Annotate a region as a named event in the host trace (`with xp.Trace('fwd'):`); see Note
    [Trace scopes] for the step check."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        self.name = name
        self.kwargs = kwargs
        self._annotation: Any = None
        self._scope: str | None = None

    def _make(self) -> Any:
        return jax.profiler.TraceAnnotation(self.name, **self.kwargs)

    def __enter__(self) -> Trace:
        stack = _scope_stack()
        _scopes.count += 1
        self._scope = f"{self.name}.{_scopes.count}"
        stack.append(self._scope)
        self._annotation = self._make()
        self._annotation.__enter__()
        return self

    def _pop_scope(self) -> None:
        stack = _scope_stack()
        if self._scope is not None and self._scope in stack:
            stack.remove(self._scope)
        self._scope = None

    def __exit__(self, *exc: Any) -> None:
        self._pop_scope()
        self._annotation.__exit__(*exc)
        self._annotation = None


class StepTrace(Trace):
    """A training-step event (`step_num` groups the trace by step); syncs on exit, as torch_xla's
    does, so the step's graph runs inside the step's event."""

    def __init__(self, name: str, step_num: int | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.step_num = step_num

    def _make(self) -> Any:
        kwargs = dict(self.kwargs)
        if self.step_num is not None:
            kwargs["step_num"] = self.step_num
        return jax.profiler.StepTraceAnnotation(self.name, **kwargs)

    def __exit__(self, *exc: Any) -> None:
        self._pop_scope()  # its own scope ends before the step, as in torch_xla
        try:
            if exc[0] is None:
                graph.sync(cause=analysis.STEP_TRACE)
        finally:
            super().__exit__(*exc)


def trace_me(name: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: every call of the function is a `Trace(name)` event."""

    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def wrapper(*args: Any, **kw: Any) -> Any:
            with Trace(name, **kwargs):
                return f(*args, **kw)

        return wrapper

    return deco


def start_trace(log_dir: str) -> None:
    """Start tracing this process into `log_dir` (until `stop_trace()`)."""
    jax.profiler.start_trace(str(log_dir))


def stop_trace() -> None:
    """Stop the trace started by `start_trace` and write it."""
    jax.profiler.stop_trace()
