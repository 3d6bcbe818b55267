"""`torch.einsum` on lazy tensors kept as one einsum (Note [Einsum kept whole]): values and
gradients against float64 eager, bf16 bit-equal to eager, and inside a scan body."""

import re

import pytest
import torch

import lazyxla
from lazyxla._src.debug import hlo_text
from lazyxla.experimental.scan import scan

dev = lazyxla.device()

CASES = [
    ("...n,mn->...m", (3, 4, 5, 16), (8, 16)),
    ("bnsh,bnkh->bnsk", (2, 3, 5, 4), (2, 3, 6, 4)),
    ("bnsk,bnkh->bnsh", (2, 3, 5, 6), (2, 3, 6, 4)),
    ("ij,jk", (4, 5), (5, 3)),  # implicit output
    ("i,j->ij", (4,), (3,)),
]


@pytest.mark.parametrize("equation,sa,sb", CASES)
def test_values_and_gradients_equal_eager(equation, sa, sb):
    torch.manual_seed(0)
    a = torch.randn(sa, dtype=torch.float64, requires_grad=True)
    b = torch.randn(sb, dtype=torch.float64, requires_grad=True)
    ref = torch.einsum(equation, a, b)
    ref.sin().sum().backward()
    la, lb = (t.detach().to(dev).requires_grad_() for t in (a, b))
    out = torch.einsum(equation, la, lb)
    out.sin().sum().backward()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(la.grad.cpu(), a.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lb.grad.cpu(), b.grad, rtol=1e-12, atol=1e-12)


def test_one_dot_keeping_the_batch_dims():
    x = torch.randn(3, 4, 5, 16, device=dev)
    w = torch.randn(8, 16, device=dev)
    assert re.search(r"dot\.\d+ = f32\[3,4,5,8\]", hlo_text([torch.einsum("...n,mn->...m", x, w)]))


def test_bf16_is_bit_equal_to_eager():
    torch.manual_seed(1)
    a, b = torch.randn(6, 32, dtype=torch.bfloat16), torch.randn(32, 5, dtype=torch.bfloat16)
    assert torch.equal(torch.einsum("ij,jk->ik", a.to(dev), b.to(dev)).cpu(), a @ b)


def test_other_equations_keep_the_decomposition():
    torch.manual_seed(2)
    m = torch.randn(4, 4, dtype=torch.float64)
    v = [torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)]
    assert torch.equal(torch.einsum("ii->i", m.to(dev)).cpu(), torch.einsum("ii->i", m))
    three = torch.einsum("ij,jk,kl->il", m.to(dev), v[0].to(dev), v[1].to(dev))
    torch.testing.assert_close(three.cpu(), torch.einsum("ij,jk,kl->il", m, *v))
    ints = torch.arange(6).reshape(2, 3)
    assert torch.equal(torch.einsum("ij,kj->ik", ints.to(dev), ints.to(dev)).cpu(), ints @ ints.T)


def test_in_a_scan_body_with_transposed_operands():
    """The custom ops' fake results are contiguous like the lazy ones, so the views a backward
    graph traced by AOTAutograd (a scan body) takes of them hold on the real results (pytorch/xla's
    decoder_only_model attention, scanned by examples/scan)."""

    def fn(c, w):
        b, s, d = c.shape
        q = (c * w).view(b, s, 2, d // 2).transpose(1, 2)  # (b, n, s, h), not contiguous
        k = c.view(b, s, 2, d // 2).transpose(1, 2)
        scores = torch.einsum("bnsh,bnkh->bnsk", q, k).softmax(-1)
        out = torch.einsum("bnsk,bnkh->bnsh", scores, k)
        return out.transpose(1, 2).reshape(b, s, d), None

    torch.manual_seed(3)
    init = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    ws = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    ref = init
    for i in range(3):
        ref = fn(ref, ws[i])[0]
    ref.sum().backward()
    li, lw = (t.detach().to(dev).requires_grad_() for t in (init, ws))
    out, _ = scan(fn, li, lw)
    out.sum().backward()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(li.grad.cpu(), init.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lw.grad.cpu(), ws.grad, rtol=1e-12, atol=1e-12)
