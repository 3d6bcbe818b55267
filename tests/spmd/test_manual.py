"""Manual sharding regions (shard_map) and collectives inside them, against eager CPU."""

import numpy as np
import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
import lazyxla.distributed.spmd as xs
from lazyxla._src import manual
from lazyxla._src.tensor import state

dev = lazyxla.device()


def test_local_shard_ops_and_back(mesh):
    x = torch.randn(8, 8)
    local = xs.enable_manual_sharding(x.to(dev), ("x", "y"), mesh=mesh)
    assert tuple(local.shape) == (2, 4)
    assert lazyxla.debug.sharding_spec(local) == "{manual}"
    y = local * 2 + 1
    full = xs.disable_manual_sharding(y, ("x", "y"), (8, 8), mesh=mesh)
    assert lazyxla.debug.sharding_spec(full) == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close(full.cpu(), x * 2 + 1)


def test_all_reduce_inside_region_gives_the_eager_sum(mesh):
    x = torch.randn(8, 8)
    local = xs.enable_manual_sharding(x.to(dev), ("x", None), mesh=mesh)  # (2, 8) per device
    summed = manual.all_reduce(local, mesh, "sum", 1.0, groups=[[0, 2, 4, 6], [1, 3, 5, 7]])
    full = xs.disable_manual_sharding(summed, ("x", None), (8, 8), mesh=mesh)
    # Every row block becomes the sum of the four row blocks.
    block_sum = x.reshape(4, 2, 8).sum(0)
    torch.testing.assert_close(full.cpu(), block_sum.repeat(4, 1), rtol=1e-5, atol=1e-5)


def test_all_gather_and_reduce_scatter(mesh):
    x = torch.randn(8, 4)
    local = xs.enable_manual_sharding(x.to(dev), ("x", None), mesh=mesh)
    gathered = manual.all_gather(local, mesh, 0, groups=[[0, 2, 4, 6], [1, 3, 5, 7]])
    assert tuple(gathered.shape) == (8, 4)
    scattered = manual.reduce_scatter(gathered, mesh, "sum", 0.25, 0, [[0, 2, 4, 6], [1, 3, 5, 7]])
    full = xs.disable_manual_sharding(scattered, ("x", None), (8, 4), mesh=mesh)
    torch.testing.assert_close(full.cpu(), x, rtol=1e-5, atol=1e-5)


def test_region_compiles_once_for_new_data(mesh):
    met.clear_all()
    for _ in range(3):
        x = torch.randn(8, 8)
        local = xs.enable_manual_sharding(x.to(dev), ("x", "y"), mesh=mesh)
        full = xs.disable_manual_sharding(local.exp(), ("x", "y"), (8, 8), mesh=mesh)
        torch.testing.assert_close(full.cpu(), x.exp())
    assert met.counter_value("UncachedCompile") == 1


def test_unclosed_region_is_a_clear_error(mesh):
    local = xs.enable_manual_sharding(torch.randn(8, 8).to(dev), ("x", "y"), mesh=mesh)
    with pytest.raises(Exception, match="never closed"):
        (local + 1).cpu()
    # The open region is left out of later syncs (Note [Failed graphs]) once a sync has failed on
    # it; drop it so the next test's first sync does not fail on it first.
    del local


def test_groups_must_be_mesh_axes(mesh):
    with pytest.raises(ValueError, match="do not match"):
        manual.axes_for_groups(mesh, [[0, 1, 2], [3, 4, 5, 6, 7]])
    assert manual.axes_for_groups(mesh, [[0, 1], [2, 3], [4, 5], [6, 7]]) == ("y",)
    assert manual.axes_for_groups(mesh, None) == ("x", "y")
    assert np.array_equal(mesh.get_logical_mesh(), np.arange(8).reshape(4, 2))


def test_xm_all_reduce_inside_region(mesh):
    import lazyxla.core.xla_model as xm

    x = torch.randn(8, 4)
    local = xs.enable_manual_sharding(x.to(dev), (("x", "y"), None), mesh=mesh)  # (1, 4) each
    total = xm.all_reduce(xm.REDUCE_SUM, local, scale=0.5)
    full = xs.disable_manual_sharding(total, (("x", "y"), None), (8, 4), mesh=mesh)
    torch.testing.assert_close(full.cpu(), (x.sum(0) * 0.5).expand(8, 4), rtol=1e-5, atol=1e-5)
    rolled = xm.collective_permute(local, [[i, (i + 1) % 8] for i in range(8)])
    back = xs.disable_manual_sharding(rolled, (("x", "y"), None), (8, 4), mesh=mesh)
    torch.testing.assert_close(back.cpu(), torch.roll(x, 1, 0))


def test_a_full_sync_leaves_an_open_region_pending_and_walks_only_while_one_is_open(mesh):
    x = torch.randn(8, 8)
    lazyxla.sync()
    local = xs.enable_manual_sharding(x.to(dev), ("x", "y"), mesh=mesh)
    other = torch.ones(3, device=dev) * 2
    with pytest.warns(UserWarning, match="inside a manual sharding region that was never closed"):
        lazyxla.sync()
    assert not state(other).is_pending and state(local).is_pending  # the rest ran
    full = xs.disable_manual_sharding(local * 3, ("x", "y"), (8, 8), mesh=mesh)
    del local
    lazyxla.sync()  # nothing is left open: later syncs skip the walk
    assert manual._regions_unsynced == 0
    torch.testing.assert_close(full.cpu(), x * 3)
    local = xs.enable_manual_sharding(x.to(dev), ("x", "y"), mesh=mesh)  # a new one is seen again
    with pytest.warns(UserWarning, match="never closed"):
        lazyxla.sync()
    assert state(local).is_pending
    del local
