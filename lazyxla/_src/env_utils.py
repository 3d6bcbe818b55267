"""torch_xla's `torch_xla.utils.utils` helpers that programs use: synthetic data, env parsing."""

from __future__ import annotations

import os
from typing import Any


class SampleGenerator:
    """An iterator returning `data` `sample_count` times: a stand-in for a `DataLoader`.

    Args:
        data: what every step returns.
        sample_count: how many times.
    """

    def __init__(self, data: Any, sample_count: int) -> None:
        self._data = data
        self._sample_count = sample_count
        self._count = 0

    def __iter__(self) -> SampleGenerator:
        return SampleGenerator(self._data, self._sample_count)

    def __len__(self) -> int:
        return self._sample_count

    def __next__(self) -> Any:
        return self.next()

    def next(self) -> Any:
        """The data again, until `sample_count` samples were returned."""
        if self._count >= self._sample_count:
            raise StopIteration
        self._count += 1
        return self._data


def getenv_as(name: str, type: type, defval: Any = None) -> Any:
    """Environment variable `name` converted to `type` (`bool` through `int`: "0"/"1").

    Returns:
        `defval` if the variable is unset.
    """
    env = os.environ.get(name)
    if env is None:
        return defval
    return bool(int(env)) if type is bool else type(env)


def check_env_flag(name: str, default: str = "") -> bool:
    """True if environment variable `name` is ON, 1, YES, TRUE or Y (any case)."""
    return os.getenv(name, default).upper() in ("ON", "1", "YES", "TRUE", "Y")
