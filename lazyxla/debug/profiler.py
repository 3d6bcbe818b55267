"""torch_xla's `torch_xla.debug.profiler` (`xp`), over `jax.profiler`."""

from .._src.profiler import StepTrace as StepTrace
from .._src.profiler import Trace as Trace
from .._src.profiler import start_server as start_server
from .._src.profiler import start_trace as start_trace
from .._src.profiler import stop_trace as stop_trace
from .._src.profiler import trace as trace
from .._src.profiler import trace_detached as trace_detached
from .._src.profiler import trace_me as trace_me

__all__ = [
    "StepTrace",
    "Trace",
    "start_server",
    "start_trace",
    "stop_trace",
    "trace",
    "trace_detached",
    "trace_me",
]
