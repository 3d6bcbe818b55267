"""torch_xla.debug.model_comparator (mc): save intermediates of an eager and a lazy run of one
model and compare them."""

import os

import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.debug import model_comparator as mc

dev = lazyxla.device()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 5)
        self.fc2 = torch.nn.Linear(5, 3)

    def forward(self, x):
        mc.save(None, x)  # named after this file and line
        h = F.relu(self.fc1(x))
        mc.save("hidden", h)
        out = F.log_softmax(self.fc2(h), dim=1)
        return mc.save("out", out)


def _run(save_dir, device, x, bump=0.0):
    torch.manual_seed(3)
    model = Net().to(device)
    with torch.no_grad():
        model.fc1.bias.add_(bump)
    mc.configure(save_dir)
    model(x.to(device))
    mc.configure(None)


def test_eager_and_lazy_runs_compare_equal(tmp_path):
    x = torch.randn(4, 6)
    d1, d2 = str(tmp_path / "cpu"), str(tmp_path / "lazy")
    os.makedirs(d1)
    os.makedirs(d2)
    _run(d1, "cpu", x)
    _run(d2, dev, x)
    names = sorted(os.listdir(d1))
    assert names == sorted(os.listdir(d2))
    assert "hidden.0" in names and "out.0" in names
    assert any(n.startswith("test_model_comparator.py.l") for n in names)
    assert mc.compare(d1, d2, rtol=1e-4, atol=1e-5) == ""


def test_differences_and_missing_files_are_reported(tmp_path):
    x = torch.randn(4, 6)
    d1, d2 = str(tmp_path / "a"), str(tmp_path / "b")
    os.makedirs(d1)
    os.makedirs(d2)
    _run(d1, "cpu", x)
    _run(d2, dev, x, bump=1.0)  # fc1's bias + 1: every hidden value that is positive changes
    torch.save(torch.ones(1), os.path.join(d2, "extra.0"))
    report = mc.compare(d1, d2)
    assert 'Changes in saved tensor "hidden" with id=0' in report
    assert 'Changes in saved tensor "test_model_comparator.py' not in report  # the input
    assert f"Mismatch: extra.0 not in {d1}" in report
    t = torch.zeros(2, 3)
    u = t.clone()
    u[1, 2] = 5.0
    assert mc.compare_tensors(t, u) == "[1, 2]: 0.0 vs. 5.0\terror=5.0\n"
    assert "different shape" in mc.compare_tensors(t, torch.zeros(3))


def test_save_is_a_no_op_without_a_directory_and_counts_per_step(tmp_path, monkeypatch):
    monkeypatch.delenv("MODELCMP_SAVEDIR", raising=False)
    mc.configure(None)
    t = torch.ones(2, device=dev)
    assert mc.save("x", t) is t
    d = str(tmp_path / "steps")
    os.makedirs(d)
    mc.configure(d)
    for step in (1, 2):
        mc.save("x", t * step, step=step)
        mc.save("x", t * step, step=step)
    mc.configure(None)
    assert sorted(os.listdir(os.path.join(d, "step-2"))) == ["x.0", "x.1"]
    torch.testing.assert_close(torch.load(os.path.join(d, "step-2", "x.1")), torch.full((2,), 2.0))
    assert mc.main([d, d]) == 0
