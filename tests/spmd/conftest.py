import numpy as np
import pytest

from lazyxla._src import sharding


@pytest.fixture(autouse=True)
def spmd():
    """Every SPMD test runs in SPMD mode on the 8 virtual CPU devices, then leaves it. Work an
    earlier test of the worker left pending runs first, outside SPMD mode: a full sync runs every
    live pending tensor, and one over single-device data cannot join a mesh program."""
    import lazyxla

    lazyxla.sync(wait=True)
    sharding.use_spmd()
    yield
    sharding._leave_spmd_for_tests()


@pytest.fixture
def mesh():
    import lazyxla.distributed.spmd as xs

    return xs.Mesh(np.arange(8), (4, 2), ("x", "y"))
