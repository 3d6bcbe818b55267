"""torch_xla's small modules, by behaviour: xla_env_vars, experimental.deprecation,
debug.metrics_compare_utils, backends (matmul precision), test.test_utils, _internal."""

import importlib
import logging
import sys

import jax
import pytest
import torch

import lazyxla
import lazyxla.compat
from lazyxla._src import graph

dev = lazyxla.device()


@pytest.fixture(scope="module", autouse=True)
def alias():
    lazyxla.compat.install()
    yield
    lazyxla.compat.uninstall()


def test_xla_env_vars_are_torch_xla_names():
    import torch_xla.core.xla_env_vars as xenv

    assert xenv.PJRT_DEVICE == "PJRT_DEVICE"
    assert xenv.CPU_NUM_DEVICES == "CPU_NUM_DEVICES"
    assert xenv.TPU_MESH_CTLER_ADDR == "TPU_MESH_CONTROLLER_ADDRESS"
    assert xenv.TPU_PROCESS_BOUNDS == "TPU_PROCESS_BOUNDS"


def _new() -> bool:
    return True


def test_deprecated_forwards_and_warns_once(caplog):
    from torch_xla.experimental.deprecation import deprecated, mark_deprecated

    this = sys.modules[__name__]
    old = deprecated(this, _new, "old_name", extra_msg="Gone in 3.0.")
    with caplog.at_level(logging.WARNING):
        assert old() is True
        assert old() is True
    msgs = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert msgs == [f"{__name__}.old_name is deprecated. Use {__name__}._new instead. Gone in 3.0."]

    @mark_deprecated(_new)
    def to_deprecate():
        return False  # never runs: the alias calls _new

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert to_deprecate() is True
    assert "to_deprecate is deprecated" in caplog.records[0].getMessage()


REPORT = """Metric: InboundData
  TotalSamples: 1728
  Accumulator: 10GB
  Percentiles: 1%=393.00KB; 5%=393.00KB; 10%=786.00KB; 20%=1.54MB; 50%=1.54MB; 80%=1.54MB; 90%=1.54MB; 95%=1.54MB; 99%=1.54MB
Metric: TransferToDeviceTime
  TotalSamples: 2616
  Accumulator: 01m29s615ms
  Percentiles: 1%=05m003ms; 5%=05m004ms; 10%=05m010ms; 20%=05m015ms; 50%=05m026ms; 80%=05m035ms; 90%=05m082ms; 95%=05m108ms; 99%=05m129ms
Counter: CachedSyncTensors
  Value: 11336
"""  # noqa: E501


def test_parse_metrics_report_dehumanizes_units():
    import torch_xla.debug.metrics_compare_utils as mcu

    p = mcu.parse_metrics_report(REPORT)
    assert p["InboundData__TotalSamples"] == 1728
    assert p["InboundData__Accumulator_mb"] == pytest.approx(10000.0)
    assert p["InboundData__Percentile_1_mb"] == pytest.approx(0.393)
    assert p["TransferToDeviceTime__Accumulator_sec"] == pytest.approx(89.615)
    assert p["TransferToDeviceTime__Percentile_99_sec"] == pytest.approx(300.129)
    assert p["CachedSyncTensors__Value"] == 11336


def test_compare_metrics_flags_outliers_and_new_fallbacks():
    import torch_xla.debug.metrics_compare_utils as mcu

    history = mcu.get_data_points_from_metrics_reports(
        ["Counter: CachedSyncTensors\n  Value: 10\n", "Counter: CachedSyncTensors\n  Value: 12\n"]
    )
    assert history["CachedSyncTensors__Value"] == [10, 12]
    ok = "Counter: CachedSyncTensors\n  Value: 11\n"
    assert mcu.compare_metrics(history, ok) == ""
    bad = "Counter: CachedSyncTensors\n  Value: 50\nCounter: aten::nonzero\n  Value: 3\n"
    diff = mcu.compare_metrics(history, bad).splitlines()
    assert diff[0].startswith("CachedSyncTensors__Value failed its expression check.")
    assert diff[1] == "Found new aten counter: aten::nonzero__Value: 3"
    loose = {"base_expression": "v <= v_mean + (v_stddev * 100.0)"}
    assert "CachedSyncTensors" not in mcu.compare_metrics(history, bad, loose)


def test_parse_our_own_report():
    import torch_xla.debug.metrics as met
    import torch_xla.debug.metrics_compare_utils as mcu

    met.clear_all()
    (torch.ones(3, device=dev) * 2).cpu()
    parsed = mcu.parse_metrics_report(met.metrics_report())
    assert parsed["ExecuteTime__TotalSamples"] >= 1
    assert parsed["ExecuteTime__Accumulator_sec"] > 0


def test_backends_matmul_precision_round_trip(caplog):
    import torch_xla.backends as backends

    saved = backends.get_mat_mul_precision()
    try:
        with caplog.at_level(logging.WARNING, logger=backends.logger.name):
            backends.set_mat_mul_precision("highest")
        assert caplog.records[0].getMessage() == backends._WARNING_MESSAGE
        assert backends.get_mat_mul_precision() == "highest"
        assert jax.config.jax_default_matmul_precision == "highest"
        a, b = torch.randn(8, 8), torch.randn(8, 8)
        ref = (a.double() @ b.double()).float()
        torch.testing.assert_close((a.to(dev) @ b.to(dev)).cpu(), ref)
        with pytest.raises(ValueError, match="Invalid precision"):
            backends.set_mat_mul_precision("BAD")
    finally:
        backends.set_mat_mul_precision(saved)
    assert backends.get_mat_mul_precision() == saved


def test_test_utils_prints_torch_xla_lines(capsys):
    import torch_xla.test.test_utils as tu

    tu.print_training_update(dev, 3, 0.123456, 10.0, 9.5, epoch=1)
    tu.print_test_update(dev, 98.765, epoch=1)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"| Training Device={dev}/0 Epoch=1 Step=3 Loss=0.12346 Rate=10.00")
    assert "GlobalRate=9.50 Time=" in out[0]
    assert out[1].startswith(f"| Test Device={dev}/0 Epoch=1 Accuracy=98.77 Time=")
    assert tu.get_summary_writer(None) is None

    class Writer:
        def __init__(self):
            self.scalars = []

        def add_scalar(self, k, v, step):
            self.scalars.append((k, v, step))

    w = Writer()
    tu.write_to_summary(w, 7, {"loss": 0.5}, write_xla_metrics=True)
    assert w.scalars[0] == ("loss", 0.5, 7)
    assert any(k == "aten_ops_sum" for k, _, _ in w.scalars)


def test_internal_utils_and_tpu_env(monkeypatch):
    from torch_xla._internal import tpu, utils

    assert utils.parse_xla_device("CPU:3") == ("CPU", 3)
    assert utils.parse_xla_device("bad") is None
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
    monkeypatch.delenv("ACCELERATOR_TYPE", raising=False)
    with pytest.raises(OSError, match="not a TPU host"):
        tpu.version()
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-16")
    monkeypatch.setenv("TPU_PROCESS_BOUNDS", "2,2,1")
    assert tpu.version() == 5
    assert tpu.get_tpu_type() == "v5litepod"
    assert tpu.process_bounds_size() == 4
    assert tpu.MeshShape.from_string("2,2,1") * (2, 1, 1) == (4, 2, 1)


def test_internal_pjrt_starts_a_process_also_for_one_device(monkeypatch):
    # as torch_xla's: process-wide state (a default process group) starts fresh in each call
    import operator
    import os

    from torch_xla._internal import pjrt

    monkeypatch.setenv("LAZYXLA_NUM_LOCAL_PROCESSES", "1")

    assert pjrt.run_multiprocess(operator.mul, 21, 2) == {0: 42}
    assert pjrt.run_multiprocess(os.getpid) != {0: os.getpid()}
    with pytest.raises(ValueError, match="Unsupported nprocs"):
        pjrt.spawn(print, nprocs=3)


def test_set_mat_mul_precision_invalidates_cache():
    import torch_xla.backends as backends

    graph.CACHE.clear()
    saved = backends.get_mat_mul_precision()
    importlib.import_module("torch_xla.backends")
    try:
        (torch.ones(2, 2, device=dev) @ torch.ones(2, 2, device=dev)).cpu()
        assert len(graph.CACHE) >= 1
        other = "high" if saved != "high" else "highest"
        backends.set_mat_mul_precision(other)
        assert len(graph.CACHE) == 0
    finally:
        backends.set_mat_mul_precision(saved)


def test_dynamo_bridge_helpers():
    import torch_xla._dynamo.config as config
    from torch_xla._dynamo.dynamo_bridge import GraphInputMatcher, NoneRemover

    assert config.skip_input_data_check is False
    r = NoneRemover()
    assert r.remove_nones([1, None, 2, None]) == [1, 2] and r.none_poslist == [1, 3]
    assert r.add_nones([1, 2]) == [1, None, 2, None]
    r = NoneRemover()
    assert r.remove_nones((None, 3)) == (3,) and r.add_nones((3,)) == (None, 3)
    with pytest.raises(TypeError):
        NoneRemover().remove_nones({1: None})

    weight = torch.ones(2)
    m = GraphInputMatcher({10: 1, 11: 0}, [11, 12, 10], [None, weight, None], {10, 11})
    a, b = torch.zeros(1), torch.zeros(2)
    got = m((a, b))
    assert got[0] is a and got[1] is weight and got[2] is b


def test_fork_rng_restores_the_device_rng_and_xm_attribute():
    import torch_xla
    from torch_xla._internal.jax_workarounds import jax_import_guard, maybe_get_jax, requires_jax

    with torch_xla.xm.fork_rng():
        torch_xla.xm.set_rng_state(42)
        a = torch.rand(3, device=dev).cpu()
    after = torch_xla.xm.get_rng_state()
    with torch_xla.xm.fork_rng():
        torch_xla.xm.set_rng_state(42)
        b = torch.rand(3, device=dev).cpu()
    assert torch.equal(a, b) and torch_xla.xm.get_rng_state() == after
    jax_import_guard()
    assert maybe_get_jax() is jax
    assert requires_jax(lambda x: x + 1)(1) == 2
