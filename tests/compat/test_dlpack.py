"""torch_xla.utils.dlpack: lazy tensors to and from DLPack (Note [DLPack]), round trips against
the CPU tensors and jax arrays they came from."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.utils.dlpack as torch_dlpack

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla._src.tensor import state
from lazyxla.utils import dlpack as xdlpack

dev = lazyxla.device()


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.bool]
)
def test_round_trip_with_torch_cpu_tensors(dtype):
    cpu = (torch.randn(3, 5) * 4).to(dtype)
    t = xdlpack.from_dlpack(cpu)
    assert t.device == dev and t.dtype == dtype and t.shape == cpu.shape
    torch.testing.assert_close(t.cpu(), cpu)
    if dtype.is_floating_point:  # the tensor computes like any other lazy tensor
        torch.testing.assert_close((t * 2 + 1).cpu(), cpu * 2 + 1)
    back = torch_dlpack.from_dlpack(xdlpack.to_dlpack(t))
    assert back.device.type == "cpu"
    torch.testing.assert_close(back, cpu)


def test_capsules_and_non_contiguous_inputs():
    cpu = torch.arange(12.0).reshape(3, 4)
    torch.testing.assert_close(xdlpack.from_dlpack(cpu.__dlpack__()).cpu(), cpu)
    transposed = cpu.t()  # strided: imported as its logical value
    torch.testing.assert_close(xdlpack.from_dlpack(transposed).cpu(), transposed)
    scalar = torch.tensor(2.5)
    torch.testing.assert_close(xdlpack.from_dlpack(scalar).cpu(), scalar)


def test_round_trip_with_jax_arrays():
    arr = jnp.arange(6, dtype=jnp.float32).reshape(2, 3) / 7
    t = xdlpack.from_dlpack(arr)
    np.testing.assert_array_equal(t.cpu().numpy(), np.asarray(arr))
    out = xdlpack.to_dlpack(t.sum(0))
    j = jax.dlpack.from_dlpack(torch_dlpack.from_dlpack(out))
    np.testing.assert_allclose(np.asarray(j), np.asarray(arr).sum(0), rtol=1e-6)


def test_exported_buffer_is_not_changed_by_later_lazy_ops():
    t = torch.ones(4, device=dev) * 3
    exported = torch_dlpack.from_dlpack(xdlpack.to_dlpack(t))
    t.add_(1)  # a new buffer, as in torch_xla: the exported one keeps the old value
    lazyxla.sync()
    torch.testing.assert_close(exported, torch.full((4,), 3.0))
    torch.testing.assert_close(t.cpu(), torch.full((4,), 4.0))


def test_export_of_a_cached_scalar_upload_is_a_private_copy():
    a = torch.tensor(7.0).to(dev)
    b = torch.tensor(7.0).to(dev)  # may share a's cached upload
    exported = torch_dlpack.from_dlpack(xdlpack.to_dlpack(a))
    exported.fill_(0)
    assert b.item() == 7.0
    # b's device buffer itself, not a host copy of it (Note [Host values of device data])
    assert float(np.asarray(state(b).value[0].data)) == 7.0


def test_writes_through_shared_memory_are_seen_by_later_reads():
    """Note [DLPack]: a write through the other side shows in the lazy tensor; no host copy of
    the buffer (Note [Host values of device data]) may stand for it."""
    cpu = torch.arange(6, dtype=torch.float32)
    imported = xdlpack.from_dlpack(cpu)
    assert imported.cpu().tolist() == [0, 1, 2, 3, 4, 5]
    cpu.fill_(5)  # the producer writes its buffer
    if state(imported).value[0].data.unsafe_buffer_pointer() == cpu.data_ptr():  # aliased
        assert imported.cpu().tolist() == [5] * 6
    t = torch.arange(4, device=dev) + 1
    lazyxla.sync()
    assert t.cpu().tolist() == [1, 2, 3, 4]
    exported = torch_dlpack.from_dlpack(xdlpack.to_dlpack(t))
    exported.fill_(9)  # the consumer writes the lazy tensor's buffer
    assert t.cpu().tolist() == [9] * 4


def test_import_compiles_nothing():
    met.clear_all()
    xdlpack.from_dlpack(torch.randn(8))
    assert not met.counter_value("UncachedCompile")


def test_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="lazyxla tensor"):
        xdlpack.to_dlpack(torch.ones(2))
    with pytest.raises(TypeError, match="already a lazyxla tensor"):
        xdlpack.from_dlpack(torch.ones(2, device=dev))

    class OnGpu:
        def __dlpack_device__(self):
            return (2, 0)  # kDLCUDA

        def __dlpack__(self, **kwargs):
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match="only supports CPU"):
        xdlpack.from_dlpack(OnGpu())
