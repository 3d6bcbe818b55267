"""torch_xla's op builder and op registry over jax.lax (Note [Op builder]): registered ops
against the eager computations they stand for."""

import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla.core import xla_builder as xb
from lazyxla.core import xla_op_registry as xor

dev = lazyxla.device()


def test_arithmetic_op_and_cache():
    op = xor.register("axpb", lambda a, b, scale=1.0: a * scale + b.exp())
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(op(a.to(dev), b.to(dev), scale=2.0).cpu(), a * 2 + b.exp())
    lazyxla.sync()
    met.clear_all()
    for _ in range(3):
        op(torch.randn(2, 3, device=dev), torch.randn(2, 3, device=dev), scale=2.0).cpu()
    assert met.counter_value("UncachedCompile") == 1


@pytest.mark.parametrize("k0", [0.1, 0.9])
def test_conditional(k0):
    def op_fn(k, a, b, k0=None):
        cond = k > xb.Op.scalar(k.builder(), k0, dtype=k.shape().dtype)
        return cond.mkconditional((a, b), lambda a, b: a + b, lambda a, b: a - b)

    k, a, b = torch.tensor(0.2), torch.randn(2, 2), torch.randn(2, 2)
    out = xor.register("cond", op_fn)(k.to(dev), a.to(dev), b.to(dev), k0=k0)
    torch.testing.assert_close(out.cpu(), a + b if 0.2 > k0 else a - b)


def test_while_loop():
    def op_fn(a, b, limit=None):
        def cond(counter, a, b):
            return counter < xb.Op.scalar(counter.builder(), limit, dtype=xb.Type.S32)

        def body(counter, a, b):
            one = xb.Op.scalar(counter.builder(), 1, dtype=xb.Type.S32)
            return xb.Op.tuple((counter + one, a + b, b))

        zero = xb.Op.scalar(a.builder(), 0, dtype=xb.Type.S32)
        return xb.Op.mkwhile((zero, a, b), cond, body).get_tuple_element(1)

    a, b = torch.randn(2, 2), torch.randn(2, 2)
    out = xor.register("loop", op_fn)(a.to(dev), b.to(dev), limit=10)
    torch.testing.assert_close(out.cpu(), a + 10 * b)


def test_triangular_solve_tuple_and_types():
    b, A = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64).triu()
    A = A + 3 * torch.eye(2, dtype=torch.float64)

    def op_fn(b, A):
        x = A.triangualr_solve(b, True, False, False, False)
        return xb.Op.tuple((x, x.cast(xb.Type.F32)))

    x64, x32 = xor.register("trsm", op_fn)(b.to(dev), A.to(dev))
    ref = torch.linalg.solve_triangular(A, b, upper=True)
    torch.testing.assert_close(x64.cpu(), ref)
    assert x32.dtype == torch.float32
    for t in xb._XLA_PT_TYPE_MAP:
        assert xb.Op.from_torch_type(xb.Op.to_torch_type(t)) == t
    assert [s.dtype for s in xb.tensor_shape([b, A.float()])] == ["f64", "f32"]
