"""torch_xla's `torch_xla._internal.utils`."""

from __future__ import annotations

import re


def parse_xla_device(device: str) -> tuple[str, int] | None:
    """`('CPU', 0)` for a runtime device string `'CPU:0'` (None if it is not one)."""
    m = re.match(r"([A-Z]+):(\d+)$", device)
    return (m.group(1), int(m.group(2))) if m else None
