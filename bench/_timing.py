"""Timing helpers shared by the benchmarks: warm-up, and modes timed in interleaved rounds."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def warm(fn: Callable[[], object], warmup: int) -> float:
    """Call `fn` `warmup` times (compiles happen here); return the seconds it took."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    return time.perf_counter() - t0


def interleaved_ms(modes: dict[str, Callable[[], object]], rounds: int, per_round: int) -> dict:
    """Median ms per call of each mode, timed in interleaved rounds.

    The machine is shared: timing the modes one after another would let a change of load land on
    one of them. Each round times `per_round` calls of every mode in turn.
    """
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode, fn in modes.items():
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                samples[mode].append(time.perf_counter() - t0)
    return {m: statistics.median(v) * 1e3 for m, v in samples.items()}
