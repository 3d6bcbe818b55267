"""The `torch_xla` alias, the `_XLAC` stand-in, `lazyxla run`, and an unmodified torch_xla
script."""

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lazyxla
import lazyxla.compat
import lazyxla.debug.metrics as met
from lazyxla._src import graph

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "torch_xla_style_train.py"
LAZYXLA_BIN = Path(sys.executable).parent / "lazyxla"
dev = lazyxla.device()


@pytest.fixture(scope="module", autouse=True)
def alias():
    lazyxla.compat.install()
    yield
    lazyxla.compat.uninstall()
    graph.set_allow_execution(True)


def test_alias_resolves_to_lazyxla_modules():
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as tmet
    import torch_xla.debug.profiler as xp
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.experimental
    import torch_xla.runtime as xr
    import torch_xla.utils.utils as xu

    import lazyxla.core.xla_model
    import lazyxla.debug.profiler
    import lazyxla.distributed.parallel_loader
    import lazyxla.experimental
    import lazyxla.runtime
    import lazyxla.utils.utils

    assert xm is lazyxla.core.xla_model and xr is lazyxla.runtime and tmet is met
    assert xp is lazyxla.debug.profiler and pl is lazyxla.distributed.parallel_loader
    assert xu is lazyxla.utils.utils and torch_xla.experimental is lazyxla.experimental
    assert torch_xla.device() == lazyxla.device() == xm.xla_device()
    assert torch_xla.runtime is xr and torch_xla.core.xla_model is xm
    assert torch_xla.__version__.startswith("2.9")
    assert torch_xla.sync is lazyxla.sync and torch_xla.compile is lazyxla.compile
    assert torch_xla.devices() == lazyxla.devices()
    with pytest.raises(ModuleNotFoundError, match="lazyxla.nothing_here"):
        import torch_xla.nothing_here  # noqa: F401


def test_spmd_maps_lazily():
    if importlib.util.find_spec("lazyxla.distributed.spmd") is None:
        with pytest.raises(ModuleNotFoundError, match="lazyxla.distributed.spmd"):
            importlib.import_module("torch_xla.distributed.spmd")
    else:
        xs = importlib.import_module("torch_xla.distributed.spmd")
        assert xs is importlib.import_module("lazyxla.distributed.spmd")


def test_dynamo_bridge_and_openxla_backend():
    import torch_xla.core.dynamo_bridge as db

    assert db.is_xla_tensor(torch.ones(1, device=dev))
    gm = torch.fx.symbolic_trace(lambda x, y: (x @ y).relu())
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    run = db.extract_compiled_graph(gm, (a.to(dev), b.to(dev)))
    (out,) = run(a.to(dev), b.to(dev))
    torch.testing.assert_close(out.cpu(), (a @ b).relu())
    f = torch.compile(lambda x: x.sin() * 2, backend="openxla")
    torch.testing.assert_close(f(a.to(dev)).cpu(), a.sin() * 2)


def test_xlac_debug_entry_points():
    import torch_xla._XLAC as X

    a = torch.ones(2, 3, device=dev)
    t = (a @ torch.full((3, 4), 0.5, device=dev) + 1).relu()
    assert X._get_xla_tensors_text([t]) == lazyxla.debug.ir_text([t])
    assert X._get_xla_tensors_text([t]).startswith("IR {")
    assert "HloModule" in X._get_xla_tensors_hlo([t])
    assert X._get_xla_sharding_spec(t) == ""
    assert X._get_xla_sharding_type(t) is None
    h1 = X._get_graph_hash([t])
    u = (torch.randn(2, 3).to(dev) @ torch.randn(3, 4).to(dev) + 1).relu()
    v = (torch.randn(2, 3).to(dev) @ torch.randn(3, 4).to(dev) + 1).relu()
    w = (torch.randn(2, 5).to(dev) @ torch.randn(5, 4).to(dev) + 1).relu()
    assert isinstance(h1, bytes) and len(h1) == 16
    assert X._get_graph_hash([u]) == X._get_graph_hash([v]) != X._get_graph_hash([w])
    met.clear_all()
    X._xla_increment_counter("MyCounter", 3)
    assert met.counter_value("MyCounter") == 3
    assert "Counter: MyCounter\n  Value: 3" in X._xla_metrics_report()
    X._init_computation_client()
    X._set_allow_execution(False)
    try:
        with pytest.raises(RuntimeError, match="Unexpected execution happens"):
            t.sum().item()
    finally:
        X._set_allow_execution(True)
    assert t.sum().item() == pytest.approx(8 * 2.5)


def test_xlac_mat_mul_precision():
    import torch_xla._XLAC as X

    try:
        X._xla_set_mat_mul_precision("highest")
        assert X._xla_get_mat_mul_precision() == "highest"
        with pytest.raises(ValueError, match="not one of"):
            X._xla_set_mat_mul_precision("extreme")
    finally:
        X._xla_set_mat_mul_precision("default")


def test_install_refuses_a_real_torch_xla(tmp_path, monkeypatch):
    fake = tmp_path / "torch_xla"
    fake.mkdir()
    (fake / "__init__.py").write_text("REAL = True\n")
    lazyxla.compat.uninstall()
    try:
        monkeypatch.syspath_prepend(str(tmp_path))
        assert lazyxla.compat.real_torch_xla() is not None
        with pytest.raises(RuntimeError, match="a real torch_xla is installed.*will not shadow"):
            lazyxla.compat.install()
        assert not lazyxla.compat.is_installed()
    finally:
        monkeypatch.undo()
        sys.modules.pop("torch_xla", None)
        lazyxla.compat.install()
    assert lazyxla.compat.is_installed()


# --- lazyxla run ---------------------------------------------------------------------------------


def run_cli(args, via_module=False, timeout=180):
    cmd = [sys.executable, "-m", "lazyxla"] if via_module else [str(LAZYXLA_BIN)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def test_run_behaves_like_python_script(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        "import sys, torch_xla, torch_xla.core.xla_model as xm\n"
        f"print(__name__, sys.argv[1:], sys.path[0] == {str(tmp_path)!r}, xm.xla_device())\n"
        "if '--exit' in sys.argv: sys.exit(3)\n"
    )
    r = run_cli(["run", str(script), "a", "--flag", "1"], via_module=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "__main__ ['a', '--flag', '1'] True jax:0"
    assert run_cli(["run", str(script), "--exit"], via_module=True).returncode == 3
    missing = run_cli(["run", str(tmp_path / "nope.py")], via_module=True)
    assert missing.returncode == 2 and "can't open file" in missing.stderr


def test_run_shows_the_scripts_own_traceback(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("def inner():\n    raise ValueError('boom 42')\n\n\ninner()\n")
    r = run_cli(["run", str(script)])
    assert r.returncode == 1
    err = r.stderr
    assert err.startswith("Traceback (most recent call last):"), err
    assert f'File "{script}", line 5, in <module>' in err
    assert f'File "{script}", line 2, in inner' in err
    assert err.rstrip().endswith("ValueError: boom 42")
    assert "runpy" not in err and "__main__.py" not in err


# --- the unmodified torch_xla training script ----------------------------------------------------

_STEP = re.compile(r"^step (\d+) loss ([0-9.]+)$", re.M)
STEPS = 6


def eager_losses(steps: int) -> list[float]:
    spec = importlib.util.spec_from_file_location("torch_xla_style_train", EXAMPLE)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)  # imports torch_xla: the alias is installed
    model = ex.make_model(0)
    opt = ex.make_optimizer(model, 0.05)
    losses = []
    for x, y in ex.make_data(steps, 16, 0):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_torch_xla_style_script_matches_eager_and_is_deterministic():
    runs = []
    for via_module in (False, True):
        r = run_cli(["run", str(EXAMPLE), "--steps", str(STEPS)], via_module=via_module)
        assert r.returncode == 0, r.stderr
        found = _STEP.findall(r.stdout)
        assert [int(s) for s, _ in found] == list(range(STEPS))
        assert "Metric: CompileTime" in r.stdout and "Counter: MarkStep" in r.stdout
        runs.append([float(v) for _, v in found])
    assert runs[0] == runs[1]  # same seeds, same losses
    torch.testing.assert_close(runs[0], eager_losses(STEPS), rtol=1e-5, atol=1e-6)
