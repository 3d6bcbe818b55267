"""while_loop and fori_loop (Note [Loop nodes]): values against the eager Python loop on CPU, one
`xla::while_loop` node (no per-iteration sync), compile counts, errors for bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._higher_order_ops.while_loop import while_loop
from util import DEV, assert_same

import lazyxla
from lazyxla._src import control_flow
from lazyxla._src.ir import post_order
from lazyxla._src.tensor import read, state
from lazyxla.debug import metrics
from lazyxla.experimental.fori_loop import fori_loop

F64 = torch.float64


def eager_while(cond_fn, body_fn, operands):
    while cond_fn(*operands):
        operands = body_fn(*operands)
    return operands


def _count(name: str) -> int:
    return metrics.counter_value(name) or 0


def test_while_loop_matches_the_python_loop_in_one_node():
    def cond_fn(i, x):
        return i > 0

    def body_fn(i, x):
        return i - 1, torch.sin(x) + x * 0.5

    x = torch.randn(3, dtype=F64)
    i_cpu, x_cpu = eager_while(cond_fn, body_fn, (torch.tensor(7), x))
    lazyxla.sync()
    metrics.clear_all()
    i_l, x_l = while_loop(cond_fn, body_fn, (torch.tensor(7, device=DEV), x.to(DEV)))
    assert _count("xla::while_loop") == 1
    assert _count("ExecuteComputation") == 0  # no sync per iteration: still pending
    nodes = post_order([read(state(x_l))[0]])
    assert [n.op for n in nodes if "while" in n.op] == ["xla::while_loop"]
    assert_same(x_l, x_cpu)
    assert i_l.cpu().item() == i_cpu.item() == 0


def test_while_loop_with_module_weights_as_additional_inputs():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4).double()
    lazy_lin = nn.Linear(4, 4).double()
    lazy_lin.load_state_dict(lin.state_dict())
    lazy_lin.to(DEV)

    def run(layer, i, x):
        return while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, torch.tanh(layer(x))), (i, x))

    x = torch.randn(2, 4, dtype=F64)
    with torch.no_grad():
        _, expected = eager_while(
            lambda i, x: i < 5, lambda i, x: (i + 1, torch.tanh(lin(x))), (torch.tensor(0), x)
        )
        _, got = run(lazy_lin, torch.tensor(0, device=DEV), x.to(DEV))
    assert_same(got, expected)


def test_while_loop_same_shapes_new_values_compile_once():
    def cond_fn(i, x):
        return i < 10

    def body_fn(i, x):
        return i + 1, x * 1.5 + 1

    def run(start, x):
        out = while_loop(cond_fn, body_fn, (torch.tensor(start, device=DEV), x.to(DEV)))
        lazyxla.sync()
        return [t.cpu() for t in out]

    run(0, torch.ones(3))
    metrics.clear_all()
    i, x = run(4, torch.full((3,), 2.0))
    assert _count("UncachedCompile") == 0
    _, expected = eager_while(cond_fn, body_fn, (torch.tensor(4), torch.full((3,), 2.0)))
    assert i.item() == 10
    assert_same(x, expected)


def test_while_loop_that_never_runs_returns_its_inputs():
    x = torch.randn(3)
    i, y = while_loop(
        lambda i, x: i < 0, lambda i, x: (i + 1, x + 1), (torch.tensor(0, device=DEV), x.to(DEV))
    )
    assert_same(y, x)
    assert i.cpu().item() == 0


@pytest.mark.parametrize("lower,upper", [(0, 6), (2, 9)])
def test_fori_loop_matches_the_python_loop(lower, upper):
    x = torch.randn(2, 3, dtype=F64)
    expected = x.clone()
    for _ in range(lower, upper):
        expected = torch.cos(expected) * 2
    idx, got = fori_loop(lower, upper, lambda v: torch.cos(v) * 2, x.to(DEV))
    assert_same(got, expected)
    assert idx.cpu().item() == upper


def test_fori_loop_tensor_bounds_and_several_values():
    lo, hi = torch.tensor(1, device=DEV), torch.tensor(5, device=DEV)
    a, b = torch.zeros(2, device=DEV), torch.ones(2, device=DEV, dtype=torch.int32)
    idx, a2, b2 = fori_loop(lo, hi, lambda a, b: (a + b, b * 2), a, b)
    # b doubles 4 times: 1, 2, 4, 8 are added to a
    assert a2.cpu().tolist() == [15.0, 15.0]
    assert b2.cpu().tolist() == [16, 16] and b2.dtype == torch.int32
    assert idx.cpu().item() == 5


def test_loop_errors_say_what_and_how_to_fix():
    i, x = torch.tensor(0, device=DEV), torch.zeros(2, device=DEV)
    with pytest.raises(ValueError, match="single-element torch.bool tensor"):
        control_flow.while_loop(lambda i, x: x, lambda i, x: (i + 1, x), [i, x])
    with pytest.raises(ValueError, match=r"changed the dtype of carry\[1\]: given f32\[2\]"):
        control_flow.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x.double()), [i, x])
    with pytest.raises(ValueError, match=r"changed the shape of carry\[1\]"):
        control_flow.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x[:1]), [i, x])
    with pytest.raises(ValueError, match="returned 1 carry tensors but was given 2"):
        control_flow.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1,), [i, x])
    with pytest.raises(ValueError, match="is on cpu"):
        control_flow.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x), [i, torch.zeros(2)])
    with pytest.raises(ValueError, match="must be an int or integer tensor"):
        fori_loop(0.5, 3, lambda v: v, x)
    with pytest.raises(ValueError, match="carried input must be a tensor"):
        control_flow.while_loop_hop(lambda i, x: i < 3, lambda i, x: (i + 1, x), (3, x), ())


def test_random_op_in_while_body_draws_fresh_values_per_call():
    def run():
        _, x = while_loop(
            lambda i, x: i < 3,
            lambda i, x: (i + 1, x + torch.rand(4, device=DEV)),
            (torch.tensor(0, device=DEV), torch.zeros(4, device=DEV)),
        )
        return x.cpu()

    a, b = run(), run()
    assert not torch.equal(a, b)
    assert ((a >= 0) & (a <= 3)).all()


def test_random_op_in_while_body_draws_anew_each_iteration():
    def body(i, last, same):
        r = torch.rand(4, device=DEV)
        return i + 1, r, same + (r == last).sum()

    start = (torch.tensor(0, device=DEV), torch.zeros(4, device=DEV), torch.tensor(0, device=DEV))
    _, _, same = while_loop(lambda i, last, same: i < 4, body, start)
    assert same.cpu().item() == 0
