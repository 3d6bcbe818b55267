"""StableHLO composites from pattern markers (Note [Composites]), MLIR debug info (Note [MLIR debug
info]), custom ops kept as custom calls in exports, and the unbounded-dynamism FX passes (Note
[Unbounded dynamism]); values against eager."""

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
import lazyxla.core.xla_model as xm
import lazyxla.debug.metrics as met
from lazyxla.experimental import unbounded_dynamism_export as ude
from lazyxla.experimental.mark_pattern_utils import StableHLOCompositeBuilder
from lazyxla.experimental.xla_mlir_debuginfo import write_mlir_debuginfo
from lazyxla.stablehlo import (
    StableHLOExportOptions,
    StableHLOGraphModule,
    exported_program_to_stablehlo,
)

dev = lazyxla.device()
mark = torch.ops.xla.mark_tensor


def _lazy(*ts):
    return [t.to(dev) for t in ts]


# --- composites -----------------------------------------------------------------------------------


def _basic(x):
    x = x + 1
    x = mark(x, "test.p", 0, "0", True)
    x = x * 2 + 3
    x = mark(x, "test.p", 0, "0", False)
    return x - 1


def test_marked_pattern_is_one_composite_in_the_lazy_graph():
    x = torch.randn(5)
    (lx,) = _lazy(x)
    out = _basic(lx)
    text = xm.get_stablehlo([out])
    assert text.count('stablehlo.composite "test.p"') == 1
    assert text.count("{decomposition = @test.p.impl}") == 1
    # the pattern's ops live in the decomposition, the rest in main
    impl = text[text.index("func.func private @test.p.impl") :]
    assert "stablehlo.multiply" in impl and "stablehlo.subtract" not in impl
    torch.testing.assert_close(out.cpu(), _basic(x))


def test_composite_builder_export_attributes_and_numbering(tmp_path):
    class M(nn.Module):
        def forward(self, x, y):
            outs = []
            for t, attr in ((x, {"scale": 0.25}), (y, {"scale": 2})):
                b = StableHLOCompositeBuilder("test.sdpa", attr)
                q, k, v = b.mark_inputs(*t.split(4, dim=-2))
                outs.append(b.mark_outputs(F.scaled_dot_product_attention(q, k, v, scale=0.25)))
            return tuple(outs)

    args = (torch.randn(2, 2, 12, 8), torch.randn(2, 2, 12, 8))
    shlo = exported_program_to_stablehlo(torch.export.export(M(), args))
    text = shlo.get_stablehlo_text()
    assert text.count('stablehlo.composite "test.sdpa"') == 2
    assert (
        "{composite_attributes = {scale = 2.500000e-01 : f32}, decomposition = @test.sdpa.impl}"
        in text
    )
    assert "{composite_attributes = {scale = 2 : i64}, decomposition = @test.sdpa.impl_0}" in text
    for got, want in zip(shlo(*args), M()(*args)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    shlo.save(tmp_path)  # the composites survive serialization and run after loading
    loaded = StableHLOGraphModule.load(tmp_path)
    assert loaded.get_stablehlo_text().count('stablehlo.composite "test.sdpa"') == 2
    for got, want in zip(loaded(*args), M()(*args)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_composite_attribute_types():
    attrs = {"i": 1, "f": 2.3, "b": True, "s": "hi", "il": [1, 2], "fl": [1.0, 1.5], "bl": [True]}

    def f(x, y):
        b = StableHLOCompositeBuilder("test.add", attrs)
        x, y = b.mark_inputs(x, y)
        return b.mark_outputs(x + y)

    text = xm.get_stablehlo([f(*_lazy(torch.randn(3), torch.randn(3)))])
    for piece in (
        "i = 1 : i64",
        "f = 2.300000e+00 : f32",
        "b = true",
        's = "hi"',
        "il = dense<[1, 2]> : tensor<2xi64>",
        "fl = dense<[1.000000e+00, 1.500000e+00]> : tensor<2xf32>",
        "bl = dense<true> : tensor<1xi1>",
    ):
        assert piece in text, piece


def test_multiple_outputs_and_outside_values_keep_input_order():
    """Outputs marked one by one are one composite; values the pattern reads from outside (a
    tensor, runtime scalars) become operands; the graph's data inputs keep their order."""

    def f(a, w, x, y):
        h = a * 3.5
        x, y = mark(x, "test.p", 0, "0", True), mark(y, "test.p", 1, "0", True)
        o1 = mark(x + y * w, "test.p", 0, "0", False)
        z = o1 * 2  # a consumer of the first output before the second is marked
        o2 = mark(x * y - 1.5, "test.p", 1, "0", False)
        return z + o2 + h

    args = [torch.randn(4, 4) for _ in range(4)]
    out = f(*_lazy(*args))
    assert xm.get_stablehlo([out]).count('stablehlo.composite "test.p"') == 1
    torch.testing.assert_close(out.cpu(), f(*args))
    met.clear_all()
    args2 = [torch.randn(4, 4) for _ in range(4)]
    torch.testing.assert_close(f(*_lazy(*args2)).cpu(), f(*args2))
    assert met.counter_value("UncachedCompile") in (None, 0)  # same program, new values


def test_kv_cache_pattern_with_in_place_updates_exports():
    class KV(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("k", torch.zeros(1, 16, 2, 4), persistent=False)

        def forward(self, pos, val):
            b = StableHLOCompositeBuilder("test.update_kv_cache")
            k, pos, val = b.mark_inputs(self.k, pos, val)
            return b.mark_outputs(k.index_copy_(1, pos, val))

    args = (torch.arange(3), torch.randn(1, 3, 2, 4))
    shlo = exported_program_to_stablehlo(torch.export.export(KV(), args))
    assert shlo.get_stablehlo_text().count('stablehlo.composite "test.update_kv_cache"') == 1
    torch.testing.assert_close(shlo(*args), KV()(*args))


def test_gradients_through_a_marked_pattern():
    def f(x, w):
        b = StableHLOCompositeBuilder("test.mlp")
        x, w = b.mark_inputs(x, w)
        return b.mark_outputs(torch.tanh(x @ w)).sum()

    x, w = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    lx, lw = (t.to(dev).requires_grad_() for t in (x, w))
    ex, ew = (t.clone().requires_grad_() for t in (x, w))
    f(lx, lw).backward()
    f(ex, ew).backward()
    torch.testing.assert_close(lx.grad.cpu(), ex.grad)
    torch.testing.assert_close(lw.grad.cpu(), ew.grad)


def test_a_pattern_output_feeding_its_inputs_is_a_clear_error():
    def f(x, y):
        x = mark(x, "test.p", 0, "0", True)
        o1 = mark(x + 1, "test.p", 0, "0", False)
        y = mark(y + o1, "test.p", 1, "0", True)  # an input made from an output
        return mark(x * y, "test.p", 1, "0", False)

    out = f(*_lazy(torch.randn(3), torch.randn(3)))
    with pytest.raises(ValueError, match="output that feeds its own inputs"):
        xm.get_stablehlo([out])


# --- debug info -----------------------------------------------------------------------------------


def test_write_mlir_debuginfo_names_the_producing_op():
    class M(nn.Module):
        def forward(self, x, y):
            x = write_mlir_debuginfo(x + y, "MY_ADD")
            return torch.ops.xla.write_mlir_debuginfo(x - y, "MY_SUB")

    args = (torch.rand(10), torch.rand(10))
    shlo = exported_program_to_stablehlo(torch.export.export(M(), args))
    text = shlo.get_stablehlo_text()
    assert re.search(r'stablehlo.add.+"MY_ADD"', text)
    assert re.search(r'stablehlo.subtract.+"MY_SUB"', text)
    torch.testing.assert_close(shlo(*args), M()(*args))
    # on lazy tensors it is an identity for values (and the cache key)
    lx, ly = _lazy(*args)
    torch.testing.assert_close(write_mlir_debuginfo(lx + ly, "A").cpu(), args[0] + args[1])


def test_export_node_metadata():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    ep = torch.export.export(model, (torch.rand(2, 4),))
    text = exported_program_to_stablehlo(
        ep, StableHLOExportOptions(export_node_metadata=True)
    ).get_stablehlo_text()
    assert "stack_trace" in text and "nn_module_stack" in text


# --- custom ops as custom calls -------------------------------------------------------------------

_lib = torch.library.Library("lazyxla_test_cc", "DEF")
_lib.define("op(Tensor x) -> Tensor")
_lib.impl("op", lambda x: torch.empty_like(x), "Meta")
_lib.define("rowsum(Tensor x) -> Tensor")
_lib.impl("rowsum", lambda x: x.new_empty(x.shape[1:]), "Meta")


@torch.library.impl(_lib, "rowsum", "XLA")
def _rowsum_xla(x):
    return x.sum(0)  # a torch_xla-only kernel: the export runs it


def test_custom_ops_allowed_in_graph_become_custom_calls():
    class M(nn.Module):
        def forward(self, x):
            return torch.cos(torch.ops.lazyxla_test_cc.op(torch.sin(x)))

    options = StableHLOExportOptions()
    options.custom_ops_allowed_in_graph.add("lazyxla_test_cc")
    ep = torch.export.export(M(), (torch.randn(3, 3),))
    text = exported_program_to_stablehlo(ep, options).get_stablehlo_text()
    assert re.search(r"stablehlo.custom_call @lazyxla_test_cc\.op\.default", text)


def test_an_xla_key_kernel_is_what_the_export_runs():
    class M(nn.Module):
        def forward(self, x):
            return torch.ops.lazyxla_test_cc.rowsum(x * 2)

    x = torch.randn(3, 4)
    shlo = exported_program_to_stablehlo(torch.export.export(M(), (x,)))
    torch.testing.assert_close(shlo(x), (x * 2).sum(0))


# --- unbounded dynamism ---------------------------------------------------------------------------

Dim = torch.export.Dim


def _check_pass(module, args, dynamic_shapes, rewrite, present, absent=()):
    ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    want = ep.module()(*args)
    rewrite(ep.graph_module)
    ep.graph_module.recompile()
    for name in present:
        assert name in ep.graph_module.code, name
    for name in absent:
        assert name not in ep.graph_module.code, name
    torch.testing.assert_close(ep.module()(*args), want)
    return ep


def test_dynamic_view_and_expand_passes():
    class View(nn.Module):
        def forward(self, x):
            return (x * 2).view(x.shape[0] * x.shape[1], -1)

    x = torch.rand(6, 3, 4)
    ep = _check_pass(
        View(),
        (x,),
        ({0: Dim("b")},),
        ude.replace_dynamic_view_with_xla_op,
        ["xla.dynamic_view"],
        ["aten.view"],
    )
    # the rewritten graph runs on lazyxla too (the ops read the concrete size)
    torch.testing.assert_close(ep.graph_module(x.to(dev))[0].cpu(), (x * 2).view(18, 4))

    class Expand(nn.Module):
        def forward(self, x, image):
            return x.expand([image.shape[0], -1, -1])

    _check_pass(
        Expand(),
        (torch.rand(1, 1, 5), torch.rand(3, 4)),
        (None, {0: Dim("b")}),
        ude.replace_dynamic_expand_with_xla_op,
        ["xla.dynamic_expand"],
    )


def test_select_split_unsqueeze_and_norm_passes():
    m = ude.wrap_func_as_nn_module(torch.ops.aten.select.int)
    args = (torch.rand(5, 7, 3), 1, -1)
    _check_pass(
        m, args, (({0: Dim("b")}, None, None),), ude.decompose_dynamic_shape_select, ["aten.view"]
    )

    class Split(nn.Module):
        def forward(self, x):
            r = torch.ops.aten.split_with_sizes.default(x, [1, 2, 3], -1)
            return r[0], r[2]

    _check_pass(
        Split(), (torch.rand(3, 4, 6),), ({0: Dim("b")},), ude.decompose_split_with_sizes, []
    )

    class Unsqueeze(nn.Module):
        def forward(self, x):
            return torch.ops.aten.unsqueeze.default(x, -1)

    _check_pass(
        Unsqueeze(),
        (torch.rand(2, 5),),
        ({1: Dim("n")},),
        ude.dynamic_unsqueeze_to_view,
        ["aten.view"],
        ["aten.unsqueeze"],
    )
    x, w, b = torch.rand(4, 6), torch.rand(6), torch.rand(6)
    torch.testing.assert_close(
        ude.native_layer_norm_impl(x, [6], w, b, 1e-5), F.layer_norm(x, [6], w, b, 1e-5)
    )


def test_exporting_symbolic_dimensions_is_refused_with_the_reason():
    ep = torch.export.export(
        ude.wrap_func_as_nn_module(torch.sin),
        (torch.rand(4, 3),),
        dynamic_shapes=(({0: Dim("b")},),),
    )
    assert ude.exported_program_has_symbolic_input_shape(ep)
    with pytest.raises(NotImplementedError, match=r"dynamic shape .*Unbounded dynamism"):
        exported_program_to_stablehlo(ep)


def test_a_builder_made_each_step_compiles_once():
    def step(x):
        b = StableHLOCompositeBuilder("test.p")  # a new pattern id (uuid) every call
        return b.mark_outputs(b.mark_inputs(x) * 2)

    met.clear_all()
    for _ in range(3):
        x = torch.randn(4)
        out = step(x.to(dev))
        xm.mark_step()
        torch.testing.assert_close(out.cpu(), x * 2)
    assert met.counter_value("UncachedCompile") == 1


def test_an_output_feeding_another_output_and_an_inner_value_used_outside():
    def f(x, y):
        x, y = mark(x, "test.p", 0, "0", True), mark(y, "test.p", 1, "0", True)
        inner = x * y
        o1 = mark(inner + 1, "test.p", 0, "0", False)
        o2 = mark(o1 * 3, "test.p", 1, "0", False)  # made from the first output
        return o1 + o2 + inner  # `inner` is also used outside the pattern

    args = [torch.randn(3, 3), torch.randn(3, 3)]
    out = f(*_lazy(*args))
    assert xm.get_stablehlo([out]).count('stablehlo.composite "test.p"') == 1
    torch.testing.assert_close(out.cpu(), f(*args))
