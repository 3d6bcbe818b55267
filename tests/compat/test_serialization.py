"""torch_xla.utils.serialization (xser): save/load round trips (Note [xser format])."""

import os

import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla.utils import serialization as xser

dev = lazyxla.device()


def test_nested_structure_round_trip(tmp_path):
    a, b = torch.randn(3, 4), torch.randn(5)
    la, lb = a.to(dev), b.to(dev)
    data = {
        "a": la * 2,  # pending: computed by save
        "nested": (lb, [la, 7, "text"]),
        "cpu": torch.arange(3),
        "param": torch.nn.Parameter(a.to(dev)),
    }
    path = str(tmp_path / "ckpt")
    xser.save(data, path)
    assert os.path.isdir(path + ".tensors")
    got = xser.load(path)
    torch.testing.assert_close(got["a"], a * 2)
    assert got["a"].device.type == "cpu"  # torch_xla's load gives CPU tensors
    assert isinstance(got["nested"], list)  # torch_xla's walk turns tuples into lists
    torch.testing.assert_close(got["nested"][0], b)
    torch.testing.assert_close(got["nested"][1][0], a)
    assert got["nested"][1][1:] == [7, "text"]
    torch.testing.assert_close(got["cpu"], torch.arange(3))
    assert isinstance(got["param"], torch.nn.Parameter) and got["param"].requires_grad
    torch.testing.assert_close(got["param"].detach(), a)


def test_pending_tensors_run_in_one_graph(tmp_path):
    x = torch.randn(4, 4).to(dev)
    lazyxla.sync()
    met.clear_all()
    xser.save({"y": x + 1, "z": x * 3, "w": (x @ x).sum()}, str(tmp_path / "p"))
    assert met.counter_value("ExecuteComputation") == 1


def test_state_dict_round_trip_into_a_fresh_model(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    with torch.no_grad():
        ref_out = model(torch.ones(2, 4))
    lazy = model.to(dev)
    path = str(tmp_path / "sd")
    xser.save(lazy.state_dict(), path)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    fresh.load_state_dict(xser.load(path))
    with torch.no_grad():
        torch.testing.assert_close(fresh(torch.ones(2, 4)), ref_out)


def test_not_master_only_writes_and_a_missing_tensor_file_is_named(tmp_path):
    path = str(tmp_path / "x")
    xser.save([torch.ones(2, device=dev)], path, master_only=False)
    os.remove(os.path.join(path + ".tensors", "tensor_0.pt"))
    with pytest.raises(FileNotFoundError, match="tensor_0.pt is missing"):
        xser.load(path)


def test_saving_again_replaces_the_tensor_folder(tmp_path):
    path = str(tmp_path / "again")
    xser.save([torch.ones(2, device=dev), torch.zeros(3, device=dev)], path)
    xser.save([torch.full((2,), 5.0, device=dev)], path)
    assert sorted(os.listdir(path + ".tensors")) == ["tensor_0.pt"]
    torch.testing.assert_close(xser.load(path)[0], torch.full((2,), 5.0))
