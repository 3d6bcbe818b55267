"""The conformance tool (`python -m lazyxla.tools.upstream`): run_tests.sh parsing, failure
grouping, the device-type classification, the report, and one end-to-end run of a tiny checkout."""

import json
import os
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
    # torchvision from a directory given with --torchvision (here a fake one without C++ ops).
    (root / "test" / "test_tv.py").write_text(
        "import torchvision\n\n\ndef test_model():\n    assert torchvision.models.tiny()\n"
    )
    # A test that imports a module of examples/ without adding the folder to its path.
    (root / "examples" / "shared_model.py").write_text("SIZE = 3\n")
    (root / "test" / "test_ex.py").write_text(
        "from shared_model import SIZE\n\n\ndef test_size():\n    assert SIZE == 3\n"
    )
    tv = _fake_torchvision(tmp_path / "tv")
    out = tmp_path / "doc.md"
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "lazyxla.tools.upstream", str(root), "--out", str(out)]
        + ["--results-dir", str(results), "--timeout", "100", "--torchvision", str(tv)],
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
    assert "| test/test_tv.py | ran | 1 | 1 | 0 | 0 | 0 |" in text
    assert "| test/test_ex.py | ran | 1 | 1 | 0 | 0 | 0 |" in text
    assert "torchvision 0.99.0+fake (not a dependency of lazyxla)" in text


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


# --- torchvision from a directory outside the repo (`--torchvision DIR`) -----------------------

_FAKE_TORCHVISION = {
    # A torchvision whose C++ extension does not load: `_has_ops()` is False, and its
    # `_meta_registrations` registers a fake kernel for `torchvision::nms` unguarded (as 0.28 does).
    "torchvision/__init__.py": "from torchvision import extension, _meta_registrations, models\n",
    "torchvision/version.py": "__version__ = '0.99.0+fake'\n",
    "torchvision/extension.py": "def _has_ops():\n    return HAS_OPS\n\n\nHAS_OPS = False\n",
    "torchvision/_meta_registrations.py": textwrap.dedent(
        """
        import torch

        @torch.library.register_fake("torchvision::nms")
        def meta_nms(dets, scores, iou_threshold):
            return dets.new_empty(0, dtype=torch.long)
        """
    ),
    "torchvision/models.py": "import torch\n\n\ndef tiny():\n    return torch.nn.Linear(2, 1)\n",
}


def _fake_torchvision(root: Path, has_ops: bool = False) -> Path:
    for rel, text in _FAKE_TORCHVISION.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    if has_ops:  # a working build: `_C` defines the schemas itself
        (root / "torchvision" / "extension.py").write_text(
            "import torch\n\n_lib = torch.library.Library('torchvision', 'DEF')\n"
            "_lib.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')\n\n\n"
            "def _has_ops():\n    return True\n"
        )
    return root


def _python_with_site(
    tmp_path: Path, code: str, env: dict[str, str]
) -> subprocess.CompletedProcess:
    site = upstream._support_dir(str(tmp_path / "results"))
    full = {k: v for k, v in os.environ.items() if not k.startswith("LAZYXLA_")}
    full.update(env)
    full["PYTHONPATH"] = site + ":" + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", code],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


_IMPORT_AND_CALL = """
import torch, torchvision
print("imported", torchvision.models.tiny().weight.shape[1])
try:
    torch.ops.torchvision.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
except RuntimeError as e:
    print("raised", e)
"""


def test_torchvision_without_its_c_ops_imports_and_its_ops_raise(tmp_path):
    tv = _fake_torchvision(tmp_path / "tv")
    plain = _python_with_site(tmp_path, _IMPORT_AND_CALL, {"PYTHONPATH": str(tv)})
    assert "operator torchvision::nms does not exist" in plain.stderr  # what the tool fixes
    fixed = _python_with_site(
        tmp_path,
        _IMPORT_AND_CALL,
        {"PYTHONPATH": str(tv), upstream.TORCHVISION_ENV: str(tv)},
    )
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert "imported 2" in fixed.stdout
    assert "raised torchvision::nms is unavailable: torchvision's C++ extension (_C)" in (
        fixed.stdout
    )


def test_a_working_torchvision_keeps_its_own_ops(tmp_path):
    tv = _fake_torchvision(tmp_path / "tv", has_ops=True)
    code = "import torch, torchvision\nprint(torch.ops.torchvision.nms.default._schema)"
    proc = _python_with_site(
        tmp_path, code, {"PYTHONPATH": str(tv), upstream.TORCHVISION_ENV: str(tv)}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torchvision::nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor" in (
        proc.stdout
    )


def test_resnet_examples_are_shrunk_as_they_import_their_base(tmp_path):
    (tmp_path / "train_resnet_base.py").write_text(
        textwrap.dedent(
            """
            class TrainResNetBase:
                def __init__(self):
                    self.img_dim = 224
                    self.batch_size = 128
                    self.num_steps = 300
                    self.num_epochs = 1
                    self.batch_size *= 4  # as the SPMD example scales it
                    self.shape = (self.batch_size, 3, self.img_dim, self.img_dim)
            """
        )
    )
    imported = (
        "import train_resnet_base as b; t = b.TrainResNetBase(); print(t.shape, t.num_epochs)"
    )
    # The base example itself runs as `__main__`.
    as_main = (
        "import runpy; t = runpy.run_path('train_resnet_base.py')['TrainResNetBase'](); "
        "print(t.shape, t.num_epochs)"
    )
    shrink = {"PYTHONPATH": str(tmp_path), upstream.SHRINK_ENV: json.dumps(upstream.SHRINK_RESNET)}
    for code in (imported, as_main):
        proc = _python_with_site(tmp_path, code, shrink)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() == ["(8,", "3,", "32,", "32)", "1"]
    plain = _python_with_site(tmp_path, imported, {"PYTHONPATH": str(tmp_path)})
    assert plain.stdout.split() == ["(512,", "3,", "224,", "224)", "1"]


def test_test_files_that_are_programs_run_as_examples_with_their_flags(tmp_path):
    root = _checkout(tmp_path)
    (root / "test" / "test_train_mp_mnist.py").write_text("")
    items, _ = upstream.discover(str(root))
    [item] = items
    assert (item.kind, item.path) == ("example", "test/test_train_mp_mnist.py")
    assert "--fake_data" in item.args and item.env["CPU_NUM_DEVICES"] == "1"
    # test_utils.print_training_update prints `Loss=`.
    out = upstream._example_outcome("| Training Step=0 Loss=2.30 |\n| Training Step=20 Loss=0.5 |")
    assert out["losses"] == [2.3, 0.5]


def test_the_sharding_strategies_script_runs_as_a_small_spmd_program(tmp_path):
    # It parses its flags at import (pytest's own flags made it exit with rc 3): a program, run on
    # the 4 devices its default `--ici_fsdp_parallelism=4` mesh needs, at a CPU-sized batch.
    root = _checkout(tmp_path)
    (root / "test" / "spmd" / "test_sharding_strategies.py").write_text("")
    [item] = upstream.discover(str(root))[0]
    assert (item.kind, item.env["CPU_NUM_DEVICES"]) == ("example", "4")
    assert "--batch_size=16" in item.args and "--num_layers=2" in item.args


def test_torchvision_dir_must_hold_torchvision(tmp_path):
    root = _checkout(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "lazyxla.tools.upstream", str(root), "--torchvision", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "has no torchvision/__init__.py" in proc.stderr


def test_resnet_examples_get_their_shrink_and_device_count(tmp_path):
    root = _checkout(tmp_path)
    (root / "examples" / "data_parallel").mkdir()
    for name in ("train_resnet_ddp.py", "train_resnet_spmd_data_parallel.py"):
        (root / "examples" / "data_parallel" / name).write_text("")
    items, _ = upstream.discover(str(root))
    env = {Path(i.path).name: i.env for i in items}
    assert json.loads(env["train_resnet_ddp.py"][upstream.SHRINK_ENV]) == upstream.SHRINK_RESNET
    # One process per device, each with a ResNet-50: 2 of them, not 4.
    assert env["train_resnet_ddp.py"]["CPU_NUM_DEVICES"] == "2"
    assert env["train_resnet_spmd_data_parallel.py"]["CPU_NUM_DEVICES"] == "4"  # one process


def test_reference_run_under_another_torch_xla_and_the_comparison(tmp_path):
    """--reference-python runs the test files with the torch_xla installed for that interpreter
    (here a stand-in on PYTHONPATH), not the checkout's source tree nor the alias; the report
    then counts, of the cases the reference passes, how many lazyxla passes."""
    root = _checkout(tmp_path / "ptxla")
    (root / "test" / "__init__.py").write_text("")  # as in pytorch/xla: test/ is a package
    (root / "torch_xla").mkdir()
    (root / "torch_xla" / "__init__.py").write_text("WHICH = 'checkout source tree'\n")
    installed = tmp_path / "installed"
    (installed / "torch_xla").mkdir(parents=True)
    (installed / "torch_xla" / "__init__.py").write_text("WHICH = 'installed'\n")
    (root / "test" / "test_ref.py").write_text(
        textwrap.dedent(
            """
            import torch_xla

            def test_which():  # the alias has no WHICH: passes only under the reference
                assert torch_xla.WHICH == "installed"

            def test_both():
                pass

            def test_neither():
                raise ValueError("no")
            """
        )
    )

    def tool(*args: str, pythonpath: str | None = None) -> None:
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        proc = subprocess.run(
            [sys.executable, "-m", "lazyxla.tools.upstream", str(root), "--timeout", "100", *args],
            capture_output=True,
            text=True,
            timeout=150,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]

    ref, ours, out = tmp_path / "ref", tmp_path / "ours", tmp_path / "doc.md"
    tool("--results-dir", str(ref), "--reference-python", sys.executable, pythonpath=str(installed))
    assert not out.exists()
    record = json.loads((ref / "test__test_ref.py.json").read_text())
    outcomes = {c["id"].split("::")[-1]: c["outcome"] for c in record["cases"]}
    assert outcomes == {"test_which": "passed", "test_both": "passed", "test_neither": "failed"}
    tool("--results-dir", str(ours), "--reference-results", str(ref), "--out", str(out))
    text = out.read_text()
    assert (
        "of the 2 cases it passes (device-type-only cases excluded), lazyxla passes 1 (50.0 %)"
        in text
    )
    assert "- `test/test_ref.py::test_which`: failed" in text


def test_outcomes_tell_subtests_of_one_id_apart():
    # pytest reports each subtest under its test's id (test_core_aten_ops.py: 9 per test)
    case = lambda i, o, phase="call": {"id": i, "phase": phase, "outcome": o}  # noqa: E731
    ran = [{"cases": [case("t::a", "passed"), case("t::a", "failed"), case("t::b", "passed")]}]
    assert upstream._outcomes(ran) == {"t::a": "passed", "t::a#1": "failed", "t::b": "passed"}
    torn = [{"cases": [case("t::a", "passed"), case("t::a", "error", "teardown")]}]
    assert upstream._outcomes(torn) == {"t::a": "error"}
