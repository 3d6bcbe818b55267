"""The torch_xla-shaped public API: `lazyxla.*`, `xm`, `xr`, `xp`, `pl`, `xu`, env variables."""

import copy
import io
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
import torch

import lazyxla
import lazyxla.core.xla_model as xm
import lazyxla.debug.metrics as met
import lazyxla.debug.profiler as xp
import lazyxla.distributed.parallel_loader as pl
import lazyxla.runtime as xr
import lazyxla.utils.utils as xu
from lazyxla._src import graph, step_closures
from lazyxla._src.tensor import state

dev = lazyxla.device()


def pending(t: torch.Tensor) -> bool:
    return state(t).is_pending


@pytest.fixture(autouse=True)
def _clean():
    yield
    graph.set_allow_execution(True)
    step_closures._pending.clear()


def run_py(code: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


# --- lazyxla top level ---------------------------------------------------------------------------


def test_step_syncs_on_entry_and_exit():
    before = torch.ones(2, device=dev) * 3
    met.clear_all()
    with lazyxla.step():
        assert not pending(before)  # work from before the step ran on entry
        y = before + 1
        assert pending(y)
    assert not pending(y)
    assert met.counter_value("MarkStep") == 2
    torch.testing.assert_close(y.cpu(), torch.full((2,), 4.0))


def test_compile_decorator_wrapper_and_context_manager():
    x = torch.arange(4.0).to(dev)

    @lazyxla.compile
    def f(x):
        return x.sin() + 1

    @lazyxla.compile(name="g")
    def g(x):
        return x * 2

    def h(x):
        return x - 1

    out = f(x)
    assert not pending(out) and f.__name__ == "f"
    assert not pending(g(x))
    hc = lazyxla.compile(h)
    assert not pending(hc(x))
    with lazyxla.compile():
        z = x * 5
        assert pending(z)
    assert not pending(z)
    torch.testing.assert_close(out.cpu(), torch.arange(4.0).sin() + 1)


def test_compile_full_graph_raises_torch_xla_error_on_forced_execution():
    x = torch.randn(3).to(dev)

    @lazyxla.compile(full_graph=True)
    def bad(x):
        return (x * 2).sum().item()

    with pytest.raises(RuntimeError, match="Unexpected execution happens inside the compiled"):
        bad(x)
    assert graph._allow_execution  # restored
    with pytest.raises(graph.ExecutionNotAllowed):
        with lazyxla.compile(full_graph=True):
            print((x + 1).cpu())

    @lazyxla.compile(full_graph=True)
    def good(x):
        return (x * 2).sum()

    assert good(x).item() == pytest.approx(2 * x.cpu().sum().item(), rel=1e-6)


def test_compile_max_different_graphs_names_the_change():
    @lazyxla.compile(max_different_graphs=1)
    def f(x):
        return x.cos() * 2

    f(torch.randn(4).to(dev))
    f(torch.randn(4).to(dev))  # new data, same graph
    with pytest.raises(
        RuntimeError, match=r"max_different_graphs=1.*input shapes changed.*f32\[5\]"
    ):
        f(torch.randn(5).to(dev))

    @lazyxla.compile(max_different_graphs=1)
    def g(x, square):
        return x * x if square else x + x

    x = torch.randn(3).to(dev)
    g(x, True)
    with pytest.raises(RuntimeError, match=r"g produced 2 different graphs.*aten::mul.*aten::add"):
        g(x, False)


def test_launch_single_process_calls_fn_with_index_zero():
    seen = []
    lazyxla.launch(lambda i, a, b: seen.append((i, a, b)), args=(1, 2), debug_single_process=True)
    assert seen == [(0, 1, 2)]


def test_launch_of_an_unpicklable_fn_says_how_to_fix_it():
    # CPU_NUM_DEVICES=8 here: launch starts 8 processes (tests/distributed run real launches)
    with pytest.raises(TypeError, match="Define fn at the top level"):
        lazyxla.launch(lambda i: None)


def test_long_lived_objects_leave_the_collector_after_compiles_without_sync():
    """Note [Keeping the collector off long-lived objects]: a loop whose step boundary is a value
    read (a generate() loop never calls sync()) still has its long-lived objects frozen after
    its compiles, at most 4 times; LAZYXLA_GC_FREEZE=0 leaves the collector as it is."""
    code = """
        import gc, torch, lazyxla
        x = torch.ones(8, device=lazyxla.device())
        counts = []
        for i in range(7):
            x = x * 2 + torch.arange(i + 1.0, device=x.device).sum()  # a new graph each time
            x.sum().item()  # the only sync: a value read
            counts.append(gc.get_freeze_count() > 0)
            gc.unfreeze()
        print(counts)
    """
    out = run_py(code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["[True,", "True,", "True,", "True,", "False,", "False,", "False]"]
    off = run_py(code, env={"LAZYXLA_GC_FREEZE": "0"})
    assert off.returncode == 0, off.stderr[-3000:]
    assert "True" not in off.stdout, off.stdout


# --- xm ------------------------------------------------------------------------------------------


def test_devices_ordinals_and_world():
    assert xm.xla_device() == dev and xm.xla_device(0) == dev
    assert xm.xla_device_hw(dev) == "CPU" and xm.xla_device_hw("jax:0") == "CPU"
    assert xm.xla_real_devices([dev]) == ["CPU:0"]
    assert xm.get_ordinal() == 0 and xm.get_local_ordinal() == 0
    assert xm.is_master_ordinal() and xm.is_master_ordinal(local=False)
    assert xm.xrt_world_size() == 1
    assert xm.is_xla_tensor(torch.ones(1, device=dev)) and not xm.is_xla_tensor(torch.ones(1))
    with pytest.raises(ValueError, match="not a lazyxla device"):
        xm.xla_device_hw("cpu")


def test_master_print(capsys):
    xm.master_print("hello", 3)
    assert capsys.readouterr().out == "hello 3\n"
    buf = io.StringIO()
    xm.master_print("x", fd=buf)
    assert buf.getvalue() == "x\n"


def test_mark_step_and_wait_device_ops():
    y = torch.ones(3, device=dev) * 2
    met.clear_all()
    xm.mark_step()
    assert not pending(y) and met.counter_value("MarkStep") == 1
    xm.wait_device_ops()
    torch.testing.assert_close(y.cpu(), torch.full((3,), 2.0))


def test_sync_wait_with_nothing_pending_waits_for_the_steps_dispatched_before():
    """`sync()` dispatches without waiting; a `sync(wait=True)` that finds nothing to run waits
    for them (torch_xla's barrier), so a loop closed by it has finished when it returns."""
    x = torch.randn(700, 700).to(dev)
    lazyxla.sync(wait=True)
    ys = []
    for _ in range(3):
        y = x
        for _ in range(12):
            y = torch.tanh(y @ x)
        ys.append(y)
        lazyxla.sync()  # dispatched
    lazyxla.sync(wait=True)
    assert all(state(y).value[0].data.is_ready() for y in ys)


def test_step_closures_run_after_the_step_without_extra_executions():
    x = torch.randn(4).to(dev)
    loss = (x * x).sum()
    seen = []
    met.clear_all()
    xm.add_step_closure(lambda v, tag: seen.append((tag, v.item())), args=(loss, "a"))
    xm.add_step_closure(lambda: seen.append("b"))
    assert seen == [] and pending(loss)
    xm.mark_step()
    assert [s if isinstance(s, str) else s[0] for s in seen] == ["a", "b"]
    assert seen[0][1] == pytest.approx((x.cpu() ** 2).sum().item(), rel=1e-6)
    assert met.counter_value("ExecuteComputation") == 1  # the closure's .item() ran no graph
    lazyxla.sync()
    assert len(seen) == 2  # closures run once


def test_async_step_closure_runs_on_another_thread_and_errors_surface():
    done = threading.Event()
    names = []
    xm.add_step_closure(lambda: (names.append(threading.current_thread().name), done.set()),
                        run_async=True)  # fmt: skip
    xm.mark_step()
    assert done.wait(10)
    assert names[0].startswith("lazyxla-step-closure")

    def boom():
        raise ValueError("closure failed")

    xm.add_step_closure(boom, run_async=True)
    xm.mark_step()
    with pytest.raises(RuntimeError, match="closure failed"):
        xm.wait_device_ops()


def test_optimizer_step_with_and_without_barrier():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 3, device=dev)).sum().backward()
    xm.optimizer_step(opt)
    assert pending(model.weight)
    model(torch.ones(2, 3, device=dev)).sum().backward()
    met.clear_all()
    xm.optimizer_step(opt, barrier=True)
    assert not pending(model.weight) and met.counter_value("MarkStep") == 1
    closure_calls = []
    xm.optimizer_step(opt, optimizer_args={"closure": lambda: closure_calls.append(1)})
    assert closure_calls == [1]


def test_save_moves_to_cpu(tmp_path):
    data = {"w": torch.arange(3.0).to(dev) * 2, "n": 5, "l": [torch.ones(2).to(dev)]}
    path = tmp_path / "ckpt.pt"
    xm.save(data, path)
    loaded = torch.load(path)
    assert loaded["w"].device.type == "cpu" and loaded["n"] == 5
    torch.testing.assert_close(loaded["w"], torch.arange(3.0) * 2)
    torch.testing.assert_close(loaded["l"][0], torch.ones(2))


def test_send_cpu_data_to_device():
    out = xm.send_cpu_data_to_device(torch.ones(2), dev)
    assert isinstance(out, list) and len(out) == 1 and out[0].device == dev
    nested = xm.send_cpu_data_to_device({"a": (torch.zeros(1), 3), "b": [torch.ones(1)]}, dev)
    assert nested["a"][0].device == dev and nested["a"][1] == 3 and nested["b"][0].device == dev


def test_rate_tracker():
    t = xm.RateTracker(smooth_factor=0.5)
    t._start_time -= 2.0
    t._partial_time -= 2.0
    t.add(100)
    r1 = t.rate()
    assert r1 == pytest.approx(50, rel=0.05)
    assert t.global_rate() == pytest.approx(50, rel=0.05)
    t._partial_time -= 1.0
    t.add(10)
    assert t.rate() == pytest.approx(0.5 * 10 + 0.5 * r1, rel=0.05)


def test_rng_state_round_trip():
    xm.set_rng_state(1234)
    assert xm.get_rng_state() == 1234
    a = torch.rand(4, device=dev)
    state_after_a = xm.get_rng_state()
    b = torch.rand(4, device=dev)
    xm.set_rng_state(state_after_a)
    b2 = torch.rand(4, device=dev)
    torch.testing.assert_close(b.cpu(), b2.cpu())
    assert not torch.equal(a.cpu(), b.cpu())


def test_get_memory_info():
    info = xm.get_memory_info(dev)
    assert set(info) == {"bytes_used", "bytes_limit", "peak_bytes_used"}
    assert 0 <= info["bytes_used"] <= info["bytes_limit"]


def test_optimization_barrier_in_place():
    a = torch.randn(3).to(dev) + 1
    b = torch.randn(2, 2).to(dev) * 2
    a_ref, b_ref = a.cpu(), b.cpu()
    xm.optimization_barrier_([a, b])
    assert "optimization_barrier" in xm.get_stablehlo([a, b])
    torch.testing.assert_close(a.cpu(), a_ref)
    torch.testing.assert_close(b.cpu(), b_ref)


def test_unlazy_runs_only_the_given_tensors():
    x = torch.randn(3).to(dev)
    y, other = x * 2, x + 7
    xm.unlazy([y])
    assert not pending(y) and pending(other)


def test_get_stablehlo_and_bytecode():
    x = torch.randn(2, 3).to(dev)
    y = (x @ x.T).relu()
    text = xm.get_stablehlo([y])
    assert "stablehlo.dot" in text or "dot_general" in text
    assert "func.func" in xm.get_stablehlo()  # every pending tensor
    bc = xm.get_stablehlo_bytecode([y])
    assert isinstance(bc, bytes) and bc.startswith(b"ML\xefR")
    assert pending(y)  # nothing ran


def test_collectives_single_replica():
    x = torch.arange(4.0).to(dev)
    r = xm.all_reduce(xm.REDUCE_SUM, x, scale=0.5)
    torch.testing.assert_close(r.cpu(), torch.arange(4.0) * 0.5)
    ts = [torch.ones(2).to(dev), torch.full((1,), 3.0).to(dev)]
    assert xm.all_reduce("sum", ts, scale=2.0) is ts
    torch.testing.assert_close(ts[1].cpu(), torch.full((1,), 6.0))
    assert xm.all_reduce(xm.REDUCE_MAX, x) is not x
    with pytest.raises(ValueError, match="invalid reduce type"):
        xm.all_reduce("avg", x)
    torch.testing.assert_close(xm.all_gather(x, dim=0).cpu(), torch.arange(4.0))
    out = torch.zeros(4).to(dev)
    assert xm.all_gather(x, output=out) is out
    rs = xm.reduce_scatter(xm.REDUCE_SUM, x, scale=2.0, scatter_dim=0, shard_count=1)
    torch.testing.assert_close(rs.cpu(), torch.arange(4.0) * 2)
    with pytest.raises(ValueError, match="shard_count=2"):
        xm.reduce_scatter(xm.REDUCE_SUM, x, 1.0, 0, 2)
    a2a = xm.all_to_all(x.view(2, 2), split_dimension=0, concat_dimension=1, split_count=1)
    torch.testing.assert_close(a2a.cpu(), torch.arange(4.0).view(2, 2))
    torch.testing.assert_close(xm.collective_permute(x, [[0, 0]]).cpu(), torch.arange(4.0))
    torch.testing.assert_close(xm.collective_permute(x, []).cpu(), torch.zeros(4))
    with pytest.raises(ValueError, match="replica other than 0"):
        xm.collective_permute(x, [[0, 1]])
    with pytest.raises(ValueError, match="one replica"):
        xm.all_reduce("sum", x, groups=[[0, 1]])


# --- xr ------------------------------------------------------------------------------------------


def test_runtime_counts_and_ordinals():
    assert xr.device_type() == "CPU"
    assert xr.world_size() == 1 and xr.global_ordinal() == 0 and xr.local_ordinal() == 0
    assert xr.process_index() == 0 and xr.process_count() == 1
    n = lazyxla.device_count()
    assert not xr.is_spmd()
    assert xr.global_device_count() == xr.addressable_device_count() == n
    assert xr.local_device_count() == n
    assert xr.global_runtime_device_count() == xr.addressable_runtime_device_count() == n
    attrs = xr.global_runtime_device_attributes()
    assert len(attrs) == n and attrs[0]["name"] == "CPU:0"
    assert xr.runtime_device_attributes("CPU:0") == attrs[0]
    with pytest.raises(ValueError, match="no runtime device"):
        xr.runtime_device_attributes("TPU:7")
    xr.set_device_type("CPU")  # same type after start: fine
    with pytest.raises(RuntimeError, match="before the first tensor"):
        xr.set_device_type("TPU")
    with pytest.raises(ValueError, match="not one of"):
        xr.set_device_type("FPGA")


def test_initialize_cache_after_compiling_raises():
    torch.ones(1, device=dev).add(1).cpu()
    with pytest.raises(RuntimeError, match="must be initialized before any computations"):
        xr.initialize_cache("/tmp/never")


def test_environment_spmd_metrics_file_and_compilation_cache(tmp_path):
    cache = tmp_path / "cache"
    mfile = tmp_path / "metrics.txt"
    r = run_py(
        f"""
        import torch, lazyxla, lazyxla.runtime as xr
        xr.initialize_cache({str(cache)!r})
        assert xr.is_spmd()
        print(xr.global_runtime_device_count(), xr.addressable_runtime_device_count(),
              xr.global_device_count(), xr.addressable_device_count(), xr.world_size())
        print((torch.ones(4, device=lazyxla.device()) * 3).sum().item())
        """,
        env={"XLA_USE_SPMD": "1", "CPU_NUM_DEVICES": "4", "XLA_METRICS_FILE": str(mfile)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["4 4 1 1 1", "12.0"]
    assert any(cache.iterdir())  # the executable went to the persistent cache
    report = mfile.read_text()
    assert "Metric: CompileTime" in report and "Counter: UncachedCompile" in report


def test_pjrt_device_missing_platform_is_a_clear_error():
    r = run_py(
        "import torch, lazyxla; torch.ones(1).to(lazyxla.device())", env={"PJRT_DEVICE": "TPU"}
    )
    assert r.returncode != 0
    assert "PJRT_DEVICE=TPU but JAX cannot use that platform" in r.stderr
    assert "PJRT_DEVICE=CPU" in r.stderr


# --- xp ------------------------------------------------------------------------------------------


def test_profiler_traces(tmp_path):
    calls = []

    @xp.trace_me("traced_fn")
    def f(x):
        calls.append(1)
        return x + 1

    xp.start_trace(str(tmp_path / "t1"))
    with xp.Trace("region"):
        y = f(torch.ones(2, device=dev))
    with xp.StepTrace("train", step_num=3):
        z = y * 2
    xp.stop_trace()
    assert calls == [1] and not pending(z)  # StepTrace syncs on exit
    assert list((tmp_path / "t1").rglob("*.xplane.pb"))

    server = xp.start_server(9917)
    assert xp.start_server(9917) is server
    thread = xp.trace_detached("localhost:9917", str(tmp_path / "t2"), duration_ms=200)
    thread.join(30)
    assert list((tmp_path / "t2").rglob("*.xplane.pb"))
    with pytest.raises(RuntimeError, match="xprof"):
        xp.trace("otherhost.invalid:1234", str(tmp_path / "t3"), duration_ms=10)


# --- pl ------------------------------------------------------------------------------------------


def test_mp_device_loader_yields_device_batches_and_syncs_each_step():
    data = [(torch.full((2,), float(i)), {"y": torch.tensor([i])}) for i in range(5)]
    loader = pl.MpDeviceLoader(data, dev)
    assert len(loader) == 5
    met.clear_all()
    seen = []
    acc = torch.zeros(2, device=dev)
    for x, d in loader:
        assert x.device == dev and d["y"].device == dev
        acc = acc + x
        seen.append(int(d["y"].cpu()))
    assert seen == [0, 1, 2, 3, 4]
    assert not pending(acc)
    assert (
        met.counter_value("MarkStep") == 7
    )  # one per next() (6, the last one ends), one at the end
    torch.testing.assert_close(acc.cpu(), torch.full((2,), 10.0))
    assert [int(d["y"].cpu()) for _, d in loader] == [0, 1, 2, 3, 4]  # a second epoch


def test_parallel_loader_per_device_loader_and_errors():
    para = pl.ParallelLoader([torch.ones(1)] * 4, [dev], batches_per_execution=2)
    it = para.per_device_loader(dev)
    assert len(it) == 4
    met.clear_all()
    assert sum(1 for _ in it) == 4
    assert met.counter_value("MarkStep") == 3  # at nexts 2 and 4, and at the end

    def broken():
        yield torch.ones(1)
        raise OSError("disk gone")

    it = pl.MpDeviceLoader(broken(), dev).__iter__()
    next(it)
    with pytest.raises(OSError, match="disk gone"):
        next(it)


# --- xu ------------------------------------------------------------------------------------------


def test_utils(monkeypatch):
    gen = xu.SampleGenerator(data=(1, 2), sample_count=3)
    assert len(gen) == 3 and list(gen) == [(1, 2)] * 3 and list(gen) == [(1, 2)] * 3
    monkeypatch.setenv("LX_INT", "7")
    monkeypatch.setenv("LX_BOOL", "0")
    monkeypatch.setenv("LX_FLAG", "yes")
    assert xu.getenv_as("LX_INT", int) == 7
    assert xu.getenv_as("LX_BOOL", bool) is False
    assert xu.getenv_as("LX_MISSING", int, 5) == 5
    assert xu.check_env_flag("LX_FLAG") and not xu.check_env_flag("LX_MISSING")
    assert xu.check_env_flag("LX_MISSING", "on")


def test_module_to_keeps_parameters_and_ties():
    """`.to(device)` keeps Parameter objects (as CUDA does, unlike PyTorch/XLA): tied weights stay
    tied and an optimizer built on the CPU model keeps training the moved one."""

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    torch.manual_seed(0)
    ref = Tied()
    model = copy.deepcopy(ref)
    w = model.embed.weight
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, ref))
    model.to(lazyxla.device())
    assert model.embed.weight is w and model.head.weight is w and w.device.type == "jax"
    ids = torch.tensor([[1, 2, 3]])
    for m, o, x in ((model, opt, ids.to(lazyxla.device())), (ref, opt_ref, ids)):
        m.head(m.embed(x)).logsumexp(-1).sum().backward()
        o.step()
    torch.testing.assert_close(model.embed.weight.cpu(), ref.embed.weight)
    model.cpu()
    assert model.head.weight is model.embed.weight is w and w.device.type == "cpu"
    assert not torch.__future__.get_swap_module_params_on_conversion()


def test_module_to_a_parameter_that_cannot_swap():
    """The deprecated `nn.utils.weight_norm` keeps `weight_g` referenced (its computed `weight`'s
    autograd graph), so PyTorch refuses to swap it: the move still happens, as torch_xla's (new
    Parameter objects), with a warning that says so; training then matches eager."""

    def make():
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # (weight_norm's deprecation)
            return torch.nn.utils.weight_norm(torch.nn.Linear(5, 3))

    ref, model = make(), make()  # (it cannot be deep-copied either)
    from lazyxla._src import tensor

    tensor._unswapped_warned.clear()  # (it warns once per process)
    with pytest.warns(UserWarning, match="Couldn't swap Linear.weight_g.*after the move"):
        model.to(lazyxla.device())
    assert model.weight_g.device.type == model.weight_v.device.type == "jax"
    x = torch.randn(2, 5)
    for m, xin in ((model, x.to(lazyxla.device())), (ref, x)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            m(xin).pow(2).sum().backward()
            opt.step()
    for name in ("weight_g", "weight_v", "bias"):
        torch.testing.assert_close(getattr(model, name).cpu(), getattr(ref, name))
    assert not torch.__future__.get_swap_module_params_on_conversion()
