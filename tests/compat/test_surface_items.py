"""torch_xla behaviours its own tests check: `.item()`'s fallback counter, torch_xla's error
messages, custom calls and user computations, the SPMD loader's input shardings, permuted-mesh
sharding strings (torch_xla 2.9's golden lines), XLAShardedTensor's DTensor attributes, the
arguments torch_xla programs pass (`reset_scope`, `pin_layout`, `only_on_master`) and detached
profiler traces. Values are compared with eager PyTorch."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch.distributed.tensor.placement_types import Replicate, Shard

import lazyxla
import lazyxla.core.xla_builder as xb
import lazyxla.core.xla_model as xm
import lazyxla.debug.metrics as met
import lazyxla.debug.profiler as xp
import lazyxla.distributed.parallel_loader as pl
from lazyxla._src import metrics, op_builder, sharding, xlac
from lazyxla.distributed.spmd import xla_sharding as xs

dev = lazyxla.device()
GOLDEN = "/work/shared/golden/torch_xla_2.9_cpu_formats.txt"


@pytest.fixture
def spmd():
    sharding.use_spmd()
    yield
    sharding._leave_spmd_for_tests()


# --- .item() ---------------------------------------------------------------------------------


def test_item_counts_local_scalar_dense_as_torch_xla_does():
    met.clear_all()
    t = torch.tensor(100, device=dev) * 2
    assert t.item() == 200
    assert met.counter_value("aten::_local_scalar_dense") == 1
    assert "aten::_local_scalar_dense" in met.short_metrics_report()
    # listed as torch_xla lists it; lazyxla's own list of CPU ops leaves the read out
    assert met.executed_fallback_ops() == ["aten::_local_scalar_dense"]
    assert xlac._get_executed_fallback_ops() == ["aten::_local_scalar_dense"]
    assert metrics.cpu_fallback_ops() == []


# --- torch_xla's error messages ------------------------------------------------------------


def _raises_like_eager(fn, message):
    """`fn(device)` raises RuntimeError with torch_xla's `message` on lazyxla; eager rejects it."""
    with pytest.raises(RuntimeError, match=re.escape(message)):
        fn(dev)
    with pytest.raises(RuntimeError):
        fn("cpu")


def _t(*shape, device):
    return torch.rand(*shape).to(device)


@pytest.mark.parametrize(
    "fn, message",
    [
        (
            lambda d: torch.add(_t(2, 2, 4, 4, device=d), _t(2, 2, device=d)),
            "Shapes are not compatible for broadcasting: f32[2,2,4,4] vs. f32[2,2]. Expected "
            "dimension 2 of shape f32[2,2,4,4] (4) to match dimension 0 of shape f32[2,2] (2).",
        ),
        (
            lambda d: torch.cat([_t(2, 2, device=d), _t(5, 1, device=d)]),
            "cat(): cannot concatenate tensors of shape f32[5,1] with f32[2,2] at dimension 0.",
        ),
        (
            lambda d: torch.mm(_t(2, 5, device=d), _t(8, 2, device=d)),
            "mm(): cannot matrix-multiply tensors f32[2,5] and f32[8,2]. Expected the size of "
            "dimension 1 of the first input tensor (5) to be equal the size of dimension 0 of the "
            "second input tensor (8).",
        ),
        (
            lambda d: torch.bmm(_t(2, 3, 8, device=d), _t(2, 4, 3, device=d)),
            "bmm(): cannot apply batch matrix-multiplication to `input` f32[2,3,8], the 1st input "
            "tensor, and to `mat2` f32[2,4,3], the 2nd input tensor.",
        ),
        (
            lambda d: torch.flip(_t(2, 2, 2, 2, device=d), dims=[0, 0, 0, 1, 2, 3, -1]),
            "flip(): expected each dimension to appear at most once. Found dimensions: 0 (3 "
            "times), 3 (2 times). Consider changing dims from [0, 0, 0, 1, 2, 3, -1] to "
            "[0, 1, 2, 3].",
        ),
        (
            lambda d: torch.gather(
                torch.arange(4, device=d).view(2, 2),
                1,
                torch.zeros(2, 2, 2, dtype=torch.long).to(d),
            ),
            "gather(): expected rank of input (2) and index (3) tensors to be the same.",
        ),
        (
            lambda d: torch.roll(_t(2, 2, 2, device=d), [2, 2], [0]),
            "roll(): expected `dims` [0] (size=1) to match the size of `shifts` [2, 2] (size=2).",
        ),
        (
            lambda d: torch.empty(10, device=d).random_(3, 1),
            "random_(): expected `from` (3) to be smaller than `to` (1).",
        ),
        (
            lambda d: torch.empty(5, device=d).uniform_(5.0, 2.0),
            "uniform_(): expected `from` (5) <= `to` (2).",
        ),
        (
            lambda d: torch.div(_t(2, device=d), 2, rounding_mode="bad"),
            "div(): invalid rounding mode `bad`.",
        ),
        (
            lambda d: torch.ops.aten.clamp.default(_t(2, device=d)),
            "clamp(): expected at least one of `min` or `max` arguments to be specified.",
        ),
        (
            lambda d: torch.trace(_t(2, 2, 2, device=d)),
            "trace(): expected the input tensor f32[2,2,2] to be a matrix (i.e. a 2D tensor).",
        ),
    ],
    ids=[
        "add",
        "cat",
        "mm",
        "bmm",
        "flip",
        "gather",
        "roll",
        "random_",
        "uniform_",
        "div",
        "clamp",
        "trace",
    ],  # fmt: skip
)
def test_bad_arguments_get_torch_xla_messages(fn, message):
    _raises_like_eager(fn, message)


def test_the_checks_pass_what_eager_accepts():
    x, y = torch.rand(2, 1, 4), torch.rand(3, 1)
    ops = [
        lambda a, b: torch.add(a, b),  # broadcasting
        lambda a, b: torch.cat([a.flatten(), torch.empty(0)]),  # a 1-D empty tensor
        lambda a, b: torch.flip(a, [0, -1]),
        lambda a, b: torch.roll(a, 1),
        lambda a, b: torch.ops.aten.clamp.default(a, 0.5),
        lambda a, b: torch.div(a, 3, rounding_mode="floor"),
    ]
    for op in ops:
        want = op(x, y)
        got = op(x.to(dev), y.to(dev))
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


# --- custom calls and user computations ------------------------------------------------------


def test_custom_call_checks_its_arguments_and_records_the_target():
    x = torch.rand(10, device=dev)
    with pytest.raises(RuntimeError, match=re.escape("custom_call(t): expected at least 1")):
        xlac._make_xlac()._xla_custom_call([], "t", [[1]], [torch.int8], False, "", 0, {})
    with pytest.raises(RuntimeError, match=re.escape("output shapes (size=2) to be of the same")):
        op_builder.custom_call((x,), "t", [[1], [1]], [torch.int8])
    with pytest.raises(NotImplementedError, match="TPU"):
        op_builder.tpu_custom_call((x,), "", [[1]], [torch.int8])
    (out,) = op_builder.custom_call(
        (x,), "lazyxla_test_target", [[4]], [torch.float32], False, "", 1
    )
    assert out.shape == (4,) and out.dtype == torch.float32
    assert "lazyxla_test_target" in lazyxla.debug.hlo_text([out])
    with pytest.raises(Exception, match="lazyxla_test_target"):  # no such target on this CPU
        out.cpu()
    torch.testing.assert_close(x.cpu() * 2, (x * 2).cpu())  # the graph without it still runs


def test_user_computation_matches_eager_and_compiles_once_per_hlo():
    def fn(a, b):
        return xb.Op.tuple([xb.Op.max(a, b) - xb.Op.min(a, b), a.sin()])

    x, y = torch.randn(3, 3), torch.randn(3, 3)
    a, b = x.to(dev), y.to(dev)
    met.clear_all()
    for _ in range(2):  # two computations with the same HLO: one executable
        comp = xb.create_computation("diff", fn, [xb.tensor_shape(a), xb.tensor_shape(b)])
        d, s = xlac._make_xlac()._xla_user_computation("xla::diff", [a, b], comp)
        lazyxla.sync()
    assert met.counter_value("UncachedCompile") == 1
    torch.testing.assert_close(d.cpu(), (x - y).abs())
    torch.testing.assert_close(s.cpu(), x.sin())
    assert "sine" in xb.get_computation_hlo(comp)
    with pytest.raises(RuntimeError, match=re.escape("user_computation(xla::diff): expected at")):
        xlac._make_xlac()._xla_user_computation("xla::diff", [], comp)


# --- SPMD: loader input shardings, send_cpu_data_to_device, golden strings --------------------


class _Batches:
    def __init__(self, batch, n=1):
        self.batch, self.n = batch, n

    def __iter__(self):
        return iter([self.batch] * self.n)

    def __len__(self):
        return self.n


def test_loader_input_sharding_errors_are_torch_xlas(spmd):
    mesh = xs.get_1d_mesh("x")
    spec = xs.ShardingSpec(mesh, ("x", None))
    one = pl.MpDeviceLoader(_Batches(torch.randn(16, 8)), dev, input_sharding={"x": spec})
    with pytest.raises(ValueError, match="input batch should be a dict"):
        next(iter(one))
    two = {"x": torch.randn(16, 8), "y": torch.randn(16, 8, 2)}
    loader = pl.MpDeviceLoader(_Batches(two), dev, input_sharding={"x": spec})
    with pytest.raises(KeyError, match=re.escape("Keys: ['y'] are missing from input_sharding.")):
        next(iter(loader))


def test_loader_and_send_cpu_data_place_batches_as_torch_xla(spmd):
    mesh = xs.get_1d_mesh("x")
    batch = {"x": torch.randn(16, 8), "y": torch.randn(16, 8, 2)}
    tiled = "{devices=[8,1]0,1,2,3,4,5,6,7}"
    data = next(iter(pl.MpDeviceLoader(_Batches(batch), dev)))
    assert [xlac._get_xla_sharding_spec(data[k]) for k in "xy"] == ["{replicated}"] * 2
    sharded = next(
        iter(
            pl.MpDeviceLoader(
                _Batches(batch), dev, input_sharding=xs.ShardingSpec(mesh, ("x", None))
            )
        )
    )
    assert xlac._get_xla_sharding_spec(sharded["x"]) == tiled
    assert xlac._get_xla_sharding_spec(sharded["y"]) == "{replicated}"  # rank 3: not its spec
    (t,) = xm.send_cpu_data_to_device(batch["x"], dev, xs.ShardingSpec(mesh, ("x", None)))
    assert xlac._get_xla_sharding_spec(t) == tiled
    for k in "xy":
        torch.testing.assert_close(data[k].cpu(), batch[k], rtol=0, atol=0)
        torch.testing.assert_close(sharded[k].cpu(), batch[k], rtol=0, atol=0)
    torch.testing.assert_close(t.cpu(), batch["x"], rtol=0, atol=0)
    assert xlac._get_xla_sharding_spec(torch.randn(2).to(dev)) == ""  # not through the loader


def _golden(prefix):
    with open(GOLDEN) as f:
        line = next(ln for ln in f if ln.startswith(prefix))
    return line.split(": ", 1)[1].strip().strip("'")


@pytest.mark.skipif(not os.path.exists(GOLDEN), reason="torch_xla 2.9's golden output not here")
def test_permuted_mesh_strings_match_torch_xla(spmd):
    mesh = xs.Mesh(np.arange(8)[::-1].copy(), (2, 4), ("a", "b"))
    for spec, label in (((("a", None)), "('a',None)"), ((None, "b"), "(None,'b')")):
        x = torch.randn(8, 8)
        t = x.to(dev)
        xs.mark_sharding(t, mesh, spec)
        assert xlac._get_xla_sharding_spec(t) == _golden(f"permuted mesh (2,4) {label}")
        torch.testing.assert_close((t * 2).cpu(), x * 2)
    grid = xs.Mesh(np.arange(8), (4, 2), ("x", "y"))
    for spec, label in (((None, "y"), "partial (None,'y')"), (("x", "y"), "full ('x','y')")):
        t = torch.randn(8, 8).to(dev)
        xs.mark_sharding(t, grid, spec)
        assert xlac._get_xla_sharding_spec(t) == _golden(label)


# --- XLAShardedTensor's DTensor attributes ----------------------------------------------------


def test_sharded_tensor_spec_placements_and_redistribute(spmd):
    mesh = xs.Mesh(np.arange(8), (2, 4))
    x = torch.randn(8, 16)
    st = xs.mark_sharding(x.to(dev), mesh, (0, None))
    assert st.mesh_shape == (2, 4) and st.partition_spec == (0, None)
    assert st.placements == (Shard(0), Replicate())
    assert st._spec is st._cached_spec and st._spec.mesh.shape == (2, 4)
    st.partition_spec = (None, 1)  # a new spec forgets the cached one
    assert st._cached_spec is None and st.placements == (Replicate(), Shard(1))
    out = st.redistribute(mesh, [Replicate(), Shard(1)])
    assert out.partition_spec == (None, 1)
    assert (
        xlac._get_xla_sharding_spec(out)
        == "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    )
    torch.testing.assert_close(out.cpu(), x, rtol=0, atol=0)
    copy = st.redistribute(mesh, [Shard(0), Shard(1)], async_op=True)
    assert copy.global_tensor is not out.global_tensor
    torch.testing.assert_close((copy * 3).cpu(), x * 3)
    with pytest.raises(ValueError, match="Number of placements"):
        st.redistribute(mesh, [Shard(0)])
    with pytest.raises(IndexError, match="out of bounds"):
        st.redistribute(mesh, [Shard(2), Replicate()])
    bare = xs.XLAShardedTensor(torch.randn(2, 2).to(dev))
    with pytest.raises(ValueError, match="Placements not available"):
        _ = bare.placements


def test_sharded_tensor_constructor_requires_grad_gives_a_leaf_with_a_gradient():
    x = torch.randn(4, 4)
    st = xs.XLAShardedTensor(x.to(dev), requires_grad=True)
    (st * st).sum().backward()
    torch.testing.assert_close(st.grad.cpu(), 2 * x)


# --- arguments torch_xla programs pass ---------------------------------------------------------


def test_reset_scope_pin_layout_and_only_on_master(monkeypatch):
    t = torch.ones(2, device=dev) * 3
    xm.mark_step(reset_scope=False)  # no IR scope outlives a step either way
    lazyxla.sync(reset_scope=True)
    torch.testing.assert_close(t.cpu(), torch.full((2,), 3.0))
    with pytest.raises(TypeError, match="reset_scope"):
        lazyxla.sync(reset_scope="no")
    model = torch.nn.Linear(2, 2).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2, device=dev)).sum().backward()
    xm.optimizer_step(opt, pin_layout=False)
    with pytest.raises(TypeError, match="pin_layout"):
        xm.optimizer_step(opt, pin_layout="yes")
    from lazyxla._src import runtime_api

    monkeypatch.setattr(runtime_api, "local_ordinal", lambda: 1)
    assert xp.start_server(9939, only_on_master=True) is None  # not the host's first process


_TRACE_PROGRAM = textwrap.dedent(
    """
    import sys, torch, lazyxla
    import lazyxla.debug.profiler as xp
    server = xp.start_server(int(sys.argv[2]))
    x = torch.randn(32, 32, device=lazyxla.device())
    xp.trace_detached(f"localhost:{sys.argv[2]}", sys.argv[1], duration_ms=1000)
    for _ in range(3):
        x = (x @ x).tanh()
        lazyxla.sync()
    print("main done")  # the program ends while the capture is still running
    """
)


def test_trace_detached_keeps_the_trace_when_the_program_ends_first(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(_TRACE_PROGRAM)
    for run in range(3):
        logdir = tmp_path / f"trace{run}"
        proc = subprocess.run(
            [sys.executable, str(prog), str(logdir), str(9941 + run)],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "main done" in proc.stdout
        assert list(logdir.rglob("*.xplane.pb")), f"run {run}: no trace written"


# --- SPMD runtime details torch_xla's tests check ------------------------------------------------


def test_spmd_outputs_show_their_sharding_and_executions_are_replicated_time(spmd):
    x = torch.randn(4, 4)
    t = x.to(dev)
    assert xlac._get_xla_sharding_spec(t) == ""  # an unannotated upload
    met.clear_all()
    y = t @ t
    lazyxla.sync()
    assert xlac._get_xla_sharding_spec(y) == "{replicated}"  # what an SPMD execution returned
    assert met.metric_data("ExecuteReplicatedTime")[0] == 1
    assert met.metric_data("ExecuteTime") is None
    torch.testing.assert_close(y.cpu(), x @ x)
    xs.mark_sharding(t, xs.get_1d_mesh("x"), ("x", None))
    xs.clear_sharding(t)
    assert xlac._get_xla_sharding_spec(t) == ""
    torch.testing.assert_close(t.cpu(), x, rtol=0, atol=0)


def test_global_tensor_from_cpu_shards(spmd):
    from_shards = xlac._make_xlac()._global_tensor_from_cpu_shards
    mesh = xs.Mesh(np.arange(8), (4, 2))
    tiled = [torch.tensor([[i]]) for i in range(8)]
    out = from_shards(tiled, mesh.get_op_sharding((0, 1)))
    torch.testing.assert_close(out.cpu(), torch.arange(8).reshape(4, 2))
    partial = [torch.tensor([[i % 2]]) for i in range(8)]  # devices i and i+2... hold column i % 2
    out = from_shards(partial, xs.Mesh(np.arange(8), (4, 2)).get_op_sharding((None, 1)))
    torch.testing.assert_close(out.cpu(), torch.tensor([[0, 1]]))
    rows = [torch.arange(8) + 8 * i for i in range(8)]
    flat = xs.Mesh(np.arange(8), (8,)).get_op_sharding((0,))
    torch.testing.assert_close(from_shards(rows, flat, torch.Size([60])).cpu(), torch.arange(60))
    with pytest.raises(RuntimeError, match="does not fit"):
        from_shards(rows, flat, torch.Size([56]))  # more than one shard of padding
    with pytest.raises(RuntimeError, match="one per device"):
        from_shards(rows[:-1], flat)


def test_replication_devices_and_process_counts():
    import lazyxla.runtime as xr

    every = [f"CPU:{i}" for i in range(lazyxla.device_count())]
    assert xm.xla_replication_devices(lazyxla.devices()) == every
    if len(every) > 1:  # replication is over every device of the kind, as in torch_xla
        with pytest.raises(RuntimeError, match="Cannot replicate if number of devices"):
            xm.xla_replication_devices([dev])
    assert xr.local_process_count() == 1 and xr.host_index() == 0


def test_stablehlo_compile_counter_and_debug_locations(monkeypatch):
    """XLA_STABLEHLO_COMPILE set after import counts `StableHloCompile` per compile, and
    `get_stablehlo` carries `#loc` source locations under XLA_HLO_DEBUG (torch_xla reads both
    at use)."""
    x = torch.randn(3, 5).to(dev)
    lazyxla.sync()
    monkeypatch.setenv("XLA_STABLEHLO_COMPILE", "1")
    before = met.counter_value("StableHloCompile") or 0
    (x * 3.5 - x.sin()).cpu()
    assert (met.counter_value("StableHloCompile") or 0) == before + 1
    y = x.cos() + 2.5
    assert "#loc" not in xm.get_stablehlo([y])
    monkeypatch.setenv("XLA_HLO_DEBUG", "1")
    assert "#loc" in xm.get_stablehlo([y])
    torch.testing.assert_close(y.cpu(), x.cpu().cos() + 2.5)


def test_broadcast_master_param_and_fsdp_of_a_cpu_module():
    """`xm.broadcast_master_param` keeps the master's values (one replica here) and runs the
    step; FSDP v1 moves a CPU module to the device as torch_xla does, computing as eager."""
    from lazyxla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    model = copy.deepcopy(cpu).to(dev)
    xm.broadcast_master_param(model)
    for p, q in zip(model.state_dict().values(), cpu.state_dict().values(), strict=True):
        assert not lazyxla._src.tensor.state(p).is_pending
        torch.testing.assert_close(p.cpu(), q)
    wrapped = FSDP(copy.deepcopy(cpu))
    assert all(p.device.type == dev.type for p in wrapped.parameters())
    x = torch.randn(5, 4)
    torch.testing.assert_close(wrapped(x.to(dev)).cpu(), cpu(x), rtol=1e-5, atol=1e-6)
