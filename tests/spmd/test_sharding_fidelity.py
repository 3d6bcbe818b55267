"""torch_xla's SPMD surface details (XLAShard indices, ...), checked against eager CPU values and
torch_xla's documented behaviour (pytorch/xla test/spmd/test_xla_sharding.py)."""

import numpy as np
import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
import lazyxla.distributed.spmd as xs
from lazyxla._src import sharding

dev = lazyxla.device()


def test_replicated_shards_sit_at_ellipsis():
    mesh = xs.Mesh(np.arange(8), (8,))
    t = torch.arange(8, dtype=torch.float32)
    xt = xs.mark_sharding(t.to(dev), mesh, (None,))
    shards = xt.local_shards
    assert len(shards) == 8
    for i, sh in enumerate(shards):
        assert sh.indices is Ellipsis
        torch.testing.assert_close(sh.data, t[sh.indices])
        assert sh.replica_id == i


def test_scalar_shards_and_partial_replication_indices(mesh):
    x = torch.tensor(1.5)
    xt = xs.mark_sharding(x.to(dev), mesh, ())
    assert xt.sharding_spec == "{replicated}"
    assert all(sh.indices is Ellipsis for sh in xt.local_shards)
    # partially replicated shards keep slices (torch_xla gives Ellipsis only when replicated)
    y = torch.randn(8, 8)
    yt = xs.mark_sharding(y.to(dev), mesh, ("x", None))
    for sh in yt.local_shards:
        assert isinstance(sh.indices, list)
        torch.testing.assert_close(sh.data, y[tuple(sh.indices)])


def test_load_local_shards_writes_shard_data_and_checks_as_torch_xla():
    mesh = xs.Mesh(np.arange(8), (8,))
    t = torch.arange(12, dtype=torch.float32).reshape(6, 2) + 1  # 6 rows over 8: uneven, padded
    xt = xs.mark_sharding(t.to(dev), mesh, (0, None))
    shards = xt.local_shards
    assert all(tuple(sh.data.shape) == (1, 2) for sh in shards)
    assert shards[7].unpadded_data.shape == (0, 2)
    for sh in shards:
        sh.data *= -1  # `unpadded_data` is a view of `data`, as torch_xla's
    xt.load_local_shards_(shards)
    torch.testing.assert_close(xt.global_tensor.cpu(), -t)
    assert xt.sharding_spec == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    with pytest.raises(RuntimeError, match="one per device"):
        xt.load_local_shards_(shards[:-1])
    for sh in shards:
        sh.data = torch.randn(2, 4)
    with pytest.raises(RuntimeError, match="shape"):
        xt.load_local_shards_(shards)
    rt = xs.mark_sharding(t.to(dev), mesh, (None, None))
    with pytest.raises(RuntimeError, match="tiled or partially replicated"):
        rt.load_local_shards_(rt.local_shards)
    assert sharding.shard_slices(Ellipsis, (4, 3)) == [slice(0, 4, 1), slice(0, 3, 1)]
    assert shards[0].shard_device == shards[0].device == "CPU:0"


def test_ops_on_sharded_tensors_return_sharded_tensors_with_eager_values_and_grads(mesh):
    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 4)
    x = torch.randn(8, 8, requires_grad=True)
    model = torch.nn.Linear(8, 4).to(dev)
    model.load_state_dict(ref.state_dict())
    xt = x.detach().to(dev).requires_grad_()
    xst = xs.mark_sharding(xt, mesh, ("x", "y"))
    plain_out = model(xt)
    assert not isinstance(plain_out, xs.XLAShardedTensor)
    assert "XLAShardedTensor" not in repr(plain_out)
    out = model(xst)
    assert isinstance(out, xs.XLAShardedTensor) and "XLAShardedTensor" in repr(out)
    assert type(out.global_tensor) is torch.Tensor
    (out * out).sum().backward()
    want = ref(x)
    (want * want).sum().backward()
    torch.testing.assert_close(out.cpu(), want.detach())
    torch.testing.assert_close(model.weight.grad.cpu(), ref.weight.grad)
    torch.testing.assert_close(xst.grad.cpu(), x.grad)
    # in place ops keep the object; a plain tensor updated from a sharded one stays plain
    y = torch.zeros(8, 8).to(dev)
    z = xs.mark_sharding(torch.ones(8, 8).to(dev), mesh, ("x", None))
    assert y.add_(z) is y and type(y) is torch.Tensor
    z += 1
    assert isinstance(z, xs.XLAShardedTensor)
    torch.testing.assert_close((z + y).cpu(), torch.full((8, 8), 3.0))


def _tpu_attrs(names_coords_slices):
    return [
        {"name": f"TPU:{n}", "coords": list(c), "core_on_chip": 0, "slice_index": s}
        for n, c, s in names_coords_slices
    ]


def test_hybrid_mesh_follows_tpu_coordinates(monkeypatch):
    import lazyxla.core.xla_model as xm
    import lazyxla.runtime as xr

    # pytorch/xla's test_hybrid_mesh: two slices of v4-8, devices listed out of order
    attrs = _tpu_attrs(
        [
            (2, (0, 0, 0), 0),
            (1, (1, 0, 0), 0),
            (0, (0, 1, 0), 0),
            (3, (1, 1, 0), 0),
            (4, (0, 0, 0), 1),
            (7, (1, 0, 0), 1),
            (6, (0, 1, 0), 1),
            (5, (1, 1, 0), 1),
        ]
    )
    monkeypatch.setattr(xr, "global_runtime_device_attributes", lambda: attrs)
    monkeypatch.setattr(xm, "xla_device_hw", lambda d: "TPU")
    mesh = xs.HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(2, 1))
    assert mesh.get_logical_mesh().tolist() == [[2, 1], [0, 3], [4, 7], [6, 5]]
    with pytest.raises(ValueError, match="dcn_mesh_shape"):
        xs.HybridMesh(ici_mesh_shape=(2, 4))
    with pytest.raises(ValueError, match="Number of slices"):
        xs.HybridMesh(ici_mesh_shape=(1, 2), dcn_mesh_shape=(4, 1))


def test_hybrid_mesh_on_cpu_is_slice_major_by_id():
    mesh = xs.HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(2, 1))
    assert mesh.get_logical_mesh().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_op_sharding_made_once_per_mesh_and_spec():
    mesh = xs.Mesh(np.arange(8), (4, 2), ("a", "b"))
    met.clear_all()
    t = torch.randn(8, 8).to(dev)
    xs.mark_sharding(t, mesh, ("a", "b"))
    assert met.counter_value("CreateOpSharding") == 1
    u = torch.randn(8, 8)
    ut = u.to(dev)
    xs.mark_sharding(ut, mesh, (0, 1))  # the same spec over the same mesh: cached
    assert met.counter_value("CreateOpSharding") == 1
    xs.mark_sharding(torch.randn(8, 8).to(dev), mesh, ("a", None))
    assert met.counter_value("CreateOpSharding") == 2
    # as torch_xla's (an lru_cache on the Mesh method), another Mesh object has its own cache
    xs.mark_sharding(torch.randn(8, 8).to(dev), xs.Mesh(np.arange(8), (4, 2), ("a", "b")), (0, 1))
    assert met.counter_value("CreateOpSharding") == 3
    torch.testing.assert_close(ut.cpu(), u)


def test_reading_spmd_data_counts_replicate_sharded_data(mesh):
    x = torch.randn(8, 8)
    t = x.to(dev)
    xs.mark_sharding(t, mesh, ("x", "y"))
    met.clear_all()
    torch.testing.assert_close(t.cpu(), x)
    assert met.counter_value("ReplicateShardedData") == 1
    torch.testing.assert_close((t * 2).cpu(), x * 2)
    assert met.counter_value("ReplicateShardedData") == 2


def test_xla_process_group_in_spmd_mode_is_an_assertion_error():
    import torch.distributed as dist

    from lazyxla._src import xla_backend

    with pytest.raises(AssertionError, match="gloo"):
        xla_backend._create(None, 0, 1, None)
    assert issubclass(xla_backend.SpmdProcessGroupError, RuntimeError)
    assert not dist.is_initialized()


def test_deepcopy_and_views_of_a_sharded_tensor(mesh):
    import copy

    x = torch.randn(8, 8)
    st = xs.mark_sharding(x.to(dev), mesh, ("x", "y"))
    dup = copy.deepcopy(st)
    assert isinstance(dup, xs.XLAShardedTensor) and dup.sharding_spec == st.sharding_spec
    assert dup.partition_spec == ("x", "y")
    dup += 1  # a copy: the original is unchanged
    torch.testing.assert_close(st.cpu(), x)
    torch.testing.assert_close(dup.cpu(), x + 1)
    a, b = st.chunk(2)
    assert isinstance(a, xs.XLAShardedTensor)
    torch.testing.assert_close(b.cpu(), x[4:])
    assert type(st.cpu()) is torch.Tensor
