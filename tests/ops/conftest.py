import os
import sys

# tests/util.py holds the CPU-vs-lazyxla comparison helpers shared with tests/test_views.py.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _lowerings_not_host_reads():
    """These tests check each op's lowering against eager: a small integer result must come from
    the device, not be answered on the host by eager itself (Note [Small integer reads on the
    host])."""
    from lazyxla._src.config import FLAGS

    FLAGS.set("host_reads", False)
    yield
    FLAGS.set("host_reads", True)
