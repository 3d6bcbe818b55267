"""The rest of torch_xla's SPMD surface on 8 virtual CPU devices: the `xla_sharding` module by
name, annotate_custom_sharding, shard_as, MarkShardingFunction, einsum linears, and the DTensor
conversions of `spmd.api`; values against eager PyTorch, shardings against torch_xla's strings."""

import numpy as np
import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla._src import sharding
from lazyxla.distributed.spmd import api
from lazyxla.distributed.spmd import xla_sharding as xs

dev = lazyxla.device()


@pytest.fixture(autouse=True)
def spmd():
    sharding.use_spmd()
    yield
    sharding._leave_spmd_for_tests()


@pytest.fixture
def mesh():
    return xs.Mesh(np.arange(8), (4, 2), ("x", "y"))


def test_xla_sharding_module_has_torch_xla_names():
    import lazyxla.distributed.spmd as spmd

    for name in (
        "Mesh", "HybridMesh", "mark_sharding", "clear_sharding", "shard_as",
        "annotate_custom_sharding", "MarkShardingFunction", "apply_xla_patch_to_nn_linear",
        "wrap_as_sharded_tensor", "unwrap_sharded_tensor", "XLAShardedTensor", "ShardingType",
    ):  # fmt: skip
        assert callable(getattr(xs, name)), name
    assert spmd.xla_sharding is xs and spmd.shard_as is xs.shard_as
    from lazyxla.distributed.spmd.debugging import construct_v1_sharding_str

    t = torch.randn(8, 8).to(dev)
    xs.mark_sharding(t, xs.Mesh(np.arange(8), (4, 2)), (None, 1))
    assert (
        construct_v1_sharding_str(t) == "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"
    )


def test_annotate_custom_sharding_constrains_without_moving_data(mesh):
    x = torch.randn(8, 8)
    t = x.to(dev)
    lazyxla.sync()  # uploads it (Note [SPMD virtual device]): device data from here on
    met.clear_all()
    st = xs.annotate_custom_sharding(t, mesh, ("x", "y"))
    assert met.metric_data("TransferToDeviceTime") is None  # no reshard of the device data
    assert st.sharding_spec == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close((st.global_tensor * 2).cpu(), x * 2)
    with pytest.raises(ValueError, match="Partition spec length"):
        xs.annotate_custom_sharding(t, mesh, ("x",))


def test_shard_as_gives_both_the_same_sharding(mesh):
    a, b = torch.randn(8, 4), torch.randn(8, 4)
    ta = a.to(dev)
    xs.mark_sharding(ta, mesh, ("x", None))
    (a2, none_a), (b2, none_b) = xs.shard_as((ta, None), (b.to(dev), None))
    assert none_a is None and none_b is None
    out = a2 + b2 * 2
    torch.testing.assert_close(out.cpu(), a + b * 2)
    hlo = lazyxla.debug.hlo_text([out])
    assert "sharding=" in hlo
    # Neither annotated: the partitioner picks one sharding for both (jax's shard_alike).
    c2, d2 = xs.shard_as(a.to(dev) * 1, b.to(dev))
    torch.testing.assert_close((c2 - d2).cpu(), a - b)
    with pytest.raises(ValueError, match="same structure"):
        xs.shard_as((ta,), [ta])


def test_mark_sharding_function_shards_value_and_gradient(mesh):
    x = torch.randn(8, 8, requires_grad=True)
    xd = x.detach().to(dev).requires_grad_()
    y = xs.MarkShardingFunction.apply(xd, mesh, ("x", None))
    assert lazyxla.debug.sharding_spec(y).startswith("{devices=[4,1,2]")
    assert lazyxla.debug.sharding_spec(xd) == ""  # not in place
    (y.sin() * y).sum().backward()
    (x.sin() * x).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


def test_apply_xla_patch_to_nn_linear_keeps_values_and_grads():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    model = xs.apply_xla_patch_to_nn_linear(
        torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    )
    model.load_state_dict(ref.state_dict())
    assert isinstance(model[0], xs.EinsumLinear) and isinstance(model[2], xs.EinsumLinear)
    model.to(dev)
    x = torch.randn(3, 5, 4)
    out = model(x.to(dev))
    ref_out = ref(x)
    out.sum().backward()
    ref_out.sum().backward()
    torch.testing.assert_close(out.cpu(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[0].weight.grad.cpu(), ref[0].weight.grad, rtol=1e-5, atol=1e-5)


class _Placement:
    def __init__(self, dim=None):
        self.dim = dim

    def is_shard(self):
        return self.dim is not None

    def is_replicate(self):
        return self.dim is None


class _DeviceMesh:
    """The parts of torch.distributed's DeviceMesh the conversions read."""

    device_type = "xla"

    def __init__(self, ids, names=None):
        self.mesh = torch.tensor(ids)
        self.mesh_dim_names = names
        self.ndim = self.mesh.dim()

    def size(self):
        return self.mesh.numel()


def test_dtensor_mesh_and_placements_convert():
    dm = _DeviceMesh(np.arange(8).reshape(2, 4).tolist(), ("dp", "tp"))
    mesh = api.convert_to_xla_mesh(dm)
    assert mesh.mesh_shape == (2, 4) and mesh.axis_names == ("dp", "tp")
    t = torch.randn(4, 8, 8)
    assert api.convert_to_xla_partition_spec(t, [_Placement(), _Placement(0)]) == (1, None, None)
    st = api.xla_distribute_tensor(t, dm, [_Placement(1), _Placement(2)])
    assert st.sharding_spec == "{devices=[1,2,4]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close(st.global_tensor.cpu(), t)
    with pytest.raises(ValueError, match="devices"):
        api.convert_to_xla_mesh(_DeviceMesh([0, 1]))


def test_xla_distribute_module_partitions_and_hooks():
    dm = _DeviceMesh(list(range(8)))
    mesh = api.convert_to_xla_mesh(dm)
    model = torch.nn.Linear(8, 4).to(dev)

    def partition(name, module, device_mesh):
        if isinstance(module, torch.nn.Linear):
            xs.mark_sharding(module.weight, mesh, (None, 0))

    seen = []
    api.xla_distribute_module(
        model, dm, partition, input_fn=lambda m, inputs, d: seen.append(len(inputs))
    )
    assert lazyxla.debug.sharding_spec(model.weight).startswith("{devices=[1,8]")
    model(torch.randn(2, 8, device=dev))
    assert seen == [1]
    with pytest.raises(NotImplementedError, match="auto-sharding"):
        api.xla_distribute_module(model, dm, api.auto_policy)
