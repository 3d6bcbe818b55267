"""One typed registry of lazyxla's flags, read from the environment once at import.

Each flag has an environment variable, a type, a default and help text. Hot paths read the parsed
`FLAGS` object, never `os.environ`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any


@dataclasses.dataclass(frozen=True)
class Flag:
    env: str
    type: type
    default: Any
    help: str


_FLAGS: dict[str, Flag] = {
    "cpu_fallback": Flag(
        "LAZYXLA_CPU_FALLBACK",
        bool,
        True,
        "Run ops that have no lowering through eager PyTorch on CPU (counted as aten::<op>). "
        "Set to 0 to raise an error naming the op instead.",
    ),
    "ir_debug": Flag(
        "XLA_IR_DEBUG",
        bool,
        False,
        "Record the user's source line on every IR node (shown in IR text and compile errors).",
    ),
    "use_spmd": Flag(
        "XLA_USE_SPMD",
        bool,
        False,
        "Start in SPMD mode, as if torch_xla.runtime.use_spmd() were called at import.",
    ),
    "donate_buffers": Flag(
        "LAZYXLA_DONATE_BUFFERS",
        bool,
        False,
        "Experimental: let a sync's executable reuse (donate) the device buffers of tensors it "
        "overwrites, as torch_xla does (less memory; on the CPU steps measured slower). See "
        "Notes [Buffer donation] and [Donated buffers pair with their updates] (donation.py).",
    ),
    "read_syncs_all": Flag(
        "LAZYXLA_READ_SYNCS_ALL",
        bool,
        True,
        "A value read (.item(), .cpu(), print) that must execute runs every live pending tensor, "
        "as a step boundary does, not only the one read (torch_xla's policy, 0). See Note [What "
        "a value read syncs].",
    ),
    "host_reads": Flag(
        "LAZYXLA_HOST_READS",
        bool,
        True,
        "A value read of small integer bookkeeping, or of data moved by cat/slice/views, is "
        "answered on the host instead of compiling a graph. See Note [Small integer reads on "
        "the host].",
    ),
    "autograd_threads": Flag(
        "LAZYXLA_AUTOGRAD_THREADS",
        bool,
        False,
        "Let PyTorch's autograd engine run backward on a thread per device, its default for "
        "accelerators. Off, lazyxla turns autograd multithreading off at import, so backward runs "
        "on the calling thread. See Note [Backward on the calling thread].",
    ),
    "check_indices": Flag(
        "LAZYXLA_CHECK_INDICES",
        bool,
        False,
        "Debugging: check every gather, scatter and slice of each graph for out-of-range "
        "indices and raise IndexError after the run, as eager would (XLA clamps them or gives "
        "NaN). Each sync then waits for its graph. See Note [Checked indices].",
    ),
    "exact_execute_time": Flag(
        "LAZYXLA_EXACT_EXECUTE_TIME",
        bool,
        False,
        "Time each execution (ExecuteTime) to its completion from a background thread, as "
        "torch_xla's runtime does, instead of to when lazyxla next sees its results ready; costs "
        "~0.1-0.2 ms of the caller's time per execution on a small CPU. See Note [ExecuteTime].",
    ),
    "gc_freeze": Flag(
        "LAZYXLA_GC_FREEZE",
        bool,
        True,
        "After a sync that compiled a graph, move every object alive to Python's permanent "
        "GC generation (gc.freeze()), so full collections stop re-scanning the model, the "
        "optimizer and the libraries. See Note [Keeping the collector off long-lived objects].",
    ),
    "compilation_cache_size": Flag(
        "XLA_COMPILATION_CACHE_SIZE",
        int,
        1024,
        "How many compiled graphs to keep in memory; the least recently used is evicted first.",
    ),
    "debug_level": Flag(
        "PT_XLA_DEBUG_LEVEL",
        int,
        0,
        "1: print why each graph compiles (cause, graph hash, Python frames; a recompile at the "
        "same line says what changed) and its sizes; 2: also why each graph executes.",
    ),
    "pt_xla_debug": Flag("PT_XLA_DEBUG", bool, False, "Same as PT_XLA_DEBUG_LEVEL=2."),
    "debug_file": Flag(
        "PT_XLA_DEBUG_FILE",
        str,
        "",
        "Append the PT_XLA_DEBUG analyses to this file instead of printing them on stderr.",
    ),
    "save_tensors_file": Flag(
        "XLA_SAVE_TENSORS_FILE",
        str,
        "",
        "Append every synced graph to this file (+ '.0', the device ordinal), with the Python "
        "frames that triggered the sync.",
    ),
    "save_tensors_fmt": Flag(
        "XLA_SAVE_TENSORS_FMT", str, "text", "Format of XLA_SAVE_TENSORS_FILE: text, hlo or dot."
    ),
    "metrics_file": Flag(
        "XLA_METRICS_FILE", str, "", "Write the metrics report to this file at process exit."
    ),
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse(name: str, flag: Flag, raw: str) -> Any:
    if flag.type is bool:
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"{flag.env}={raw!r} is not a boolean; use 1 or 0. ({name}: {flag.help})")
    if flag.type is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(
                f"{flag.env}={raw!r} is not an integer. ({name}: {flag.help})"
            ) from None
    return raw


class _Config:
    """Parsed flag values; attribute access is a plain lookup."""

    def __init__(self) -> None:
        for name, flag in _FLAGS.items():
            raw = os.environ.get(flag.env)
            setattr(self, name, flag.default if raw is None else _parse(name, flag, raw))

    def set(self, name: str, value: Any) -> None:
        """Override a flag at run time (tests, `lazyxla.config.set`)."""
        if name not in _FLAGS:
            raise KeyError(f"unknown lazyxla flag {name!r}; known flags: {sorted(_FLAGS)}")
        setattr(self, name, value)

    def describe(self) -> str:
        return "\n".join(f"{f.env:28} {getattr(self, n)!r:10} {f.help}" for n, f in _FLAGS.items())


FLAGS = _Config()
