"""pytorch/xla's tests and examples as the conformance run sees them (upstream.py, the entry
point): where results go, which files are excluded or run as programs, the flags and environment
each gets (read from pytorch/xla's `test/run_tests.sh`), and finding them in a checkout."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
import tempfile
from collections import defaultdict
from collections.abc import Sequence

from lazyxla.tools import upstream_plugin

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_DOC = os.path.join(REPO, "docs", "torch_xla_conformance.md")
DEFAULT_RESULTS = os.path.join(tempfile.gettempdir(), "lazyxla-upstream")
RESULTS_ENV = upstream_plugin.RESULTS_ENV
PLUGIN = "lazyxla_upstream_plugin"  # the plugin's module name in the support directory
TORCHVISION_ENV = "LAZYXLA_UPSTREAM_TORCHVISION"
MAX_JOBS = 2

# Test files (globs relative to the checkout) that need hardware other than a CPU, and why.
EXCLUDED = {
    "test/tpu/*": "TPU CI only",
    "test/neuron/*": "Neuron only",
    "test/cpp/*": "C++ tests",
    "test/benchmarks/*": "benchmark-runner unit tests, not torch_xla's",
    "*tpu*": "TPU only",
    "*pallas*": "Pallas TPU kernels",
    "*splash_attention*": "Pallas TPU kernel",
    "*paged_attention*": "Pallas TPU kernel",
    "test/test_gmm.py": "grouped matmul Pallas TPU kernel",
    "test/test_autocast_xla.py": "CUDA/TPU autocast policy",
    "test/test_train_mp_mnist_amp.py": "exits unless the device is a TPU (its AMP needs bf16)",
}

# Examples and the flags that shrink them to a CPU-sized run (examples not listed take none).
EXAMPLE_ARGS = {
    "examples/train_decoder_only_base.py": [
        "--num-steps=12",  # losses print every 10 steps, each at the next step: two of them
        "--hidden-size=256",
        "--num-layers=2",
        "--intermediate-size=1024",
    ],
}
# Examples that take no size flags are shrunk by the generated sitecustomize as they import their
# shared module (no file of the checkout changes):
# - decoder-only ones to the base example's flags above (it patches the defaults of
#   `decoder_only_model.DecoderOnlyConfig` and `TrainDecoderOnlyBase(num_steps=)`); at torch_xla's
#   default sizes (intermediate size 32768) each needs more than the memory limit;
# - ResNet ones (`TrainResNetBase` sets a ResNet-50 on 128 images of 224x224 for 300 steps in its
#   `__init__`): those attributes become fixed values its `__init__` cannot overwrite (an example
#   that scales `batch_size` by the device count keeps the fixed value). Losses print every 10
#   steps: 12 steps give two.
SHRINK = {"config": {"hidden_size": 256, "intermediate_size": 1024}, "num_steps": 12}
SHRINK_RESNET = {"resnet": {"img_dim": 32, "batch_size": 8, "num_steps": 12}}
SHRINK_ENV = "LAZYXLA_UPSTREAM_SHRINK"
EXAMPLE_SHRINK = {
    "examples/eager/*": SHRINK,
    "examples/flash_attention/*": SHRINK,
    "examples/fsdp/train_decoder_only_fsdp_v2.py": SHRINK,
    "examples/*resnet*": SHRINK_RESNET,
}
# Test files that are programs, not test cases (`if __name__ == "__main__"` trains a model; pytest
# would collect nothing): each runs as an example does, with the flags that shrink it (torch_xla's
# CI runs them as `python FILE --fake_data`; the flags are the files' own, from `args_parse.py`).
# MNIST: 60000 / batch size steps. ImageNet: ResNet-18 at 224x224 for `--num_steps`.
_MNIST = ["--fake_data", "--num_epochs=1", "--batch_size=1000", "--log_steps=20"]
_IMAGENET = ["--fake_data", "--model=resnet18", "--num_epochs=1", "--batch_size=4"]
_IMAGENET += ["--test_set_batch_size=4", "--num_steps=11", "--log_steps=5"]
TEST_PROGRAMS = {
    "test/test_train_mp_mnist.py": _MNIST,
    "test/test_train_mp_mnist_fsdp_with_ckpt.py": _MNIST,
    "test/test_train_mp_mnist_zero1.py": _MNIST,
    # Its batch shrinks to `step` rows each step (a new graph per step): 30 steps.
    "test/test_profile_mp_mnist.py": [*_MNIST[:2], "--batch_size=20000", "--log_steps=10"],
    "test/test_train_mp_imagenet.py": _IMAGENET,
    "test/test_train_mp_imagenet_amp.py": _IMAGENET,
    # No flag bounds its steps (it ignores --num_steps; 50000 / batch size with the small fake
    # sample): it runs until the timeout, its loss printed every 5 steps.
    "test/test_train_mp_imagenet_fsdp.py": [*_IMAGENET, "--use_small_fake_sample"],
    "test/spmd/test_train_spmd_imagenet.py": [*_IMAGENET[:3], "--batch_size=8", *_IMAGENET[4:]],
    # A benchmark script (argparse at import): an FSDP-sharded MLP over a 4-device hybrid mesh
    # (its default `--ici_fsdp_parallelism=4`), timed for 5 steps; it prints no loss. Its defaults
    # (131072 rows per device, width 2048) need tens of GB.
    "test/spmd/test_sharding_strategies.py": [
        "--batch_size=16",
        "--embedding_dimension=64",
        "--num_layers=2",
    ],
}
# Examples that start one process per device, each holding a ResNet-50 and its compiled step
# (~1.5 GB): with 4 devices they pass the memory limit, so they run with 2.
EXAMPLE_ENV = {
    "examples/data_parallel/train_resnet_ddp.py": {"CPU_NUM_DEVICES": "2"},
    "examples/data_parallel/train_resnet_xla_ddp.py": {"CPU_NUM_DEVICES": "2"},
    "examples/fsdp/train_resnet_fsdp_auto_wrap.py": {"CPU_NUM_DEVICES": "2"},
}
# Examples that do not run to the end for a reason outside lazyxla, said beside their row.
EXAMPLE_NOTES = {
    "examples/data_parallel/train_resnet_ddp.py": (
        "torch_xla 2.9 cannot run it on the CPU either (run with torch_xla 2.9.0 on this machine, "
        "shrunk the same way): with 2 devices XLA:CPU's all-gather rendezvous times out and "
        "aborts the processes; with 1 it raises the error lazyxla raises, 'Unexpected execution "
        "happens inside the compiled function': DDP's first-step bucket rebuild "
        "(`Reducer._rebuild_buckets`) reads bucket sizes back to the host inside "
        "`torch_xla.compile(full_graph=True)`."
    ),
    "test/test_train_mp_imagenet_fsdp.py": (
        "no flag bounds its steps (it ignores `--num_steps`; 6250 steps per process with the "
        "small fake sample): it trains until the timeout, its loss falling."
    ),
}
# Directories an example expects to exist (it asserts so before it starts).
EXAMPLE_DIRS = {"examples/debug/train_resnet_profile.py": ["/tmp/profile"]}
EXAMPLE_SKIP = {
    "examples/decoder_only_model.py": "a model definition, not a program",
}

# run_tests.sh: its exported defaults, and what each of its wrapper functions adds.
BASE_ENV = {
    "PYTORCH_TEST_WITH_SLOW": "1",
    "XLA_DUMP_FATAL_STACK": "1",
    "CPU_NUM_DEVICES": "4",
}
_WRAPPERS: dict[str, dict[str, str]] = {
    "run_coverage": {},
    "run_test": {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1"},
    "run_test_multi_devices": {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"},
    "run_test_without_functionalization": {"XLA_DISABLE_FUNCTIONALIZATION": "1"},
    "run_test_multi_devices_without_func": {"XLA_DISABLE_FUNCTIONALIZATION": "1"},
    "run_use_bf16": {"XLA_USE_BF16": "1"},
    "run_downcast_bf16": {"XLA_DOWNCAST_BF16": "1"},
    "run_dynamic": {"XLA_EXPERIMENTAL": "nonzero:masked_select:masked_scatter:nms"},
    "run_eager_debug": {"XLA_USE_EAGER_DEBUG_MODE": "1"},
    "run_pt_xla_debug": {"PT_XLA_DEBUG": "1", "PT_XLA_DEBUG_FILE": "/tmp/pt_xla_debug.txt"},
    "run_pt_xla_debug_level1": {
        "PT_XLA_DEBUG_LEVEL": "1",
        "PT_XLA_DEBUG_FILE": "/tmp/pt_xla_debug.txt",
    },
    "run_pt_xla_debug_level2": {
        "PT_XLA_DEBUG_LEVEL": "2",
        "PT_XLA_DEBUG_FILE": "/tmp/pt_xla_debug.txt",
    },
    "run_xla_ir_debug": {"XLA_IR_DEBUG": "1"},
    "run_xla_hlo_debug": {"XLA_HLO_DEBUG": "1"},
    "run_xla_ir_hlo_debug": {"XLA_IR_DEBUG": "1", "XLA_HLO_DEBUG": "1"},
    "run_save_tensor_ir": {"XLA_SAVE_TENSORS_FILE": "{tmp}/graphs", "XLA_SAVE_TENSORS_FMT": "text"},
    "run_save_tensor_hlo": {"XLA_SAVE_TENSORS_FILE": "{tmp}/graphs", "XLA_SAVE_TENSORS_FMT": "hlo"},
}
# Wrappers that end in `run_test` (their env is added on top of run_test's).
_ON_RUN_TEST = {
    "run_test_without_functionalization",
    "run_use_bf16",
    "run_downcast_bf16",
    "run_dynamic",
    "run_eager_debug",
    "run_pt_xla_debug",
    "run_pt_xla_debug_level1",
    "run_pt_xla_debug_level2",
}
_PLAIN = ("run_test", "run_test_multi_devices", "run_coverage")
_INVOCATION = re.compile(
    r"^\s*((?:[A-Z_][A-Z0-9_]*=\S+\s+)*)((?:run_\w+\s+)+)\"?\$_TEST_DIR/([^\"\s]+\.py)\"?(.*)$"
)


@dataclasses.dataclass
class Item:
    """One program to run: a test file (under pytest) or an example (as a script)."""

    kind: str  # "test" | "example"
    path: str  # relative to the checkout
    env: dict[str, str]
    args: list[str] = dataclasses.field(default_factory=list)
    how: str = ""  # the run_tests.sh line it came from, for the report


def _env_of(wrappers: Sequence[str], prefix: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for name in reversed(wrappers):  # the innermost wrapper's settings first
        if name in _ON_RUN_TEST:
            env.update(_WRAPPERS["run_test"])
        if name == "run_test_multi_devices_without_func":
            env.update(_WRAPPERS["run_test_multi_devices"])
        env.update(_WRAPPERS.get(name, {}))
    for assign in prefix.split():
        key, _, value = assign.partition("=")
        env[key] = value.strip("\"'")
    return env


def run_tests_env(ptxla: str) -> dict[str, tuple[dict[str, str], str]]:
    """Per test file (relative to the checkout): the env run_tests.sh runs it with, and the line.

    A file run several ways gets its plain run (`run_test`, `run_test_multi_devices`) if it has one,
    else its first.
    """
    script = os.path.join(ptxla, "test", "run_tests.sh")
    found: dict[str, list[tuple[list[str], str, str]]] = defaultdict(list)
    with open(script) as f:
        for line in f:
            m = _INVOCATION.match(line)
            if m is None:
                continue
            prefix, wrappers, rel = m.group(1), m.group(2).split(), m.group(3)
            found["test/" + rel].append((wrappers, prefix, line.strip()))
    out = {}
    for rel, runs in found.items():
        plain = [r for r in runs if r[0][-1] in _PLAIN and len(r[0]) == 1]
        wrappers, prefix, line = (plain or runs)[0]
        out[rel] = (_env_of(wrappers, prefix), line)
    return out


def _excluded(rel: str) -> str | None:
    for pattern, why in EXCLUDED.items():
        if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(os.path.basename(rel), pattern):
            return why
    return None


def _is_test_file(name: str) -> bool:
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def discover(ptxla: str) -> tuple[list[Item], dict[str, str]]:
    """Every runnable test file and example, and the excluded files with their reasons."""
    envs = run_tests_env(ptxla)
    items: list[Item] = []
    excluded: dict[str, str] = {}
    for root, dirs, files in os.walk(os.path.join(ptxla, "test")):
        dirs.sort()
        for name in sorted(files):
            if not _is_test_file(name):
                continue
            rel = os.path.relpath(os.path.join(root, name), ptxla)
            why = _excluded(rel)
            if why is not None:
                excluded[rel] = why
                continue
            if rel in TEST_PROGRAMS:
                devices = "4" if "spmd" in rel else "1"
                env = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": devices}
                items.append(Item("example", rel, env, list(TEST_PROGRAMS[rel]), "a program"))
                continue
            env, how = envs.get(rel, ({"PJRT_DEVICE": "CPU"}, "not in run_tests.sh"))
            items.append(Item("test", rel, env, how=how))
    for root, dirs, files in os.walk(os.path.join(ptxla, "examples")):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), ptxla)
            if not name.endswith(".py"):
                continue
            if rel in EXAMPLE_SKIP:
                excluded[rel] = EXAMPLE_SKIP[rel]
                continue
            multi = any(k in rel for k in ("spmd", "fsdp", "ddp", "data_parallel"))
            env = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4" if multi else "1"}
            env.update(EXAMPLE_ENV.get(rel, {}))
            for glob, shrink in EXAMPLE_SHRINK.items():
                if fnmatch.fnmatch(rel, glob):
                    env[SHRINK_ENV] = json.dumps(shrink, separators=(",", ":"))
                    break
            items.append(Item("example", rel, env, list(EXAMPLE_ARGS.get(rel, []))))
    return items, excluded
