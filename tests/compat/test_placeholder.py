"""torch_xla.core.xla_builder.create_placeholder_tensor (Note [Placeholder tensors]): a device
tensor with no buffer that stages out graphs (IR, HLO, graph hash as for real data), fails to be
read, and computes as eager once it receives data; buffer handles, and donated buffers reported
as placeholders."""

from __future__ import annotations

import pytest
import torch

import lazyxla
from lazyxla._src import api, debug, xlac
from lazyxla._src.op_builder import is_placeholder, tensors_handle
from lazyxla.core.xla_builder import create_placeholder_tensor
from lazyxla.debug import metrics

DEV = lazyxla.device()


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((1, 2), torch.float32),
        ((2, 3, 4), torch.bfloat16),
        ((3, 4, 5, 6), torch.int8),
        ((), torch.int64),
    ],
)
def test_has_shape_dtype_device_and_no_buffer(shape, dtype):
    p = create_placeholder_tensor(shape, dtype)
    assert p.device == DEV and p.dtype == dtype and p.shape == shape
    assert is_placeholder(p)
    with pytest.raises(RuntimeError, match="deleted"):
        p.cpu()


def test_stages_out_a_graph_without_transfers():
    metrics.clear_all()
    p1 = create_placeholder_tensor((2, 3), torch.bfloat16)
    p2 = create_placeholder_tensor((3, 4), torch.bfloat16)
    b = (torch.sin(p1) @ p2) @ p2.T  # p2 used twice: still one parameter
    ir = debug.ir_text([b])
    assert ir.count("xla::device_data()") == 2
    assert ir.count("bf16[3,4]{1,0} xla::device_data()") == 1
    assert ir.count("bf16[2,3]{1,0} xla::device_data()") == 1
    entry = [line for line in debug.hlo_text([b]).splitlines() if line.startswith("ENTRY")][0]
    assert entry.count("bf16[3,4]") == 1 and entry.count("bf16[2,3]") == 2
    assert not metrics.metric_data("TransferToDeviceTime")
    # The staged graph is the one real data of the same shapes gives: one compile serves both.
    r1 = torch.randn(2, 3, dtype=torch.bfloat16).to(DEV)
    r2 = torch.randn(3, 4, dtype=torch.bfloat16).to(DEV)
    assert api.graph_hash([b]) == api.graph_hash([(torch.sin(r1) @ r2) @ r2.T])


def test_a_graph_reading_it_fails_and_the_rest_still_runs():
    p = create_placeholder_tensor((4,), torch.float32)
    bad = p * 2
    good = torch.arange(4.0).to(DEV) + 1
    with pytest.raises(RuntimeError, match="deleted"):
        bad.cpu()
    torch.testing.assert_close(good.cpu(), torch.arange(4.0) + 1)


def test_receives_data_by_copy_then_computes_as_eager():
    p = create_placeholder_tensor((2, 3), torch.float32)
    x = torch.randn(2, 3)
    p.copy_(x.to(DEV))
    assert not is_placeholder(p)
    torch.testing.assert_close((p.sin() * 3).cpu(), x.sin() * 3)


def test_handles_unique_and_donated_buffers_have_none():
    p1 = create_placeholder_tensor((1,), torch.bfloat16)
    p2 = create_placeholder_tensor((1,), torch.bfloat16)
    h1, h2 = tensors_handle([p1, p2])
    assert h1 != h2
    t0 = torch.randn(4, 2, 2).to(DEV)
    t1 = torch.randn(4, 2, 2).to(DEV)
    h_t1 = tensors_handle([t1])[0]
    assert tensors_handle([t1]) == [h_t1] and h_t1 not in (h1, h2)
    assert xlac._set_buffer_donation(t0, True)
    _ = t0 + t1
    lazyxla.sync(wait=True)
    assert is_placeholder(t0) and not is_placeholder(t1)
    with pytest.raises(RuntimeError, match="is deleted"):
        tensors_handle([t0])


def test_bad_arguments():
    with pytest.raises(TypeError, match="torch.dtype"):
        create_placeholder_tensor((2,), "float32")
    with pytest.raises(ValueError, match="negative"):
        create_placeholder_tensor((2, -1), torch.float32)
    with pytest.raises(TypeError, match="lazyxla tensor"):
        is_placeholder(torch.zeros(2))


def test_sharded_placeholder_stages_the_sharded_graph():
    import gc

    import numpy as np

    import lazyxla.distributed.spmd as xs
    from lazyxla._src import sharding

    gc.collect()  # (no dead tensor of an earlier test is moved to the mesh)
    try:
        sharding.use_spmd()
        mesh = xs.Mesh(np.arange(8), (8, 1), ("x", "y"))
        p = create_placeholder_tensor((8, 4), torch.float32)
        assert xlac._get_xla_sharding_spec(p) == ""
        xs.mark_sharding(p, mesh, ("x", None))
        assert is_placeholder(p)
        assert xlac._get_xla_sharding_spec(p) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
        r = torch.randn(8, 4).to(DEV)
        xs.mark_sharding(r, mesh, ("x", None))
        assert api.graph_hash([p.sin()]) == api.graph_hash([r.sin()])
    finally:
        sharding._leave_spmd_for_tests()
