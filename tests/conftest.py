"""Test-wide setup: 8 virtual CPU devices (SPMD tests), configured before JAX initialises."""

import os

os.environ.setdefault("CPU_NUM_DEVICES", "8")
os.environ.setdefault("PJRT_DEVICE", "CPU")

import gc
import sys

import pytest

# Note [Tests compile at -O0]
# Compiling is half the suite's time (1735 of 3275 worker-seconds, 6774 compiles, measured with
# XLA's default flags), mostly LLVM optimizing XLA's CPU kernels. The suite checks what lazyxla
# builds (lowerings' values, graphs, compile counts, memory), not how fast XLA's machine code
# runs, so `make test` compiles at LLVM -O0 (`--xla_backend_optimization_level=0`): 28:15 -> 21:25
# on 2 cores. Values stay the same but for one thing: LLVM keeps IEEE semantics (signed zeros,
# NaNs, no reassociation) at every level, and only -O2 contracts a multiply and an add into an FMA
# (measured, 256x256 float32: sin, tanh, exp, log1p, erf, softmax, sums, matmul and max bitwise
# equal at -O0 and -O2; x*a + b*x*x, gelu and rsqrt differ by an ulp). Eager's CPU kernels use
# FMA where the CPU has it, and so does XLA at -O2: on any CPU, both sides contract alike. Tests
# that compare lazyxla's rounding with eager's (bit equality, "no farther from float64 than
# eager") depend on that; they are marked `eager_rounding`, and `make test` runs them in a second
# pass at XLA's default codegen. Processes the tests start inherit the flags.


_O0 = "--xla_backend_optimization_level=0" in os.environ.get("XLA_FLAGS", "")


@pytest.fixture(autouse=True)
def default_codegen_for_eager_rounding(request):
    if _O0 and request.node.get_closest_marker("eager_rounding"):
        pytest.fail(
            "this test compares lazyxla's rounding with eager's (marked eager_rounding) and needs "
            "XLA's default codegen, but XLA_FLAGS sets --xla_backend_optimization_level=0: "
            "deselect it (-m 'not eager_rounding') or drop the flag (Note [Tests compile at -O0] "
            "in tests/conftest.py)"
        )


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
