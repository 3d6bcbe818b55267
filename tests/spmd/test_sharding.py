"""SPMD on 8 virtual CPU devices: torch_xla's sharding strings, semantics and errors."""

import re

import numpy as np
import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
import lazyxla.distributed.spmd as xs

dev = lazyxla.device()

# Section A of shared/golden/torch_xla_2.9_cpu_formats.txt (real torch_xla 2.9, CPU, 8 devices).
GOLDEN = [
    (("x", "y"), "{devices=[4,2]0,1,2,3,4,5,6,7}"),
    ((None, "y"), "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    (("y", None), "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    (("x", None), "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    ((("x", "y"), None), "{devices=[8,1]0,1,2,3,4,5,6,7}"),
    ((None, None), "{replicated}"),
]


def test_device_count():
    assert lazyxla.device_count() == 8


@pytest.mark.parametrize("spec,expected", GOLDEN, ids=[str(s) for s, _ in GOLDEN])
def test_golden_sharding_strings(mesh, spec, expected):
    t = torch.randn(8, 8).to(dev)
    xs.mark_sharding(t, mesh, spec)
    assert lazyxla.debug.sharding_spec(t) == expected
    assert mesh.get_op_sharding(spec) == expected


def test_golden_3d_and_unmarked(mesh):
    t = torch.randn(8, 8, 8).to(dev)
    xs.mark_sharding(t, mesh, ("x", None, "y"))
    assert lazyxla.debug.sharding_spec(t) == "{devices=[4,1,2]0,1,2,3,4,5,6,7}"
    assert lazyxla.debug.sharding_spec(torch.randn(8, 8).to(dev)) == ""


def test_golden_matmul_result_after_sync(mesh):
    torch.manual_seed(0)
    a_cpu, b_cpu = torch.randn(8, 8), torch.randn(8, 8)
    a, b = a_cpu.to(dev), b_cpu.to(dev)
    xs.mark_sharding(a, mesh, ("x", None))
    xs.mark_sharding(b, mesh, (None, None))
    c = a @ b
    lazyxla.sync()
    assert lazyxla.debug.sharding_spec(c) == (
        "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    )
    torch.testing.assert_close(c.cpu(), a_cpu @ b_cpu)


@pytest.mark.parametrize(
    "ids,spec,expected",
    [
        (
            [4, 5, 6, 7, 0, 1, 2, 3],
            ("a", None),
            "{devices=[2,1,4]4,5,6,7,0,1,2,3 last_tile_dim_replicate}",
        ),
        (
            [3, 2, 1, 0, 7, 6, 5, 4],
            (None, "b"),
            "{devices=[1,4,2]3,7,2,6,1,5,0,4 last_tile_dim_replicate}",
        ),
    ],
)
def test_golden_custom_device_orders(ids, spec, expected):
    m = xs.Mesh(np.array(ids), (2, 4), ("a", "b"))
    t = torch.randn(8, 8).to(dev)
    xs.mark_sharding(t, m, spec)
    assert lazyxla.debug.sharding_spec(t) == expected


def test_sharded_tensor_and_local_shards(mesh):
    x = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    st = xs.mark_sharding(x.to(dev), mesh, ("x", "y"))
    assert type(st).__name__ == "XLAShardedTensor"
    assert st.sharding_type == xs.ShardingType.TILED
    shards = st.local_shards
    assert len(shards) == 8
    assert shards[0].indices == [slice(0, 2, 1), slice(0, 4, 1)]
    assert shards[1].indices == [slice(0, 2, 1), slice(4, 8, 1)]
    assert shards[2].indices == [slice(2, 4, 1), slice(0, 4, 1)]
    for sh in shards:
        assert sh.replica_id == 0
        torch.testing.assert_close(sh.data, x[tuple(sh.indices)])
    torch.testing.assert_close(st.global_tensor.cpu(), x)
    assert xs.wrap_if_sharded(st.global_tensor).sharding_spec == st.sharding_spec


def test_partial_replication_replica_ids(mesh):
    st = xs.mark_sharding(torch.randn(8, 8).to(dev), mesh, ("x", None))
    assert st.sharding_type == xs.ShardingType.PARTIAL
    assert sorted(sh.replica_id for sh in st.local_shards) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_sharding_enters_the_cache_key(mesh):
    met.clear_all()
    for spec in [("x", None), ("x", None), (None, "y")]:
        t = torch.randn(8, 8).to(dev)
        xs.mark_sharding(t, mesh, spec)
        (t * 2).sum().cpu()
    assert met.counter_value("UncachedCompile") == 2
    assert met.counter_value("CachedCompile") == 1


def test_pending_value_gets_a_constraint(mesh):
    x = torch.randn(8, 8)
    y = x.to(dev) + 1
    xs.mark_sharding(y, mesh, ("x", "y"))
    assert lazyxla.debug.sharding_spec(y) == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close(y.cpu(), x + 1)
    assert lazyxla.debug.sharding_spec(y) == "{devices=[4,2]0,1,2,3,4,5,6,7}"


def test_clear_sharding(mesh):
    x = torch.randn(8, 8)
    t = x.to(dev)
    xs.mark_sharding(t, mesh, ("x", "y"))
    xs.clear_sharding(t)
    assert xs.wrap_if_sharded(t) is t or lazyxla.debug.sharding_spec(t) in ("", "{replicated}")
    torch.testing.assert_close(t.cpu(), x)


@pytest.mark.parametrize(
    "make,match",
    [
        (
            lambda m, t: xs.mark_sharding(t, m, ("x",)),
            r"Partition spec length \(1\) should be equal",
        ),
        (lambda m, t: xs.mark_sharding(t, m, ("x", "z")), "Axis name z is not defined"),
        (lambda m, t: xs.mark_sharding(t, m, ("x", "x")), "at most once"),
        (
            lambda m, t: xs.mark_sharding(t, xs.Mesh(np.arange(4), (2, 2)), (0, 1)),
            "not mappable over 8 devices",
        ),
    ],
    ids=["rank", "axis-name", "duplicate-axis", "mesh-size"],
)
def test_bad_specs_are_rejected_and_lose_nothing(mesh, make, match):
    x = torch.randn(8, 8)
    t = x.to(dev)
    xs.mark_sharding(t, mesh, (None, "y"))
    before = lazyxla.debug.sharding_spec(t)
    with pytest.raises((AssertionError, ValueError), match=match):
        make(mesh, t)
    assert lazyxla.debug.sharding_spec(t) == before
    torch.testing.assert_close(t.cpu(), x)


def test_mesh_validation():
    with pytest.raises(AssertionError, match="unique"):
        xs.Mesh([0, 0, 1, 2, 3, 4, 5, 6], (4, 2))
    with pytest.raises(AssertionError, match="cannot fill"):
        xs.Mesh(np.arange(8), (4, 4))
    m = xs.Mesh(np.arange(8), (4, 2), ("fsdp", "tensor"))
    assert m.size() == 8 and dict(m.shape()) == {"fsdp": 4, "tensor": 2}
    assert m.get_axis_name_idx("tensor") == 1 and m.get_axis_name_idx("nope") is None
    assert m.get_logical_mesh().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    h = xs.HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(2, 1), axis_names=("a", "b"))
    assert h.mesh_shape == (4, 2)
    assert sorted(h.device_ids.tolist()) == list(range(8))
    one = xs.get_1d_mesh("data")
    assert one.mesh_shape == (8,) and one.axis_names == ("data",)
    xs.set_global_mesh(m)
    assert xs.get_global_mesh() is m


def test_sharded_matmul_hlo_has_collective(mesh):
    a = torch.randn(8, 16).to(dev)
    b = torch.randn(16, 8).to(dev)
    xs.mark_sharding(a, mesh, (None, "x"))
    xs.mark_sharding(b, mesh, ("x", None))
    c = a @ b
    hlo = lazyxla.debug.hlo_text([c])
    # GSPMD's annotations, as torch_xla prints them (Note [HLO text as torch_xla prints it])
    assert re.search(
        r"%p\d\.\d+ = f32\[8,16\]\{1,0\} parameter\(\d\), sharding=\{devices=\[1,4,2\]", hlo
    )
    assert "sdy" not in hlo
    from lazyxla._src import graph
    from lazyxla._src.tensor import state

    cap = graph.Capture([state(c)])
    compiled_text = graph.compile_capture(cap).as_text()
    assert "all-reduce" in compiled_text or "reduce-scatter" in compiled_text


def test_mark_sharding_with_gradients(mesh):
    x = torch.randn(8, 8, requires_grad=True)
    xd = x.detach().to(dev).requires_grad_()
    y = xs.mark_sharding_with_gradients(xd, mesh, ("x", None))
    assert lazyxla.debug.sharding_spec(y).startswith("{devices=[4,1,2]")
    (y * y).sum().backward()
    (x * x).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


def test_uneven_split_gives_padded_shards(mesh):
    x = torch.arange(56, dtype=torch.float32).reshape(7, 8)
    st = xs.mark_sharding(x.to(dev), mesh, ("x", "y"))
    assert st.sharding_spec == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    shards = st.local_shards
    assert [tuple(s.data.shape) for s in shards] == [(2, 4)] * 8
    last = shards[-1]
    assert last.indices == [slice(6, 7, 1), slice(4, 8, 1)]
    torch.testing.assert_close(last.unpadded_data, x[6:7, 4:8])
    assert last.data[1].abs().sum() == 0  # the padding row
    torch.testing.assert_close((st.global_tensor * 2).cpu(), x * 2)


def test_clone_and_deepcopy_keep_the_sharding(mesh):
    """As torch_xla's clone: the copy carries its source's sharding (pending or data), values
    equal; the source keeps its own."""
    import copy

    x = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    t = x.to(dev)
    xs.mark_sharding(t, mesh, ("x", "y"))
    spec = lazyxla.debug.sharding_spec(t)
    pending = (t * 2).clone()  # a pending source with no sharding: none on its clone
    assert lazyxla.debug.sharding_spec(pending) == ""
    for copied in (t.clone(), copy.deepcopy(t)):
        assert lazyxla.debug.sharding_spec(copied) == spec
        assert lazyxla.debug.sharding_spec(t) == spec
        torch.testing.assert_close(copied.cpu(), x)
    lazyxla.sync()
    u = t.clone() + 1
    lazyxla.sync()
    assert len(u.cpu()) == 8 and torch.equal(u.cpu(), x + 1)
