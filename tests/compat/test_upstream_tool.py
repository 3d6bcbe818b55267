"""The conformance tool (`python -m lazyxla.tools.upstream`): run_tests.sh parsing, failure
grouping, the device-type classification, the report, and one end-to-end run of a tiny checkout."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from lazyxla.tools import upstream

RUN_TESTS = """\
export CPU_NUM_DEVICES=4
function run_xla_op_tests1 {
  run_dynamic "$_TEST_DIR/test_operations.py" "$@" --verbosity=$VERBOSITY
  run_test "$_TEST_DIR/test_operations.py" "$@" --verbosity=$VERBOSITY
  run_test_multi_devices "$_TEST_DIR/spmd/test_xla_sharding.py"
  run_pt_xla_debug "$_TEST_DIR/debug_tool/test_pt_xla_debug.py"
  XLA_METRICS_FILE=/tmp/metrics.txt run_test "$_TEST_DIR/test_metrics.py"
  run_xla_hlo_debug run_test "$_TEST_DIR/test_env_var_mapper.py"
  run_test_multi_devices_without_func "$_TEST_DIR/spmd/test_dtensor_integration3.py"
}
"""


def _checkout(tmp_path: Path) -> Path:
    (tmp_path / "test" / "spmd").mkdir(parents=True)
    (tmp_path / "test" / "tpu").mkdir()
    (tmp_path / "examples").mkdir()
    (tmp_path / "test" / "run_tests.sh").write_text(RUN_TESTS)
    return tmp_path


def test_run_tests_env_follows_the_script(tmp_path):
    envs = upstream.run_tests_env(str(_checkout(tmp_path)))
    # A file run several ways gets its plain run_test.
    assert envs["test/test_operations.py"][0] == {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1"}
    assert envs["test/spmd/test_xla_sharding.py"][0]["CPU_NUM_DEVICES"] == "4"
    assert envs["test/debug_tool/test_pt_xla_debug.py"][0] == {
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": "1",
        "PT_XLA_DEBUG": "1",
        "PT_XLA_DEBUG_FILE": "/tmp/pt_xla_debug.txt",
    }
    assert envs["test/test_metrics.py"][0]["XLA_METRICS_FILE"] == "/tmp/metrics.txt"
    assert envs["test/test_env_var_mapper.py"][0]["XLA_HLO_DEBUG"] == "1"
    d3 = envs["test/spmd/test_dtensor_integration3.py"][0]
    assert d3 == {
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": "4",
        "XLA_DISABLE_FUNCTIONALIZATION": "1",
    }


def test_discover_excludes_hardware_only_files(tmp_path):
    root = _checkout(tmp_path)
    for rel in ("test/test_a.py", "test/test_pallas.py", "test/tpu/test_x.py", "test/helper.py"):
        (root / rel).write_text("")
    (root / "examples" / "train.py").write_text("")
    items, excluded = upstream.discover(str(root))
    assert [(i.kind, i.path) for i in items] == [
        ("test", "test/test_a.py"),
        ("example", "examples/train.py"),
    ]
    assert set(excluded) == {"test/test_pallas.py", "test/tpu/test_x.py"}


def test_normalise_groups_causes_that_differ_in_numbers():
    a = upstream.normalise(
        "AssertionError: Tensor-likes are not close! Mismatched elements: 3 / 10\nx"
    )
    b = upstream.normalise(
        "AssertionError: Tensor-likes are not close! Mismatched elements: 7 / 12"
    )
    assert a == b == "AssertionError: Tensor-likes are not close! Mismatched elements: N / N"
    assert upstream.normalise("at 0x7f3a2b") == "at 0x…"


def test_device_type_only_classification():
    assert upstream.device_type_only({"message": "AssertionError: 'jax' != 'xla'"})
    src = "    def test_x(self):\n>     self.assertEqual(t.device.type, 'xla')\nE   AssertionError"
    assert upstream.device_type_only({"message": "AssertionError: 'jax' != 'xla'", "detail": src})
    assert not upstream.device_type_only({"message": "RuntimeError: shape mismatch", "detail": src})


def test_report_counts_and_groups():
    results = [
        {
            "path": "test/test_a.py",
            "kind": "test",
            "rc": 1,
            "timed_out": False,
            "seconds": 3.0,
            "cases": [
                {"id": "a::t1", "phase": "call", "outcome": "passed", "message": ""},
                {"id": "a::t2", "phase": "call", "outcome": "failed", "message": "ValueError: 3"},
                {"id": "a::t3", "phase": "call", "outcome": "failed", "message": "ValueError: 4"},
                {"id": "a::t4", "phase": "call", "outcome": "failed", "message": "'jax' != 'xla'"},
                {"id": "a::t5", "phase": "call", "outcome": "skipped", "message": "no TPU"},
            ],
        },
        {
            "path": "test/test_b.py",
            "kind": "test",
            "rc": 2,
            "timed_out": False,
            "seconds": 1.0,
            "cases": [
                {
                    "id": "test/test_b.py",
                    "phase": "collect",
                    "outcome": "error",
                    "message": "ModuleNotFoundError: No module named 'torch_xla.foo': ...",
                }
            ],
        },
        {
            "path": "examples/train.py",
            "kind": "example",
            "rc": 0,
            "timed_out": False,
            "seconds": 9.0,
            "args": [],
            "losses": [2.0, 1.0],
        },
    ]
    text = upstream.report(results, {"test/test_pallas.py": "Pallas"}, "/nonexistent", 120)
    assert (
        "Test cases: 1 passed, 3 failed (1 of them only because the device type is `jax`)" in text
    )
    assert "- **2** `ValueError: N`: `a::t2`, `a::t3`" in text
    assert "| `torch_xla.foo` | 1: test_b.py |" in text
    assert "| test/test_b.py | import error |" in text
    assert "Examples: 1 of 1 run to the end (1 with a falling loss)" in text
    assert "- `a::t4`:" in text


def test_end_to_end_on_a_tiny_checkout(tmp_path):
    """A unittest file importing torch_xla runs through the alias in its own process; a
    `__main__.f` patch works (the test module is `__main__`, as under `python file.py`)."""
    root = _checkout(tmp_path)
    (root / "test" / "test_tiny.py").write_text(
        textwrap.dedent(
            """
            import unittest
            from unittest import mock
            import torch
            import torch_xla
            import torch_xla.core.xla_env_vars as xenv

            def helper():
                return 1

            class T(unittest.TestCase):
                def test_add(self):
                    t = torch.ones(2, device=torch_xla.device()) + 1
                    self.assertEqual(t.cpu().tolist(), [2.0, 2.0])

                def test_env(self):
                    self.assertEqual(xenv.PJRT_DEVICE, "PJRT_DEVICE")

                @mock.patch("__main__.helper")
                def test_patch_main(self, m):
                    m.return_value = 5
                    import __main__
                    self.assertEqual(__main__.helper(), 5)

                def test_fails(self):
                    raise ValueError("boom 3")
            """
        )
    )
    out = tmp_path / "doc.md"
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "lazyxla.tools.upstream", str(root), "--out", str(out)]
        + ["--results-dir", str(results), "--timeout", "100"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((results / "test__test_tiny.py.json").read_text())
    outcomes = {c["id"].split("::")[-1]: c["outcome"] for c in record["cases"]}
    assert outcomes == {
        "test_add": "passed",
        "test_env": "passed",
        "test_patch_main": "passed",
        "test_fails": "failed",
    }
    text = out.read_text()
    assert "| test/test_tiny.py | ran | 4 | 3 | 1 | 0 | 0 |" in text
    assert "`ValueError: boom N`" in text


def test_watch_kills_past_the_memory_limit_and_the_timeout():
    code = (
        "import time; x = bytearray(300 * 2**20); x[::4096] = b'1' * len(x[::4096]); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    rc, timed_out, over = upstream._watch(proc, timeout=50, memory_limit=100 * 2**20)
    assert over and not timed_out and rc != 0
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    rc, timed_out, over = upstream._watch(proc, timeout=1, memory_limit=0)
    assert timed_out and not over
