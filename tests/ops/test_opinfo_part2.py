"""The second half of the OpInfo entries (see test_opinfo.py): a separate file so that
`--dist loadfile` gives it its own worker."""

from __future__ import annotations

import pytest
from test_opinfo import check_entry, shard


@pytest.mark.parametrize("key", shard(1))
def test_opinfo(key):
    check_entry(key)
