"""Reads answered on the host (Note [Small integer reads on the host], host_read.py): small
integer bookkeeping and data moved by cat/slices/views are read without compiling a graph, equal
to eager, and bound as device data so later graphs and reads agree; everything else compiles as
before."""

from __future__ import annotations

import torch

import lazyxla
from lazyxla._src.config import FLAGS
from lazyxla._src.tensor import state
from lazyxla.debug import metrics

DEV = lazyxla.device()


def _count(name: str) -> int:
    return metrics.counter_value(name) or 0


def _ints(dev: str) -> list:
    eos = torch.tensor([7, 3, -2], device=dev)
    pad = eos[0]
    ids = torch.arange(12, device=dev).view(2, 6) % 5
    mask = torch.ones_like(ids)
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return [
        torch.isin(eos, pad).any(),
        (eos < 0).any(),
        (mask == 1).all(),
        pos,
        torch.full((2,), True, device=dev, dtype=torch.bool) & (ids[:, -1] > 2),
        ids.sum(-1, dtype=torch.int32),
    ]


def test_small_integer_reads_compile_nothing_and_equal_eager():
    ref = _ints("cpu")
    c, h = _count("UncachedCompile"), _count("HostRead")
    got = [t.cpu() for t in _ints(DEV)]
    assert _count("UncachedCompile") == c
    assert _count("HostRead") > h
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and torch.equal(g, r)


def test_a_host_read_binds_every_pending_tensor_and_later_graphs_agree():
    a = torch.tensor([4, -9, 11], device=DEV)
    b = a * 3 - 1  # pending, not read
    c = (a > 0).sum()
    assert c.item() == 2
    assert not state(b).is_pending  # a read runs every pending tensor, here on the host
    out = (b.float() * 0.25).cpu()  # a float graph: compiled, over the bound value
    ref = (torch.tensor([4, -9, 11]) * 3 - 1).float() * 0.25
    assert torch.equal(out, ref)


def test_data_movement_over_data_is_assembled_on_the_host_in_any_dtype():
    torch.manual_seed(0)
    xs = [torch.randn(2, 3, dtype=dt) for dt in (torch.float32, torch.float32)]
    ys = [x.to(DEV) for x in xs]
    lazyxla.sync()
    ref = torch.cat(
        [xs[0], xs[1].t().reshape(2, 3)[:, :2].unsqueeze(-1).expand(2, 2, 3)[..., 0]], 1
    )
    seq = torch.cat(
        [ys[0], ys[1].t().reshape(2, 3)[:, :2].unsqueeze(-1).expand(2, 2, 3)[..., 0]], 1
    )
    pending = ys[0] * 2  # a computing tensor stays pending: the read only moved data
    c = _count("UncachedCompile")
    assert torch.equal(seq.cpu(), ref)
    assert _count("UncachedCompile") == c
    assert state(pending).is_pending
    assert torch.equal(pending.cpu(), xs[0] * 2)


def test_views_that_record_strides_read_the_logical_value():
    """Note [Host values are logical]: a reshape of a transposed tensor records
    `_reshape_alias(x, size, strides)` with the lazy tensor's eager strides; a host download is
    contiguous, so running that overload on it scrambled the elements (`_chunk_cat` of a
    transposed int64 tensor was wrong in 88 % of its elements). as_strided compiles."""
    for dt in (torch.int64, torch.uint8, torch.float32):
        x = torch.arange(12).reshape(4, 3).t().to(dt)
        xl = x.to(DEV)
        lazyxla.sync()
        assert torch.equal(xl.reshape(3, 4, 1).cpu(), x.reshape(3, 4, 1))
        assert torch.equal(torch._chunk_cat([xl], 1, 3).cpu(), torch._chunk_cat([x], 1, 3))
        got = (xl.t() + 0).as_strided((2, 2), (1, 3), 1)
        assert torch.equal(got.cpu(), (x.t() + 0).as_strided((2, 2), (1, 3), 1))


def test_float_reads_and_large_integer_graphs_still_compile():
    h = _count("HostRead")
    assert (torch.ones(5, 3, device=DEV) * 2).sum().item() == 30.0
    big = torch.arange(10_000, device=DEV) * 2
    assert big.sum().item() == 2 * sum(range(10_000))
    assert _count("HostRead") == h


def test_host_reads_can_be_turned_off():
    FLAGS.set("host_reads", False)
    try:
        h = _count("HostRead")
        assert (torch.tensor([1, 2, 3], device=DEV) > 1).sum().item() == 2
        assert _count("HostRead") == h
    finally:
        FLAGS.set("host_reads", True)


def test_fills_lift_their_scalar_so_true_and_false_share_a_graph():
    def f(done: bool) -> torch.Tensor:
        x = torch.ones(4, device=DEV) * 1.5
        return (torch.full((4,), done, device=DEV, dtype=torch.bool) & (x > 1)).float() * x

    f(False).cpu()
    c = _count("UncachedCompile")
    assert torch.equal(f(True).cpu(), torch.full((4,), 1.5))
    assert torch.equal(f(False).cpu(), torch.zeros(4))
    assert _count("UncachedCompile") == c


def test_a_division_that_traps_on_the_host_compiles():
    """Note [Division traps on the host]: eager's trunc division of INT64_MIN by -1 (and its
    vectorized lcm of INT32_MIN and INT32_MAX) kills the process with SIGFPE, so a read that
    meets it must compile, and give XLA's value (the quotient wraps to the dividend), as with
    host reads off; run in a child process, which the old code killed. Divisions that cannot
    trap are still answered on the host."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import torch, lazyxla
        from lazyxla.debug import metrics
        dev = lazyxla.device()
        for dtype in (torch.int64, torch.int32):
            lo = torch.iinfo(dtype).min
            a = torch.tensor([lo, 7] * 20, dtype=dtype, device=dev)
            b = torch.tensor([-1, 2] * 20, dtype=dtype, device=dev)
            print(torch.div(a, b, rounding_mode="trunc").cpu()[:2].tolist(),
                  torch.div(a, -1, rounding_mode="trunc").cpu()[:2].tolist(),
                  (a // b).cpu()[:2].tolist(), torch.fmod(a, b).cpu()[:2].tolist())
        lo, hi = torch.iinfo(torch.int32).min, torch.iinfo(torch.int32).max
        a = torch.tensor([lo, lo + 1] * 20, dtype=torch.int32, device=dev)
        b = torch.tensor([hi, lo] * 20, dtype=torch.int32, device=dev)
        on = torch.lcm(a, b).cpu()[:2].tolist(), torch.gcd(a, b).cpu()[:2].tolist()
        from lazyxla._src.config import FLAGS
        FLAGS.set("host_reads", False)
        a, b = a * 1, b * 1  # new pending values, read through XLA
        print(on == (torch.lcm(a, b).cpu()[:2].tolist(), torch.gcd(a, b).cpu()[:2].tolist()))
        FLAGS.set("host_reads", True)
        before = metrics.counter_value("HostRead") or 0
        x = torch.tensor([5, -7] * 20, device=dev)
        print(torch.div(x, -1, rounding_mode="trunc").cpu()[:2].tolist(),
              (metrics.counter_value("HostRead") or 0) - before)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    lo64, lo32 = torch.iinfo(torch.int64).min, torch.iinfo(torch.int32).min
    assert out.stdout.splitlines() == [
        f"[{lo64}, 3] [{lo64}, -7] [{lo64}, 3] [0, 1]",
        f"[{lo32}, 3] [{lo32}, -7] [{lo32}, 3] [0, 1]",
        "True",
        "[-5, 7] 1",
    ]


def test_an_integer_read_beside_a_float_graph_is_answered_alone():
    """transformers' SDPA mask check (`padding_mask.sum() == numel` of a mask cast to bool) right
    after a step's embedding lookup: read on the host alone, the float graph left pending, so the
    step runs as one graph; the cast the read goes through is evaluated on the host too."""
    torch.manual_seed(0)
    table, mask = torch.randn(10, 4), torch.tensor([[1, 1, 0], [1, 1, 1]])
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    e_table, e_mask, e_ids = (t.to(DEV) for t in (table, mask, ids))
    c, h, runs = _count("UncachedCompile"), _count("HostRead"), _count("ExecuteComputation")
    emb = torch.nn.functional.embedding(e_ids, e_table) * 2
    padding = e_mask.to(torch.bool)
    full = padding.sum() == padding.numel()
    assert not bool(full)
    assert bool(padding[1].sum() == 3)
    assert _count("HostRead") == h + 2
    assert (_count("UncachedCompile"), _count("ExecuteComputation")) == (c, runs)
    assert state(emb).is_pending  # left for the step's sync
    lazyxla.sync()
    assert _count("ExecuteComputation") == runs + 1
    assert torch.equal(emb.cpu(), torch.nn.functional.embedding(ids, table) * 2)


def test_a_loop_of_integer_reads_still_cuts_a_growing_graph():
    """A loop that reads an integer each iteration while another tensor grows: the reads are
    answered alone only while the pending graph is small, so the growing graph is cut at a
    bounded size and its cuts repeat one executable (Note [What a value read syncs])."""
    x = torch.zeros(3, device=DEV)
    i = torch.zeros((), dtype=torch.int64, device=DEV)
    lazyxla.sync()
    c, runs = _count("UncachedCompile"), _count("ExecuteComputation")
    n = 0
    while i.item() < 600:  # (float32 holds every sum exactly)
        x = x + 1.0
        i = i + 1
        n += 1
    assert n == 600
    assert torch.equal(x.cpu(), torch.full((3,), 600.0))
    cuts = _count("ExecuteComputation") - runs
    assert 2 <= cuts <= 600 // 100, cuts  # cut every ~256 nodes, not at every read
    assert _count("UncachedCompile") - c <= 3  # the repeated cut, the remainder, a start


def _downloads() -> int:
    data = metrics.metric_data("TransferFromDeviceTime")
    return data.total_samples if data else 0


def test_a_small_device_array_is_read_from_its_host_copy_and_each_read_is_a_fresh_tensor():
    """Note [Host values of device data] (runtime.py): an array's values, once on the host,
    answer later reads without a transfer; large arrays and every value stay exact."""
    bits = torch.tensor([-0.0, float("nan"), 1e-45, -3.5]).view(torch.int32)
    bits[1] = 0x7FC00123  # a NaN with a payload: bits, not values, must survive
    small = bits.view(torch.float32)
    uploaded = small.to(DEV)
    computed = torch.arange(6, device=DEV) * 3 + 1
    lazyxla.sync(wait=True)
    big = torch.randn(8192).to(DEV)
    first = computed.cpu()  # a transfer: an execution's output seen for the first time
    before = _downloads()
    for _ in range(2):
        got = uploaded.cpu()
        assert torch.equal(got.view(torch.int32), small.view(torch.int32))
        got.fill_(7)  # the caller's own copy: the next read is unchanged
        assert torch.equal(computed.cpu(), first) and computed[2].item() == 7
    assert _downloads() == before  # uploads and reads before: no transfer
    assert torch.equal(big.cpu(), big.cpu()) and _downloads() == before + 2  # large: read each time
    bf = torch.tensor([1.0, -0.0, 3.140625], dtype=torch.bfloat16)
    dev_bf = bf.to(DEV)
    assert torch.equal(dev_bf.cpu().view(torch.int16), bf.view(torch.int16))
    assert _downloads() == before + 2


def test_an_arrays_host_copy_goes_with_the_array():
    from lazyxla._src import runtime

    t = torch.arange(5, device=DEV) + 100
    lazyxla.sync(wait=True)
    t.cpu()
    arr = state(t).value[0].data
    assert id(arr) in runtime._host_values
    key = id(arr)
    del t, arr
    import gc

    gc.collect()
    assert key not in runtime._host_values
