import numpy as np
import pytest

from lazyxla._src import sharding


@pytest.fixture(autouse=True)
def spmd():
    """Every SPMD test runs in SPMD mode on the 8 virtual CPU devices, then leaves it (work an
    earlier test of the worker left pending runs as `use_spmd()` enters, on one device)."""
    sharding.use_spmd()
    yield
    sharding._leave_spmd_for_tests()


@pytest.fixture
def mesh():
    import lazyxla.distributed.spmd as xs

    return xs.Mesh(np.arange(8), (4, 2), ("x", "y"))
