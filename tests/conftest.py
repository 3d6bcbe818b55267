"""Test-wide setup: 8 virtual CPU devices (SPMD tests), configured before JAX initialises."""

import os

os.environ.setdefault("CPU_NUM_DEVICES", "8")
os.environ.setdefault("PJRT_DEVICE", "CPU")

import gc
import sys

import pytest


@pytest.fixture(autouse=True)
def no_garbage_in_the_next_sync():
    """Each test starts without pending tensors that only a reference cycle keeps alive (an
    earlier test's caught exception, a frame list): a full sync runs every live pending tensor,
    so such garbage would join the test's first graph, an extra compile whose count depended on
    when the cyclic collector last ran. Collected only when something is pending."""
    graph = sys.modules.get("lazyxla._src.graph")
    if graph is not None and graph.pending_states(None):
        gc.collect(1)  # the last test's garbage is young; the full collection costs ~0.2 s
        if graph.pending_states(None):
            gc.collect()
    yield
