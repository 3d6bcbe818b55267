"""The device RNG: a seed and a counter, both graph *inputs*.

Each random op takes the next counter value at record time and lowers to
`jax.random.fold_in(key(seed), counter)`, so dropout masks differ step to step while the compiled
graph
stays the same (see Note [Graph hashing]); `manual_seed(s)` reproduces a run.
"""

from __future__ import annotations

_seed = 0
_counter = 0


def manual_seed(seed: int) -> None:
    global _seed, _counter
    _seed = int(seed) & 0xFFFFFFFFFFFF
    _counter = 0


def next_offset() -> tuple[int, int]:
    """`(seed, counter)` for one random op; advances the counter."""
    global _counter
    _counter += 1
    return _seed, _counter


def get_state() -> tuple[int, int]:
    return _seed, _counter


def set_state(seed: int, counter: int) -> None:
    global _seed, _counter
    _seed, _counter = int(seed), int(counter)
