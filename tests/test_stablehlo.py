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
