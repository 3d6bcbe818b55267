"""The second half of test_opinfo_compiled.py's entries (a file per `--dist loadfile` worker)."""

from __future__ import annotations

import pytest
from test_opinfo_compiled import check_entry, shard


@pytest.mark.parametrize("key", shard(1))
def test_opinfo_compiled(key):
    check_entry(key)
