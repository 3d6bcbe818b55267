"""Test-wide setup: 8 virtual CPU devices (SPMD tests), configured before JAX initialises."""

import os

os.environ.setdefault("CPU_NUM_DEVICES", "8")
os.environ.setdefault("PJRT_DEVICE", "CPU")
