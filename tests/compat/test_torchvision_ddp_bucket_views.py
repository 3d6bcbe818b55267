"""Gradients as views of one flat bucket, as torch DDP's `gradient_as_bucket_view=True` makes them
(pytorch/xla's examples/data_parallel/train_resnet_ddp.py): dense as_strided views are read and
written as slices of the storage (Note [Dense strided views] in ops/shape.py), not through an
index array the size of the view. Values against eager CPU; the program checked for gathers."""

from __future__ import annotations

import math

import torch
from util import DEV, assert_same, check

from lazyxla.core import xla_model as xm

SHAPES = [(8, 3, 3, 3), (8,), (4, 8), (4,)]


def _contiguous_strides(shape):
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


def _bucket_views(bucket, shapes, gap=0):
    views, offset = [], gap
    for shape in shapes:
        views.append(bucket.as_strided(shape, _contiguous_strides(shape), offset))
        offset += math.prod(shape) + gap
    return views


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )


def _train_into_bucket(model, x, y, steps=2):
    """Each parameter's .grad is a view of one flat bucket; backward accumulates into it."""
    params = list(model.parameters())
    total = sum(p.numel() for p in params) + 3  # a tail the views do not cover
    bucket = torch.zeros(total, device=x.device)
    for p, view in zip(params, _bucket_views(bucket, [p.shape for p in params])):
        p.grad = view
    opt = torch.optim.SGD(params, lr=0.1)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        xm.mark_step()
    assert all(p.grad.data_ptr() != 0 for p in params)
    return bucket, [p.detach() for p in params]


def test_gradients_accumulate_into_bucket_views_as_in_eager():
    x, y = torch.randn(2, 3, 6, 6), torch.tensor([1, 3])
    eager = _train_into_bucket(_model(), x, y)
    lazy = _train_into_bucket(_model().to(DEV), x.to(DEV), y.to(DEV))
    assert_same(lazy, eager, rtol=1e-5, atol=1e-6)


def test_dense_views_read_and_write_without_an_index_array():
    def prog(src):
        bucket = torch.zeros(src.numel() + 2, device=src.device)
        flat = src.reshape(-1)
        offset = 0
        for shape in SHAPES:  # each view taken after the previous write, as DDP's are
            v = bucket.as_strided(shape, _contiguous_strides(shape), offset)
            v.copy_(flat[offset : offset + v.numel()].view(shape) * 2)
            offset += v.numel()
        reads = [v.sum() for v in _bucket_views(bucket, SHAPES)]
        # A permuted dense block (a transpose written through as_strided) and a size-1 dim.
        t = bucket.as_strided((4, 8), (1, 4), 10)
        t.mul_(3)
        u = bucket.as_strided((1, 5), (7, 1), 100)
        return [bucket, *reads, t * 1, u * 1]

    src = torch.randn(sum(math.prod(s) for s in SHAPES), requires_grad=True)
    check(prog, src, rtol=1e-6, atol=1e-5)  # the sums may add in another order
    lazy = prog(src.detach().to(DEV))
    hlo = xm.get_stablehlo(lazy)
    assert "gather" not in hlo and "scatter" not in hlo, hlo[:2000]
    assert "dynamic_update_slice" in hlo


def test_views_that_are_not_dense_blocks_still_match_eager():
    def prog(src):
        bucket = torch.zeros(64, device=src.device)
        gapped = bucket.as_strided((3, 4), (10, 2), 1)  # every other element, rows apart
        gapped.copy_(src)
        overlapping = bucket.as_strided((3, 3), (1, 1), 40)  # windows sharing elements
        overlapping.fill_(5.0)
        return [bucket, gapped * 1, overlapping * 1]

    check(prog, torch.randn(3, 4), exact=True, grad=False)  # eager has no grad for overlaps
