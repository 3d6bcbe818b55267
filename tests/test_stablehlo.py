"""torch_xla.stablehlo on lazyxla (Note [StableHLO export]): export, save, load, run, and run the
serialized form with JAX alone; every result against eager."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

import lazyxla
from lazyxla.stablehlo import (
    StableHLOExportOptions,
    StableHLOGraphModule,
    VariableType,
    exported_program_to_stablehlo,
    save_as_stablehlo,
    save_torch_model_as_stablehlo,
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x, y):
        h = torch.relu(self.bn(self.lin(x))) * 0.5 + self.offset + torch.tensor([1.0, 2, 3, 4])
        return {"h": h, "rest": (x.sum(1) + y, x.t() @ x)}


@pytest.fixture(scope="module")
def net_and_args():
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        net.bn.running_mean.normal_()
        net.bn.running_var.uniform_(0.5, 2)
    return net, (torch.randn(3, 8), torch.randn(3))


def _assert_tree_close(got, want):
    flat_got, flat_want = (
        torch.utils._pytree.tree_leaves(got),
        torch.utils._pytree.tree_leaves(want),
    )
    assert len(flat_got) == len(flat_want)
    for g, w in zip(flat_got, flat_want):
        torch.testing.assert_close(g.cpu(), w.detach(), rtol=1e-6, atol=1e-6)


def test_round_trip_equals_eager(net_and_args):
    net, args = net_and_args
    shlo = exported_program_to_stablehlo(torch.export.export(net, args))
    out = shlo(*args)
    assert isinstance(out, dict) and isinstance(out["rest"], tuple)
    _assert_tree_close(out, net(*args))
    # new values, same program
    args2 = (torch.randn(3, 8), torch.randn(3))
    _assert_tree_close(shlo(*args2), net(*args2))
    text = shlo.get_stablehlo_text()
    assert "stablehlo.dot_general" in text and "func.func public @main" in text
    assert shlo.get_stablehlo_bytecode().startswith(b"ML\xefR")  # MLIR bytecode


def test_lazy_inputs_give_lazy_outputs(net_and_args):
    net, args = net_and_args
    shlo = exported_program_to_stablehlo(torch.export.export(net, args))
    out = shlo(*[a.to(lazyxla.device()) for a in args])
    assert out["h"].device == lazyxla.device()
    _assert_tree_close(out, net(*args))


@pytest.mark.parametrize("inline", [True, False])
def test_save_load(net_and_args, tmp_path, inline):
    net, args = net_and_args
    options = StableHLOExportOptions(inline_all_constant=inline)
    save_as_stablehlo(torch.export.export(net, args), tmp_path, options)
    assert sorted(os.listdir(tmp_path / "functions")) == [
        "forward.bytecode",
        "forward.jax_exported",
        "forward.meta",
        "forward.mlir",
    ]
    meta = json.loads((tmp_path / "functions" / "forward.meta").read_text())
    kinds = [loc["type_"] for loc in meta["input_locations"]]
    assert kinds.count("input_arg") == 2 and "parameter" in kinds
    # torch.export lifts the tensor literal; the 0.5 is inlined or becomes one more constant
    assert kinds.count("constant") == (1 if inline else 2)
    loaded = StableHLOGraphModule.load(tmp_path)
    _assert_tree_close(loaded(*args), net(*args))


def test_save_torch_model_without_weights(net_and_args, tmp_path):
    net, args = net_and_args
    save_torch_model_as_stablehlo(net, args, tmp_path, StableHLOExportOptions(save_weights=False))
    assert not (tmp_path / "data").exists()
    loaded = StableHLOGraphModule.load(tmp_path)
    with pytest.raises(ValueError, match="needs weight 'lin.weight', which was not saved"):
        loaded(*args)
    loaded._bundle.state_dict.update({k: v.numpy() for k, v in net.state_dict().items()})
    _assert_tree_close(loaded(*args), net(*args))


def test_serialized_form_runs_without_pytorch(net_and_args, tmp_path):
    """The jax.export artifact plus the numpy weights: a process that cannot import torch."""
    net, args = net_and_args
    save_as_stablehlo(torch.export.export(net, args), tmp_path)
    for i, a in enumerate(args):
        with open(tmp_path / f"arg{i}.npy", "wb") as f:
            import numpy as np

            np.save(f, a.numpy())
    code = f"""
        import sys
        sys.modules["torch"] = None  # importing torch now fails
        import json, os
        import numpy as np
        import jax
        jax.config.update("jax_enable_x64", True)  # torch's int64 (BatchNorm's counter)
        d = {str(tmp_path)!r}
        meta = json.load(open(os.path.join(d, "functions", "forward.meta")))
        args = [np.load(os.path.join(d, f"arg{{i}}.npy")) for i in range(2)]
        feed = []
        for loc in meta["input_locations"]:
            if loc["type_"] == "parameter":
                feed.append(np.load(os.path.join(d, "data", loc["name"])))
            elif loc["type_"] == "constant":
                feed.append(np.load(os.path.join(d, "constants", str(loc["position"]))))
            else:
                feed.append(args[loc["position"]])
        blob = open(os.path.join(d, "functions", "forward.jax_exported"), "rb").read()
        outs = jax.export.deserialize(bytearray(blob)).call(*feed)
        np.save(os.path.join(d, "out.npy"), np.asarray(outs[0]))
    """
    env = {**os.environ, "CPU_NUM_DEVICES": "1"}
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stderr[-2000:]
    import numpy as np

    got = torch.from_numpy(np.load(tmp_path / "out.npy"))
    torch.testing.assert_close(got, net(*args)["h"].detach(), rtol=1e-6, atol=1e-6)


def test_variable_types_and_dynamic_shapes_error():
    assert VariableType("parameter") is VariableType.PARAMETER

    class Double(nn.Module):
        def forward(self, x):
            return x * 2

    x = torch.randn(4, 3)
    ep = torch.export.export(Double(), (x,), dynamic_shapes=({0: torch.export.Dim("b")},))
    with pytest.raises(NotImplementedError, match="dynamic shape .* export without dynamic_shapes"):
        exported_program_to_stablehlo(ep)


# --- non-tensor inputs (Note [Non-tensor inputs]) ---------------------------------------------


class _Op(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, *args, **kwargs):
        return self.op(*args, **kwargs)


_aten = torch.ops.aten
# (op, args): each has a non-tensor input torch.export bakes into the graph
_NON_TENSOR_CASES = {
    "int": (_aten._softmax.default, (torch.randn(4, 5), 1, False)),
    "float": (_aten.leaky_relu.default, (torch.randn(4, 5), 0.3)),
    "list_of_ints": (_aten._adaptive_avg_pool2d.default, (torch.randn(1, 3, 8, 8), [2, 4])),
    "none": (_aten.mean.dim, (torch.randn(3, 4), None)),
    "bool": (_aten.sort.default, (torch.randn(3, 6), 1, True)),
    "scalar_first": (_aten.pow.Scalar, (2.5, torch.randn(3, 4))),
    "several": (_aten.masked_fill.Scalar, (torch.randn(3, 4), torch.rand(3, 4) > 0.5, -2.0)),
    "dims_list": (_aten.sum.dim_IntList, (torch.randn(3, 4, 5), [0, 2], True)),
}


@pytest.mark.parametrize("case", sorted(_NON_TENSOR_CASES))
def test_non_tensor_inputs_are_baked_in(case):
    op, args = _NON_TENSOR_CASES[case]
    shlo = exported_program_to_stablehlo(torch.export.export(_Op(op), args))
    _assert_tree_close(shlo(*args), op(*args))
    meta = shlo._bundle.stablehlo_funcs[0].meta
    flat = torch.utils._pytree.tree_leaves(args)
    tensors = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
    # the program takes only the tensors, at their position among all the caller's inputs
    assert [loc.type_ for loc in meta.input_locations] == [VariableType.INPUT_ARG] * len(tensors)
    assert [loc.position for loc in meta.input_locations] == tensors
    # torch_xla's record of the others: signature [] and the Python type's name
    unused = {loc.position: sig for loc, sig in meta.unused_inputs}
    assert sorted(unused) == [i for i in range(len(flat)) if i not in tensors]
    for i, sig in unused.items():
        assert (sig.shape, sig.dtype) == ([], type(flat[i]).__name__)


def test_non_tensor_inputs_new_tensor_values_same_program():
    op, args = _NON_TENSOR_CASES["list_of_ints"]
    shlo = exported_program_to_stablehlo(torch.export.export(_Op(op), args))
    x2 = torch.randn(1, 3, 8, 8)
    _assert_tree_close(shlo(x2, [2, 4]), op(x2, [2, 4]))


def test_a_different_non_tensor_value_is_refused():
    op, args = _NON_TENSOR_CASES["int"]
    shlo = exported_program_to_stablehlo(torch.export.export(_Op(op), args))
    with pytest.raises(ValueError, match=r"input 1 .* exported as the constant 1 .* gives 0"):
        shlo(args[0], 0, False)
    op, args = _NON_TENSOR_CASES["none"]
    shlo = exported_program_to_stablehlo(torch.export.export(_Op(op), args))
    with pytest.raises(ValueError, match="exported as the constant None"):
        shlo(args[0], 1)


@pytest.mark.parametrize("case", ["int", "list_of_ints", "none", "bool", "float"])
def test_non_tensor_inputs_save_load_and_jax_deserialize(case, tmp_path):
    import jax
    import numpy as np

    op, args = _NON_TENSOR_CASES[case]
    save_as_stablehlo(torch.export.export(_Op(op), args), tmp_path)
    loaded = StableHLOGraphModule.load(tmp_path)
    want = op(*args)
    _assert_tree_close(loaded(*args), want)
    meta = loaded._bundle.stablehlo_funcs[0].meta
    assert all(sig.shape == [] for _, sig in meta.unused_inputs)
    leaves, spec = torch.utils._pytree.tree_flatten(args)
    bad = torch.utils._pytree.tree_unflatten([*leaves[:-1], "something else"], spec)
    with pytest.raises(ValueError, match="baked into the program"):
        loaded(*bad)
    # the jax.export artifact takes exactly the tensors named by input_locations
    flat = torch.utils._pytree.tree_leaves(args)
    exp = jax.export.deserialize(
        bytearray((tmp_path / "functions/forward.jax_exported").read_bytes())
    )
    outs = exp.call(*[flat[loc.position].numpy() for loc in meta.input_locations])
    for got, w in zip(outs, torch.utils._pytree.tree_leaves(want)):
        torch.testing.assert_close(torch.from_numpy(np.array(got)), w)


def test_keyword_inputs_and_unused_tensor_inputs():
    class M(nn.Module):
        def forward(self, x, unused, *, scale, bias=None):
            return x * scale + (0 if bias is None else bias)

    x, u, b = torch.randn(3), torch.randn(2), torch.randn(3)
    ep = torch.export.export(M(), (x, u), {"scale": 2.0, "bias": b})
    shlo = exported_program_to_stablehlo(ep)
    want = M()(x, u, scale=2.0, bias=b)
    _assert_tree_close(shlo(x, u, scale=2.0, bias=b), want)
    _assert_tree_close(shlo(x, u, bias=b, scale=2.0), want)  # keywords in any order
    meta = shlo._bundle.stablehlo_funcs[0].meta
    # flattened user inputs: x, unused, scale, bias; the program reads x and bias
    assert [loc.position for loc in meta.input_locations] == [0, 3]
    assert [(loc.position, sig.shape, sig.dtype) for loc, sig in meta.unused_inputs] == [
        (1, [2], "float32"),
        (2, [], "float"),
    ]
    with pytest.raises(TypeError, match="structure the program was exported with"):
        shlo(x, u, scale=2.0)


def test_tensors_created_in_forward_and_float_operands():
    """torch_xla's export interpreter: factories in the graph (device=cpu) build on the lazy
    device, and a float where the schema takes a Tensor (`sub.Tensor(1.0, x)` after decomposing
    `1.0 - x`) is a tensor of the default dtype."""

    class M(nn.Module):
        def forward(self, x):
            return (1.0 - x) * torch.arange(x.shape[1], dtype=x.dtype) + torch.ones(x.shape[1])

    x = torch.randn(2, 3)
    ep = torch.export.export(M(), (x,)).run_decompositions()
    assert any(
        n.target is _aten.sub.Tensor and isinstance(n.args[0], float) for n in ep.graph.nodes
    )
    shlo = exported_program_to_stablehlo(ep)
    _assert_tree_close(shlo(x), M()(x))


# Lowering bugs pytorch/xla's test_core_aten_ops.py found through export: each op through lazyxla
# and through the exported program, against eager.
_OP_CASES = {
    "native_dropout_p1_train_none": (_aten.native_dropout.default, (torch.randn(6, 6), 1.0, None)),
    "native_dropout_p0": (_aten.native_dropout.default, (torch.randn(6, 6), 0.0, True)),
    "native_dropout_eval": (_aten.native_dropout.default, (torch.randn(6, 6), 0.5, False)),
    "resize_same_shape": (_aten.resize_.default, (torch.randn(2, 5, 10), [2, 5, 10])),
}


@pytest.mark.parametrize("case", sorted(_OP_CASES))
def test_ops_found_by_upstream_export_tests(case):
    import lazyxla.debug.metrics as met

    op, args = _OP_CASES[case]
    want = op(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    met.clear_all()
    dev = lazyxla.device()
    got = op(*[a.to(dev) if isinstance(a, torch.Tensor) else a for a in args])
    _assert_tree_close(got, want)
    assert not [k for k in met.counter_names() if k.startswith("aten::")]  # no CPU fallback
    shlo = exported_program_to_stablehlo(torch.export.export(_Op(op), args))
    _assert_tree_close(shlo(*args), want)


@pytest.mark.parametrize("new", [(3,), (4, 3), (0,), (2, 3)])
def test_resize_to_another_shape_keeps_leading_elements(new):
    x = torch.randn(2, 3)
    y = x.to(lazyxla.device())
    assert y.resize_(new) is y and y.shape == new
    want = x.clone().resize_(new)
    n = min(x.numel(), want.numel())
    torch.testing.assert_close(y.cpu().reshape(-1)[:n], want.reshape(-1)[:n])
    with pytest.raises(RuntimeError, match="negative dimension"):
        y.resize_((-1, 2))


def test_top_level_names_as_torch_xla():
    """torch_xla 2.9 has `torch_xla.save_as_stablehlo` and `save_torch_model_as_stablehlo`."""
    import lazyxla
    import lazyxla.stablehlo as sh

    assert lazyxla.save_as_stablehlo is sh.save_as_stablehlo
    assert lazyxla.save_torch_model_as_stablehlo is sh.save_torch_model_as_stablehlo
