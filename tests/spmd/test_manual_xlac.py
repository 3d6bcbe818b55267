"""torch_xla's low-level manual sharding entry points (`_XLAC._spmd_full_to_shard_shape`,
`_spmd_shard_to_full_shape`, `xs._mark_manual_sharding`), against eager CPU."""

import pytest
import torch

import lazyxla
import lazyxla.distributed.spmd as xs
from lazyxla._src import manual, xlac

dev = lazyxla.device()
XLAC = xlac._make_xlac()


def test_full_to_shard_then_shard_to_full_matches_eager(mesh):
    x = torch.randn(8, 8)
    xt = xs.mark_sharding(x.to(dev), mesh, ("x", "y"))
    local = XLAC._spmd_full_to_shard_shape(xt.global_tensor)
    assert tuple(local.shape) == (2, 4)
    assert XLAC._get_xla_sharding_spec(local) == "{manual}"
    marked = xs._mark_manual_sharding(local * 3 - 1)
    assert marked.sharding_type == xs.ShardingType.MANUAL
    assert marked.sharding_spec == "{manual}"
    op = mesh.get_op_sharding(("x", "y"))
    full = XLAC._spmd_shard_to_full_shape(marked.global_tensor, op, x.shape, x.dtype)
    assert tuple(full.shape) == (8, 8)
    assert XLAC._get_xla_sharding_spec(full) == op
    torch.testing.assert_close(full.cpu(), x * 3 - 1)


def test_shard_to_full_replicated_op_sharding(mesh):
    # A replicated region: every device's shard is the whole tensor (upstream's replicated case).
    x = torch.randn(8, 4)
    xt = xs.mark_sharding(x.to(dev), mesh, (None, None))
    local = XLAC._spmd_full_to_shard_shape(xt.global_tensor)
    assert tuple(local.shape) == (8, 4)
    marked = xs._mark_manual_sharding(local.exp())
    rep = XLAC.OpSharding([], [], [], xs.ShardingType.REPLICATED)
    full = XLAC._spmd_shard_to_full_shape(marked.global_tensor, rep, (8, 4), x.dtype)
    assert XLAC._get_xla_sharding_spec(full) == "{replicated}"
    torch.testing.assert_close(full.cpu(), x.exp())
    bad = XLAC.OpSharding([], [], [], xs.ShardingType.TILED)
    with pytest.raises(NotImplementedError, match="get_op_sharding"):
        XLAC._spmd_shard_to_full_shape(marked.global_tensor, bad, (8, 4), x.dtype)


def test_errors_name_the_missing_step(mesh):
    x = torch.zeros(8, 8).to(dev)
    with pytest.raises(RuntimeError, match="no sharding annotation"):
        XLAC._spmd_full_to_shard_shape(x)
    with pytest.raises(RuntimeError, match="device data"):
        xs._mark_manual_sharding(x)
    y = x + 1
    xs.mark_sharding(y, mesh, ("x", "y"))
    rep = XLAC.OpSharding([], [], [], xs.ShardingType.REPLICATED)
    with pytest.raises(RuntimeError, match="not a manual shard"):
        XLAC._spmd_shard_to_full_shape(y, rep, (8, 8), y.dtype)
    local = xs._mark_manual_sharding(XLAC._spmd_full_to_shard_shape(y))
    other = xs.Mesh(list(range(7, -1, -1)), (4, 2), ("x", "y")).get_op_sharding(("x", "y"))
    with pytest.raises(NotImplementedError, match="one mesh"):
        XLAC._spmd_shard_to_full_shape(local, other, (8, 8), y.dtype)
    assert isinstance(manual.OpSharding([], [], [], 4).sharding_type, xs.ShardingType)
    z = y * 3
    XLAC._mark_manual_sharding(z, XLAC.OpSharding([], [], [], xs.ShardingType.MANUAL))
    assert XLAC._get_xla_sharding_spec(z) == "{manual}"
    with pytest.raises(RuntimeError, match="MANUAL"):
        XLAC._mark_manual_sharding(z, rep)


def test_manual_value_outside_a_region_is_every_devices_shard(mesh):
    # upstream's test_spmd_shard_to_full_shape: a global value marked manual, then made full
    x = torch.randn(8, 8)
    t = x.to(dev)
    t += 1
    xt = xs.mark_sharding(t, mesh, ("x", "y"))
    xs.clear_sharding(xt)
    xt = xs._mark_manual_sharding(xt)
    rep = XLAC.OpSharding([], [], [], xs.ShardingType.REPLICATED)
    full = XLAC._spmd_shard_to_full_shape(xt.global_tensor, rep, (8, 8), x.dtype)
    assert XLAC._get_xla_sharding_spec(full) == "{replicated}"
    torch.testing.assert_close(full.cpu(), x + 1)
    # tiled: every device contributes the same (2, 4) value as its tile
    small = torch.randn(2, 4)
    local = xs._mark_manual_sharding(small.to(dev) * 2)
    op = mesh.get_op_sharding(("x", "y"))
    tiled = XLAC._spmd_shard_to_full_shape(local.global_tensor, op, (8, 8), x.dtype)
    assert XLAC._get_xla_sharding_spec(tiled) == op
    torch.testing.assert_close(tiled.cpu(), (small * 2).repeat(4, 2))
    with pytest.raises(ValueError, match="does not tile"):
        XLAC._spmd_shard_to_full_shape(local.global_tensor, op, (8, 4), x.dtype)


def test_sync_leaves_an_unclosed_region_pending_and_runs_the_rest(mesh):
    import lazyxla.debug.metrics as met

    x = torch.randn(8, 8)
    xt = xs.mark_sharding(x.to(dev), mesh, ("x", "y"))
    local = XLAC._spmd_full_to_shard_shape(xt.global_tensor) + 1  # never closed
    other = xt.global_tensor * 2
    met.clear_all()
    with pytest.warns(UserWarning, match="never closed"):
        lazyxla.sync()
    assert met.counter_value("ExecuteReplicated") == 1  # torch_xla's SPMD execution counter
    assert XLAC._get_xla_tensor_debug_info(other).count("XLAData: None") == 0
    torch.testing.assert_close(other.cpu(), x * 2)
    with pytest.raises(Exception, match="never closed"):
        local.cpu()
