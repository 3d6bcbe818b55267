"""Test-wide setup: 8 virtual CPU devices (SPMD tests), configured before JAX initialises."""

import os

os.environ.setdefault("CPU_NUM_DEVICES", "8")
os.environ.setdefault("PJRT_DEVICE", "CPU")

import gc
import sys

import pytest

# Note [Tests compile at -O0]
# Compiling was half the suite's time (1735 of 3275 worker-seconds, 6774 compiles, measured with
# XLA's default flags), XLA's CPU code generation. The suite checks what lazyxla builds
# (lowerings' values, graphs, compile counts, memory), not how fast XLA's machine code runs, so
# `make test` compiles for compile speed (TEST_XLA_FLAGS in the Makefile):
# - LLVM -O0 (`--xla_backend_optimization_level=0`): 28:15 -> 21:25 on 2 cores;
# - XLA:CPU's elemental IR emitters instead of its MLIR fusion emitters
#   (`--xla_cpu_use_fusion_emitters=false`), and each executable's code in one LLVM module
#   (`--xla_cpu_parallel_codegen_split_count=1`: two test workers already fill both cores):
#   compiling the ModuleInfo bf16 sweep took 42.3 s -> 12.2 s, the main pass 23:06 -> 13:42.
# Values are IEEE either way (signed zeros, NaNs, no reassociation), but the rounding is not
# eager's alone: only LLVM -O2 contracts a multiply and an add into an FMA, as eager's kernels do
# where the CPU has FMA, and the two emitters approximate some functions differently (measured on
# 256x256 inputs against the default codegen: tanh up to 6 ulps in float32 and 7 in float64, tan,
# cbrt, erfinv 2, rsqrt, log1p, asinh 1; sin, cos, exp, log, erf, softmax, sums, matmul, conv and
# sort bitwise equal). Tests that compare lazyxla's rounding with eager's (bit equality, "no
# farther from float64 than eager") depend on the default codegen; they are marked
# `eager_rounding`, and `make test` runs them in a second pass with XLA's default flags. Processes
# the tests start inherit the flags.


_FAST_CODEGEN = any(
    flag in os.environ.get("XLA_FLAGS", "")
    for flag in ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
)


@pytest.fixture(autouse=True)
def default_codegen_for_eager_rounding(request):
    if _FAST_CODEGEN and request.node.get_closest_marker("eager_rounding"):
        pytest.fail(
            "this test compares lazyxla's rounding with eager's (marked eager_rounding) and needs "
            "XLA's default codegen, but XLA_FLAGS sets the suite's fast-compile flags: "
            "deselect it (-m 'not eager_rounding') or drop the flags (Note [Tests compile at -O0] "
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
