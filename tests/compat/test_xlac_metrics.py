"""The `_XLAC` entry points tests and debug tools use, the metrics torch_xla reports
(ExecuteTime measured to completion, TensorToData, eager-mode names), PT_XLA_DEBUG_FILE, the
'xla' device spelling, and CPU_NUM_DEVICES / PJRT_DEVICE read at first device use."""

import os
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
import torch

import lazyxla
import lazyxla.compat
import lazyxla.debug.metrics as met

dev = lazyxla.device()


@pytest.fixture(scope="module", autouse=True)
def alias():
    lazyxla.compat.install()
    yield
    lazyxla.compat.uninstall()


def test_tensor_debug_info_before_and_after_sync():
    import torch_xla

    X = torch_xla._XLAC
    assert "Not a XLATensor" in X._get_xla_tensor_debug_info(torch.randn(5))
    t2 = torch.randn(5).to(dev) + 5
    info = X._get_xla_tensor_debug_info(t2)
    assert "XLA Shape: f32[5]" in info and "aten::add" in info and "XLAData: None" in info
    torch_xla.sync()
    info = X._get_xla_tensor_debug_info(t2)
    assert "XLAData: None" not in info and "Data Shape: f32[5]" in info and "IR: None" in info


def test_device_data_nodes_and_tensor_ids():
    import torch_xla

    X = torch_xla._XLAC
    a, b = torch.randn(3).to(dev), torch.randn(3).to(dev)
    out = a * b + a
    ids, tensors = X._get_tensors_xla_device_data_node([out])
    assert sorted(ids) == sorted([X._xla_get_tensor_id(a), X._xla_get_tensor_id(b)])
    by_id = dict(zip(ids, tensors))
    torch.testing.assert_close(by_id[X._xla_get_tensor_id(a)].cpu(), a.cpu())
    assert X._check_tensor_need_materialization([out, a]) == [True, False]
    assert X._check_tensor_need_materialization([torch.randn(3)]) == [False]  # a CPU tensor


def test_dynamo_bridge_seed_and_pending_ir_entries():
    """The seed entries of torch_xla's dynamo bridge, and `_clear_pending_irs`: pending values
    are dropped (nothing runs, a later sync runs nothing), data stays."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    X = torch_xla._XLAC
    assert X._get_seed_info_id() == -127389
    xm.set_rng_state(23, str(dev))
    assert X._get_base_seed_as_tensor(str(dev)).item() == 23
    torch_xla.sync()
    a = torch.randn(4, 5).to(dev)
    b = a + 1
    c = b * a
    X._xla_sync_multi([c], devices=[], wait=True)
    assert "aten::add" in X._get_xla_tensors_text([b])
    met.clear_all()
    X._clear_pending_irs(str(dev))
    assert "aten::add" not in X._get_xla_tensors_text([b])
    assert X._check_tensor_need_materialization([a, b, c]) == [False, False, False]
    torch_xla.sync()
    assert met.counter_value("ExecuteComputation") is None
    assert b.shape == (4, 5) and b.dtype == torch.float32


def test_buffer_donation_flag_is_honoured():
    import torch_xla

    X = torch_xla._XLAC
    w = torch.zeros(4, device=dev) + 1
    assert X._set_buffer_donation(w, True) is False  # pending: no buffer yet
    torch_xla.sync()
    assert X._set_buffer_donation(w, True) is True and X._get_buffer_donation(w)
    met.clear_all()
    v = w * 2  # w stays alive, but its buffer was donated: XLA may reuse it for v
    torch_xla.sync()
    assert met.metric_data("InputOutputAliasCount").accumulator == 1
    torch.testing.assert_close(v.cpu(), torch.full((4,), 2.0))
    assert X._set_buffer_donation(v, False) and not X._get_buffer_donation(v)


def test_dot_general_matches_einsum():
    import torch_xla

    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    out = torch_xla._XLAC._xla_dot_general(a.to(dev), b.to(dev), (([2], [1]), ([0], [0])))
    torch.testing.assert_close(out.cpu(), torch.bmm(a, b), rtol=1e-5, atol=1e-5)
    # negative dims count from the end
    out = torch_xla._XLAC._xla_dot_general(a.to(dev), b.to(dev), (([-1], [-2]), ([0], [0])))
    torch.testing.assert_close(out.cpu(), torch.bmm(a, b), rtol=1e-5, atol=1e-5)
    # int8 operands accumulate in the preferred int32: sums of products past int8's range are exact
    x, w = (
        torch.randint(-15, 15, (3, 16), dtype=torch.int8),
        torch.randint(-15, 15, (16, 2)).to(torch.int8),
    )
    out = torch_xla._XLAC._xla_dot_general(
        x.to(dev), w.to(dev), (([1], [0]), ()), preferred_element_type=torch.int32
    )
    assert out.dtype == torch.int32
    expected = x.int() @ w.int()
    assert expected.abs().max() > 127
    torch.testing.assert_close(out.cpu(), expected)
    with pytest.raises(IndexError, match="lhs dim 3 out of range"):
        torch_xla._XLAC._xla_dot_general(a.to(dev), b.to(dev), (([3], [1]), ()))


def test_warm_up_cache_compiles_without_running():
    import torch_xla

    met.clear_all()
    x = torch.randn(4, device=dev) * 3
    torch_xla._XLAC._xla_warm_up_cache([x], [])
    assert met.counter_value("UncachedCompile") == 1 and met.metric_data("ExecuteTime") is None
    x.cpu()
    assert met.counter_value("CachedCompile") == 1


def _matmul_chain(a: torch.Tensor) -> torch.Tensor:
    b = a
    for _ in range(8):
        b = b @ a / 600
    return b


def _waited_run_ns(a: torch.Tensor) -> float:
    """The chain's execution time when the caller waits for it (min of two warm runs)."""
    runs = []
    for _ in range(3):
        met.clear_metrics()
        b = _matmul_chain(a)  # (kept alive: a sync runs live tensors)
        lazyxla.sync(wait=True)
        del b
        runs.append(met.metric_data("ExecuteTime").accumulator)
    return min(runs[1:])


@pytest.mark.parametrize("exact", [False, True], ids=["seen-ready", "exact-thread"])
def test_execute_time_covers_the_execution_and_tensor_to_data_is_counted(monkeypatch, exact):
    from lazyxla._src.config import FLAGS

    monkeypatch.setattr(FLAGS, "exact_execute_time", exact)
    threads_before = {t.name for t in threading.enumerate()}
    met.clear_all()
    a = torch.randn(600, 600).to(dev)
    assert met.metric_data("TensorToData").total_samples == 1
    waited = _waited_run_ns(a)
    met.clear_metrics()
    b = _matmul_chain(a)
    lazyxla.sync()  # dispatched, not waited for: the call returns before the results exist
    b.cpu()
    data = met.metric_data("ExecuteTime")
    assert data.total_samples == 1
    # Note [ExecuteTime]: the sample runs to the results, not to the dispatch (~0.15 ms, a few
    # thousandths of this chain's run); a quarter of a waited run leaves room for a noisy CPU.
    assert data.accumulator >= 0.25 * waited
    timer_started = "lazyxla-execute-timer" in {t.name for t in threading.enumerate()}
    if exact:
        assert timer_started
    else:  # by default no thread: it cost the caller ~0.16 ms per execution
        assert timer_started == ("lazyxla-execute-timer" in threads_before)


def test_execute_time_of_executions_nobody_waits_for_is_recorded_when_metrics_are_read():
    a = torch.randn(600, 600).to(dev)
    lazyxla.sync(wait=True)
    met.clear_metrics()
    for _ in range(3):  # an asynchronous loop: each step dispatched, none waited for
        a = _matmul_chain(a)
        lazyxla.sync()
    data = met.metric_data("ExecuteTime")  # waits for the executions still running
    assert data.total_samples == 3
    assert all(value > 0 for _, value in data.samples)


def test_device_data_cache_shares_scalar_uploads():
    import torch_xla

    met.clear_all()
    a = torch.tensor(2077.125, device=dev)  # a value no other test uploads (the cache persists)
    b = torch.tensor(2077.125, device=dev)
    assert met.counter_value("DeviceDataCacheMiss") == 1
    neg, pos = torch.tensor(-0.0, device=dev), torch.tensor(0.0, device=dev)
    assert torch.signbit(neg.cpu()) and not torch.signbit(pos.cpu())  # keyed by bits
    b.add_(1)  # lazy values: sharing the upload never lets one tensor change another
    assert a.item() == 2077.125 and b.item() == 2078.125
    assert torch_xla._XLAC._set_buffer_donation(a, True) is False  # shared: never donated


def test_device_data_cache_shares_empty_uploads():
    """transformers' DynamicCache uploads `torch.tensor([])` per layer per forward."""
    empty = torch.zeros(0, 7, 3, dtype=torch.int16)  # a shape no other test uploads
    first = empty.to(dev)
    handles = met.counter_value("CreateDataHandles") or 0
    second = empty.to(dev)
    assert (met.counter_value("CreateDataHandles") or 0) == handles
    grown = torch.cat([second, torch.ones(2, 7, 3, dtype=torch.int16, device=dev)])
    assert first.shape == (0, 7, 3) and torch.equal(grown.cpu(), torch.ones(2, 7, 3).short())


def test_set_ir_debug_records_source_lines():
    import torch_xla

    X = torch_xla._XLAC
    saved = X._get_ir_debug()
    try:
        X._set_ir_debug(True)
        assert X._get_ir_debug()
        t = torch.randn(3, device=dev) * 2
        assert "test_xlac_metrics.py" in torch_xla._XLAC._get_xla_tensors_text([t])
    finally:
        X._set_ir_debug(saved)


def test_markstep_is_counted_when_the_step_raises():
    met.clear_all()
    with pytest.raises(RuntimeError):
        with lazyxla.compile(full_graph=True):
            (torch.ones(2, device=dev) + 1).item()
    assert met.counter_value("MarkStep") == 2  # entry and exit, as torch_xla's finally
    met.clear_all()
    with pytest.raises(RuntimeError, match="Expected error"):
        with lazyxla.step():
            torch.ones((3, 3), device=dev)
            raise RuntimeError("Expected error")
    assert met.counter_value("MarkStep") == 2


def test_xla_device_spelling():
    x = torch.rand(3, device="xla")
    assert x.device == dev
    y = torch.ones(2, 2).to("xla:0")
    z = torch.tensor([1.0, 2.0], device=torch.device("xla"))
    m = torch.nn.Linear(2, 2).to("xla")
    assert y.device == z.device == m.weight.device == dev
    torch.testing.assert_close(torch.arange(4, device="xla").cpu(), torch.arange(4))
    torch.testing.assert_close(torch.full((2,), 3.0, device="xla").cpu(), torch.full((2,), 3.0))
    out = m(y).sum()
    out.backward()
    assert m.weight.grad.device == dev


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("CPU_NUM_DEVICES", "PJRT_DEVICE")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
    )


def test_debug_file_and_lazy_device_env(tmp_path):
    log = tmp_path / "debug.txt"
    proc = _run(
        """
        import os, torch, lazyxla.compat
        lazyxla.compat.install()
        import torch_xla, torch_xla.runtime as xr
        os.environ["CPU_NUM_DEVICES"] = "4"   # after the import, before the first device use
        os.environ["PJRT_DEVICE"] = "CPU"
        print(xr.global_runtime_device_count())
        (torch.ones(2, device=torch_xla.device()) + 1).cpu()
        """,
        PT_XLA_DEBUG_LEVEL="1",
        PT_XLA_DEBUG_FILE=str(log),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "4"
    assert "Compilation Analysis" in log.read_text()
    assert "Compilation Analysis" not in proc.stderr


def test_fallback_ops_and_transfer_kernels_are_named_as_torch_xla_names_them():
    from lazyxla._src import metrics

    met.clear_all()
    x = torch.tensor([0.0, 1.5, 0.0, 2.0])
    t = x.to(dev)  # an upload is a traced kernel, as every torch_xla kernel is
    assert met.counter_value("xla::_to_copy") == 1
    assert met.metric_data("LazyTracing").total_samples == 1
    with warnings.catch_warnings():  # warned once per process, maybe by another test already
        warnings.simplefilter("ignore")
        r = torch.repeat_interleave(t.long(), t.long(), output_size=3)
    assert r.cpu().tolist() == torch.repeat_interleave(x.long(), x.long()).tolist()
    t.sum().item()
    # torch_xla's list: the counter names, overload and `.item()`'s read included
    assert met.executed_fallback_ops() == [
        "aten::_local_scalar_dense",
        "aten::repeat_interleave.Tensor",
    ]
    assert metrics.cpu_fallback_ops() == ["repeat_interleave.Tensor"]  # the ops that ran on the CPU


def test_input_output_alias_count_is_sampled_at_every_step_barrier():
    met.clear_all()
    a = torch.ones(3, device=dev) * 2
    lazyxla.sync()  # nothing donated (donation is off): a sample of 0, as torch_xla records it
    assert met.metric_data("InputOutputAliasCount")[:2] == (1, 0)
    (a + 1).cpu()  # a value read is not a step barrier
    assert met.metric_data("InputOutputAliasCount")[:2] == (1, 0)


def test_a_process_exiting_with_an_execution_in_flight_exits_cleanly():
    """Note [ExecuteTime]: nothing waits on an execution nobody reads, so exit waits for it;
    tearing the runtime down under a running execution crashed the process (SIGSEGV)."""
    code = textwrap.dedent(
        """
        import torch, lazyxla
        a = torch.randn(700, 700).to(lazyxla.device())
        for _ in range(12):
            a = torch.tanh(a @ a / 700)
        lazyxla.sync()  # dispatched; the process exits at once
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
