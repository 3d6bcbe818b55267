"""`lazyxla.debug.memory_analysis`: XLA's compiled memory statistics of a graph."""

import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla._src import graph

dev = lazyxla.device()


def test_last_executed_graph():
    a = torch.randn(64, 32).to(dev)
    b = torch.randn(32, 16).to(dev)
    lazyxla.sync()
    out = (a @ b).relu() @ b.t()
    lazyxla.sync()
    m = lazyxla.debug.memory_analysis()
    assert isinstance(m, lazyxla.debug.MemoryAnalysis)
    assert m.argument_bytes == (64 * 32 + 32 * 16) * 4
    assert m.output_bytes == out.numel() * 4
    assert m.alias_bytes == 0
    assert m.total_bytes == m.temp_bytes + m.argument_bytes + m.output_bytes


def test_of_pending_tensors_compiles_once_and_runs_nothing():
    a = torch.randn(128, 128).to(dev)
    lazyxla.sync()
    out = torch.softmax(a @ a.t(), -1) @ a
    met.clear_all()
    m = lazyxla.debug.memory_analysis([out])
    assert met.counter_value("UncachedCompile") == 1
    assert not met.counter_value("ExecuteComputation")
    assert m.output_bytes == 128 * 128 * 4
    assert m.temp_bytes >= 128 * 128 * 4  # the (128, 128) scores live in temp memory
    lazyxla.sync()
    assert met.counter_value("UncachedCompile") == 1  # the sync reuses the analysed executable
    assert met.counter_value("CachedCompile") == 1
    torch.testing.assert_close(
        out.cpu(), torch.softmax(a.cpu() @ a.cpu().t(), -1) @ a.cpu(), rtol=1e-5, atol=1e-5
    )


def test_temp_bytes_grow_with_the_graph():
    """Deterministic: the same program at twice the size needs twice the scratch memory."""
    sizes = []
    for n in (256, 512):
        x = torch.randn(n, 64).to(dev)
        lazyxla.sync()
        y = (x.exp() + 1).log().sum(0) + x.tanh().sum(0)
        sizes.append(lazyxla.debug.memory_analysis([y]).argument_bytes)
    assert sizes[1] == 2 * sizes[0]


def test_clear_errors(monkeypatch):
    monkeypatch.setattr(graph, "last_executable", None)
    with pytest.raises(RuntimeError, match="no graph has been executed yet"):
        lazyxla.debug.memory_analysis()
    t = torch.ones(3).to(dev)
    lazyxla.sync()
    with pytest.raises(ValueError, match="already computed"):
        lazyxla.debug.memory_analysis([t])


def test_host_offloading_round_trip_equals_eager():
    """torch_xla's place_to_host / place_to_device (Note [Host offloading]): values and
    gradients pass through; on CPU the placement compiles to nothing (no host bytes)."""
    from lazyxla.experimental.stablehlo_custom_call import place_to_device, place_to_host

    torch.manual_seed(0)
    x = torch.randn(16, 16, requires_grad=True)
    xl = x.detach().to(dev).requires_grad_()
    act = place_to_host(torch.tanh(xl @ xl))
    (place_to_device(act) * xl.sin()).sum().backward()
    lazyxla.sync()
    m = lazyxla.debug.memory_analysis()
    assert m.host_temp_bytes == 0 and m.host_output_bytes == 0
    (torch.tanh(x @ x) * x.sin()).sum().backward()
    torch.testing.assert_close(xl.grad.cpu(), x.grad, rtol=1e-5, atol=1e-5)
    # eager (CPU) tensors: the ops are identities
    torch.testing.assert_close(place_to_device(place_to_host(x)), x)


@pytest.mark.skipif(graph.GraphCache.map_limit is None, reason="no vm.max_map_count off Linux")
def test_compile_cache_keeps_memory_maps_under_the_limit(monkeypatch):
    """Each XLA:CPU executable holds its own memory maps; past 60 % of the process's map limit the
    oldest cached executables are dropped (Note [Memory maps of executables]). With the real limit
    (65530) ~800 cached graphs crashed the next compile in LLVM; here the limit is lowered so some
    tens of small graphs reach it."""
    # the high-water mark 150 maps above what the process holds now (a graph here holds 6-11,
    # as XLA's codegen flags split its object code)
    monkeypatch.setattr(
        graph.CACHE, "map_limit", int((graph._map_count() + 150) / graph._MAPS_HIGH)
    )
    limit = graph.CACHE.map_limit
    evicted = met.counter_value("CompilationCacheEvict") or 0
    dev = lazyxla.device()
    for n in range(1, 36):
        x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
        y = ((x.to(dev) * 2).sin().cumsum(0) + 1).cpu()
        torch.testing.assert_close(y, (x * 2).sin().cumsum(0) + 1)
        assert graph._map_count() <= graph._MAPS_HIGH * limit + 200  # one graph's maps over
    assert (met.counter_value("CompilationCacheEvict") or 0) > evicted
