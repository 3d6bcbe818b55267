"""pytorch/xla's own tests and examples, run through the torch_xla alias: the conformance report.

    python -m lazyxla.tools.upstream PTXLA                  # everything; writes the doc
    python -m lazyxla.tools.upstream PTXLA --files 'test/test_metrics.py' 'test/spmd/*'
    python -m lazyxla.tools.upstream PTXLA --collect-only   # imports only (fast)

(PTXLA: a pytorch/xla checkout.)

Each test file runs in its own subprocess under pytest (which also collects unittest-style files),
with the environment pytorch/xla's `test/run_tests.sh` gives that file (`PJRT_DEVICE=CPU`,
`CPU_NUM_DEVICES`, `XLA_*` flags, read from the script itself), and with the torch_xla alias
installed at interpreter start (a generated `sitecustomize`, so subprocesses a test spawns get it
too). A pytest plugin (this module, loaded with `-p`) appends each test's outcome to a JSON-lines
file as it happens, so a file that times out or crashes still reports the cases that ran. Each
example under `examples/` runs to the end with `lazyxla run` (with size-reducing flags where it
takes them) and its printed losses are checked to decrease.

Results are kept per file in `--results-dir`; a run over a subset (`--files`) replaces those files'
results and the report is regenerated from every stored result, so fixing one module and re-running
its files updates the table. The report (`docs/torch_xla_conformance.md`) lists per file
collected / passed / failed / skipped / errored-at-import, every failure grouped by cause (the
exception's first line, normalised), the torch_xla modules that stop files at import, ranked, and,
separately, the failures that happen only because lazyxla's device type is `jax`, not `xla`.

Test files that are training programs rather than test cases (`TEST_PROGRAMS`: the
`test_train_mp_*` ones, and `test/spmd/test_sharding_strategies.py`, a benchmark that parses its
flags at import) run like examples, with their own flags set small (`--fake_data`, a batch size,
`--num_steps`). Files that need a TPU, GPU or Neuron device (`EXCLUDED`) are listed, not run.
None of pytorch/xla's files are copied into this repository.

torchvision (the ResNet and MNIST programs and a few test files import it) is not a dependency of
lazyxla. Give the tool a directory it is installed in, outside the repository:

    make upstream-deps DIR=/tmp/deps   # pip download, then pip install --no-deps --target
    python -m lazyxla.tools.upstream PTXLA --torchvision /tmp/deps   # or $LAZYXLA_TORCHVISION

DIR goes on every program's PYTHONPATH. The registry's torchvision for this torch is a CUDA build
whose C++ extension (`_C`) does not load on a CPU-only torch: its Python parts (models,
transforms, datasets with fake data) work, its C++ ops (`nms`, `roi_align`, ...) do not. Such a
build fails at import (`_meta_registrations.py` registers a fake kernel for `torchvision::nms`,
whose schema only `_C` defines); the generated sitecustomize defines those schemas when `_C` did
not load, with a kernel that raises, so the import succeeds and a call says why it cannot run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import fnmatch
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

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


# --- running ----------------------------------------------------------------------------------

_SITECUSTOMIZE = """\
# Generated by lazyxla.tools.upstream: every Python started under it gets the torch_xla alias.
import os
if os.environ.get("LAZYXLA_UPSTREAM_ALIAS") == "1":
    import lazyxla.compat
    lazyxla.compat.install()
elif os.environ.get("LAZYXLA_UPSTREAM_REFERENCE") == "1":
    import torch_xla  # the installed one, before the checkout's source tree is on sys.path
import importlib.abc, json, sys

_after = {}  # module name -> what to do to it once it has run


class _AfterImport(importlib.abc.MetaPathFinder):
    # Runs `_after[name](module)` right after module `name` executes (no file changes).

    def find_spec(self, name, path, target=None):
        if name not in _after:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                run = spec.loader.exec_module
                def exec_module(module, run=run, name=name):
                    run(module)
                    _after[name](module)
                spec.loader.exec_module = exec_module
                return spec
        return None


if os.environ.get("LAZYXLA_UPSTREAM_SHRINK"):
    # Shrink pytorch/xla's decoder-only and ResNet examples as they are imported (see SHRINK in
    # upstream.py).
    _shrink = json.loads(os.environ["LAZYXLA_UPSTREAM_SHRINK"])

    def _with_defaults(init, defaults):
        def __init__(self, *args, **kwargs):
            for k, v in defaults.items():
                kwargs.setdefault(k, v)
            init(self, *args, **kwargs)
        return __init__

    def _fixed(value):
        # `self.x = 224` in the example's __init__ is ignored; reads see `value`.
        return property(lambda self: value, lambda self, v: None)

    def _shrink_decoder_model(module):
        cls = module.DecoderOnlyConfig
        cls.__init__ = _with_defaults(cls.__init__, _shrink["config"])

    def _shrink_decoder_base(module):
        cls = module.TrainDecoderOnlyBase
        cls.__init__ = _with_defaults(cls.__init__, {"num_steps": _shrink["num_steps"]})

    def _shrink_resnet_base():
        # On the class as it is built, so that `python train_resnet_base.py` (the class defined
        # in `__main__`) is shrunk too, not only the examples that import it.
        import builtins

        build = builtins.__build_class__

        def __build_class__(func, name, *bases, **kwargs):
            cls = build(func, name, *bases, **kwargs)
            if name == "TrainResNetBase":
                for k, v in _shrink["resnet"].items():
                    setattr(cls, k, _fixed(v))
            return cls

        builtins.__build_class__ = __build_class__

    if "config" in _shrink:
        _after["decoder_only_model"] = _shrink_decoder_model
        _after["train_decoder_only_base"] = _shrink_decoder_base
    if "resnet" in _shrink:
        _shrink_resnet_base()

if os.environ.get("LAZYXLA_UPSTREAM_TORCHVISION"):
    # A torchvision whose C++ extension (`_C`) does not load here (the registry's CUDA build on a
    # CPU-only torch): its Python parts work, but `torchvision/_meta_registrations.py` registers
    # fake kernels for `torchvision::nms`/`qnms` unguarded, and that needs the operators'
    # schemas, which `_C` would have defined. Define them (with a CPU kernel that raises) once
    # `torchvision.extension` has found `_C` missing, so `import torchvision` succeeds.
    _TORCHVISION_SCHEMAS = {
        "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
        "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    }

    def _torchvision_schemas(module):
        if module._has_ops():
            return
        import torch

        lib = torch.library.Library("torchvision", "FRAGMENT")
        for name, schema in _TORCHVISION_SCHEMAS.items():
            if hasattr(torch.ops.torchvision, name):
                continue
            lib.define(schema)

            def unavailable(*args, _name=name, **kwargs):
                raise RuntimeError(
                    f"torchvision::{_name} is unavailable: torchvision's C++ extension (_C) did "
                    "not load in this environment (only its schema is defined, by "
                    "lazyxla.tools.upstream, so that `import torchvision` works)"
                )

            lib.impl(name, unavailable, "CPU")
        module._lazyxla_upstream_library = lib  # keeps the definitions alive

    _after["torchvision.extension"] = _torchvision_schemas

if _after:
    sys.meta_path.insert(0, _AfterImport())
"""


def torchvision_version(directory: str) -> str:
    """The version of the torchvision installed in `directory` (`pip install --target`)."""
    with open(os.path.join(directory, "torchvision", "version.py")) as f:
        m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
    return m.group(1) if m else "unknown version"


def check_torchvision(directory: str) -> str | None:
    """Why `directory` cannot be given to `--torchvision`, or None if it can."""
    if not os.path.isfile(os.path.join(directory, "torchvision", "__init__.py")):
        return (
            f"{directory} has no torchvision/__init__.py: give the directory torchvision was "
            "installed into with `pip install --no-deps --target DIR` (see `make upstream-deps`)"
        )
    if not os.path.isfile(os.path.join(directory, "torchvision", "version.py")):
        return f"{directory}/torchvision has no version.py: not a torchvision install"
    return None


def _support_dir(results_dir: str) -> str:
    d = os.path.join(results_dir, "site")
    os.makedirs(d, exist_ok=True)
    _write_atomically(os.path.join(d, "sitecustomize.py"), _SITECUSTOMIZE)
    _write_atomically(os.path.join(d, "pytest.ini"), "[pytest]\naddopts =\n")
    with open(upstream_plugin.__file__) as f:
        _write_atomically(os.path.join(d, PLUGIN + ".py"), f.read())
    return d


def _write_atomically(path: str, text: str) -> None:
    """Write `path` unless it already holds `text`, by a rename: with --jobs > 1 another file's
    interpreter may be starting and reading it (a half-written sitecustomize starts it without
    the alias, and the checkout's own torch_xla/ is imported instead)."""
    with contextlib.suppress(OSError), open(path) as f:
        if f.read() == text:
            return
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _key(rel: str) -> str:
    return rel.replace("/", "__")


def _group_rss(pgid: int) -> int:
    """Resident bytes of every process in group `pgid` (Linux /proc)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return total


def _watch(proc: subprocess.Popen, timeout: float, memory_limit: float) -> tuple[int, bool, bool]:
    """Wait for `proc`; kill its process group past `timeout` seconds or `memory_limit` bytes of
    resident memory (a program sized for a TPU host must not push the machine into swap or the
    OOM killer). Returns (returncode, timed out, over the memory limit)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc.wait(timeout=1.0), False, False
        except subprocess.TimeoutExpired:
            pass
        over = memory_limit > 0 and _group_rss(proc.pid) > memory_limit
        if over or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait(), not over, over


def _run_one(
    item: Item,
    ptxla: str,
    results_dir: str,
    timeout: float,
    collect_only: bool,
    memory_limit: float = 0,
    torchvision: str | None = None,
    python: str | None = None,
) -> dict[str, Any]:
    """Run one file; `python`: another interpreter, with the real torch_xla and without the
    alias (the reference run)."""
    site = _support_dir(results_dir)
    key = _key(item.path)
    jsonl = os.path.join(results_dir, key + ".jsonl")
    log = os.path.join(results_dir, key + ".log")
    tmp = tempfile.mkdtemp(prefix=key[:40] + ".", dir=results_dir)
    if os.path.exists(jsonl):
        os.remove(jsonl)
    here = os.path.join(ptxla, os.path.dirname(item.path))
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("XLA_", "PT_XLA_", "PJRT_")) or k == "CPU_NUM_DEVICES":
            del env[k]
    env.update(BASE_ENV)
    env["TORCH_TEST_DEVICES"] = os.path.join(ptxla, "test", "pytorch_test_base.py")
    env.update({k: v.replace("{tmp}", tmp) for k, v in item.env.items()})
    # test/ is a package, so pytest puts the checkout first on sys.path, where its torch_xla/
    # source tree would shadow the torch_xla in use: the sitecustomize imports that one first.
    env["LAZYXLA_UPSTREAM_ALIAS" if python is None else "LAZYXLA_UPSTREAM_REFERENCE"] = "1"
    env[RESULTS_ENV] = jsonl
    # Not the checkout itself: its torch_xla/ source tree would shadow the alias.
    path_parts = [site, here, os.path.join(ptxla, "test"), REPO]
    # Examples import their shared modules from examples/, and so does a test that expects the
    # folder on its path (dynamo/test_dynamo_dynamic_shape.py: `from decoder_only_model import`).
    path_parts.insert(2 if item.kind == "example" else 3, os.path.join(ptxla, "examples"))
    if python is not None:
        path_parts.remove(REPO)  # its torch_xla, not lazyxla's alias (nor its torchvision)
    elif torchvision:
        path_parts.append(torchvision)
        env[TORCHVISION_ENV] = torchvision
    if env.get("PYTHONPATH"):
        path_parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path_parts)
    if item.kind == "test":
        cmd = [python or sys.executable, "-m", "pytest", os.path.join(ptxla, item.path), "-q"]
        cmd += ["-p", "no:cacheprovider", "-p", PLUGIN]
        cmd += ["-c", os.path.join(site, "pytest.ini"), "--rootdir", ptxla, "-rN", "--tb=short"]
        if collect_only:
            cmd.append("--collect-only")
        cwd = ptxla
    else:
        cmd = [sys.executable, "-m", "lazyxla", "run", os.path.join(ptxla, item.path), *item.args]
        cwd = here
        for d in EXAMPLE_DIRS.get(item.path, []):
            os.makedirs(d, exist_ok=True)
    start = time.monotonic()
    with open(log, "w") as out:
        out.write("$ " + " ".join(f"{k}={v}" for k, v in item.env.items()) + " ")
        out.write(shlex.join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        rc, timed_out, over_memory = _watch(proc, timeout, memory_limit)
    seconds = time.monotonic() - start
    with open(log, errors="replace") as f:
        output = f.read()
    result: dict[str, Any] = {
        "path": item.path,
        "kind": item.kind,
        "env": item.env,
        "args": item.args,
        "how": item.how,
        "rc": rc,
        "timed_out": timed_out,
        "over_memory": over_memory,
        "memory_limit": memory_limit,
        "seconds": round(seconds, 1),
        "collect_only": collect_only,
        "timeout": timeout,
        "tail": output[-3000:],
    }
    if python is not None:
        result["python"] = python
    elif torchvision:
        result["torchvision"] = torchvision_version(torchvision)
    if item.kind == "test":
        records = []
        if os.path.exists(jsonl):
            with open(jsonl) as f:
                records = [json.loads(line) for line in f if line.strip()]
        result["cases"] = records
        if collect_only:
            result["collected"] = len(re.findall(r"^\S+::\S+$", output, flags=re.M))
    else:
        result.update(_example_outcome(output))
    with open(os.path.join(results_dir, key + ".json"), "w") as f:
        json.dump(result, f)
    return result


_LOSS = re.compile(
    r"(?i)loss[\w ]*[:=]\s*(?:tensor\(\s*)?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
)


def _example_outcome(output: str) -> dict[str, Any]:
    losses = [float(v) for v in _LOSS.findall(output)]
    errors = [
        ln.strip()
        for ln in output.splitlines()
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*", ln.strip())
    ]
    return {"losses": losses[:3] + losses[-3:] if len(losses) > 6 else losses, "errors": errors}


def run(
    items: Sequence[Item],
    ptxla: str,
    results_dir: str,
    timeout: float,
    jobs: int,
    collect_only: bool = False,
    example_timeout: float | None = None,
    memory_limit: float = 0,
    torchvision: str | None = None,
    python: str | None = None,
) -> list[dict[str, Any]]:
    os.makedirs(results_dir, exist_ok=True)
    results = []
    jobs = max(1, min(jobs, MAX_JOBS))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = {
            pool.submit(
                _run_one,
                it,
                ptxla,
                results_dir,
                example_timeout if it.kind == "example" and example_timeout else timeout,
                collect_only,
                memory_limit,
                torchvision,
                python,
            ): it
            for it in items
        }
        for n, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            r = fut.result()
            results.append(r)
            print(f"[{n}/{len(items)}] {r['path']}: {_summary_line(r)}", flush=True)
    return results


# --- the report -------------------------------------------------------------------------------


def _counts(r: dict[str, Any]) -> Counter[str]:
    c: Counter[str] = Counter()
    for case in r.get("cases", []):
        if case["phase"] == "collect":
            c["import_error"] += 1
        else:
            c[case["outcome"]] += 1
    return c


def _status(r: dict[str, Any]) -> str:
    if r.get("over_memory"):
        return "over memory limit"
    if r["kind"] == "example":
        ls = r.get("losses", [])
        falling = len(ls) >= 2 and ls[-1] < ls[0]
        if r["timed_out"]:
            return "timeout, loss falling" if falling else "timeout"
        if r["rc"] != 0:
            return "failed"
        return "ok, loss falling" if falling else "ok"
    c = _counts(r)
    if c["import_error"] and not any(c[k] for k in ("passed", "failed", "error", "skipped")):
        return "import error"
    if r["timed_out"]:
        return "timeout"
    if r["rc"] not in (0, 1, 5) and r["rc"] is not None:
        return f"crashed (rc {r['rc']})"
    return "ran"


def _summary_line(r: dict[str, Any]) -> str:
    if r.get("over_memory"):
        return "over memory limit"
    if r["kind"] == "example":
        ls = r.get("losses", [])
        trend = f", loss {ls[0]:.4g} -> {ls[-1]:.4g}" if len(ls) >= 2 else ""
        return f"{_status(r)} in {r['seconds']}s{trend}"
    c = _counts(r)
    if r.get("collect_only"):
        errs = [x["message"] for x in r.get("cases", []) if x["phase"] == "collect"]
        return f"{_status(r)}: {r.get('collected', 0)} collected" + (f"; {errs[0]}" if errs else "")
    return (
        f"{_status(r)}: {c['passed']} passed, {c['failed'] + c['error']} failed, "
        f"{c['skipped']} skipped ({r['seconds']}s)"
    )


_NORMALISE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),
    (re.compile(r"(?<![\w.])[-+]?\d+(\.\d+)?([eE][-+]?\d+)?(?![\w])"), "N"),
    (re.compile(r"tensor\(.*"), "tensor(…)"),
    (re.compile(r"/tmp/[^\s'\"]+"), "/tmp/…"),
    (re.compile(r"\s+"), " "),
]


def normalise(message: str) -> str:
    """The cause of a failure, for grouping: the first line, with numbers and addresses elided."""
    line = message.strip().splitlines()[0] if message.strip() else "(no message)"
    for pattern, repl in _NORMALISE:
        line = pattern.sub(repl, line)
    return line[:160]


_DEVICE_MESSAGE = re.compile(
    r"['\"]jax['\"].*['\"]xla['\"]|['\"]xla['\"].*['\"]jax['\"]|type='jax'"
)
_DEVICE_SOURCE = re.compile(r"^>.*(\.type\b|device\b|str\().*['\"]xla(:\d+)?['\"]", re.M)


def device_type_only(case: dict[str, Any]) -> bool:
    """A failure that happens only because lazyxla's device type is `jax` (torch_xla's is `xla`).

    Either the message compares the two names, or the failing source line compares a device or its
    type with the literal `'xla'` and the message names `jax`.
    """
    msg = case.get("message", "")
    detail = case.get("detail", "")
    if _DEVICE_MESSAGE.search(msg) and "xla" in msg:
        return True
    return bool(_DEVICE_SOURCE.search(detail)) and "jax" in msg


_MISSING = re.compile(r"No module named '(torch_xla[\w.]*)'")


def _outcomes(results: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Case -> its outcome. A case is its id, with `#k` for the k-th report of an id after the
    first (a test's subtests report under its id: test_core_aten_ops.py has 9 per test), in the
    order they ran, which both runs share."""
    out: dict[str, str] = {}
    for r in results:
        seen: Counter[str] = Counter()
        for case in r.get("cases", []):
            if case["phase"] == "collect":
                continue
            if case["phase"] != "call":  # a setup/teardown report: that of the last call
                key = case["id"] + (f"#{seen[case['id']] - 1}" if seen[case["id"]] > 1 else "")
                if case["outcome"] in ("failed", "error"):
                    out[key] = case["outcome"]
                continue
            k = seen[case["id"]]
            seen[case["id"]] += 1
            out[case["id"] + (f"#{k}" if k else "")] = case["outcome"]
    return out


def _against_reference(
    results: list[dict[str, Any]], reference: list[dict[str, Any]], device_only: set[str]
) -> tuple[list[str], dict[str, Any]]:
    """The report's comparison with a reference run under torch_xla 2.9 (`--reference-results`):
    its totals lines and the data for its section."""
    ours, theirs = _outcomes(results), _outcomes(reference)
    passed_there = {i for i, o in theirs.items() if o == "passed"}
    missed = sorted(i for i in passed_there if ours.get(i) != "passed" and i not in device_only)
    counted = len(passed_there - device_only)
    gained = sorted(
        i for i, o in ours.items() if o == "passed" and theirs.get(i) in ("failed", "error")
    )
    files = {r["path"] for r in reference}
    lines = [
        f"- Against torch_xla 2.9 on this CPU (the same files run with torch_xla 2.9.0 itself, "
        f"`--reference-python`; {len(files)} files): of the {counted} cases it passes (device-type-"
        f"only cases excluded), lazyxla passes {counted - len(missed)} "
        f"({100 * (counted - len(missed)) / max(counted, 1):.1f} %). lazyxla also passes "
        f"{len(gained)} cases torch_xla 2.9 fails here.",
    ]
    return lines, {"missed": missed, "ours": ours, "theirs": theirs, "gained": gained}


def report(
    results: Iterable[dict[str, Any]],
    excluded: dict[str, str],
    ptxla: str,
    timeout: float,
    reference: Iterable[dict[str, Any]] | None = None,
) -> str:
    results = sorted(results, key=lambda r: (r["kind"] != "test", r["path"]))
    tests = [r for r in results if r["kind"] == "test"]
    examples = [r for r in results if r["kind"] == "example"]
    total: Counter[str] = Counter()
    causes: dict[str, list[str]] = defaultdict(list)
    device_only: list[tuple[str, str]] = []
    missing: dict[str, set[str]] = defaultdict(set)
    import_errors: dict[str, list[str]] = defaultdict(list)
    for r in tests:
        c = _counts(r)
        total.update(c)
        total["files"] += 1
        if _status(r) == "import error":
            total["files_import_error"] += 1
        for case in r.get("cases", []):
            if case["outcome"] not in ("failed", "error"):
                continue
            if case["phase"] == "collect":
                m = _MISSING.search(case["message"]) or _MISSING.search(case.get("detail", ""))
                if m:
                    missing[m.group(1)].add(r["path"])
                import_errors[normalise(case["message"])].append(r["path"])
                continue
            if device_type_only(case):
                device_only.append((case["id"], case["message"].strip().splitlines()[0][:160]))
                total["device_only"] += 1
                continue
            causes[normalise(case["message"])].append(case["id"])
    commit = _git_commit(ptxla)
    used = Counter(r.get("timeout", timeout) for r in tests)
    if used:  # results may come from runs with different timeouts: name the usual one
        timeout = used.most_common(1)[0][0]
    other = sorted(
        f"{os.path.basename(r['path'])} {r['timeout']:.0f} s"
        for r in results
        if r["kind"] == "test" and r.get("timeout", timeout) != timeout
    )
    timeouts = f"per-file timeout {timeout:.0f} s" + (f" ({', '.join(other)})" if other else "")
    ex_timeouts = sorted({r.get("timeout", timeout) for r in results if r["kind"] == "example"})
    if ex_timeouts:
        timeouts += ", examples " + "/".join(f"{t:.0f}" for t in ex_timeouts) + " s"
    limits = {r.get("memory_limit", 0) for r in results} - {0}
    if limits:
        timeouts += "; killed past " + "/".join(f"{m / 2**30:.0f}" for m in limits) + " GB resident"
    ran = total["passed"] + total["failed"] + total["error"]
    tv = sorted({r["torchvision"] for r in results if r.get("torchvision")})
    with_tv = sum(bool(r.get("torchvision")) for r in results)
    torchvision_note = (
        f" torchvision {'/'.join(tv)} (not a dependency of lazyxla) comes from a directory given "
        f"with `--torchvision` ({with_tv} of {len(results)} files ran with it): a build whose C++ "
        "extension does not load here, so its Python parts (models, transforms, datasets) work "
        "and its C++ ops (`nms`, `roi_align`, ...) raise; `make upstream-deps DIR=...` fetches it."
        if tv
        else ""
    )
    out = [
        "# torch_xla conformance: pytorch/xla's own tests and examples on lazyxla",
        "",
        "Generated by `python -m lazyxla.tools.upstream PYTORCH_XLA_CHECKOUT` "
        f"(pytorch/xla at `{commit}`; {timeouts}; "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}). Do not edit by hand: re-run the tool. Each "
        "test file runs under pytest in its own process, with the torch_xla alias and the "
        "environment pytorch/xla's `test/run_tests.sh` gives it; `if __name__ == '__main__'` "
        "blocks do not run under pytest (a few files set the matmul precision or a seed there)."
        + torchvision_note,
        "",
        "## Totals",
        "",
        f"- Test files run: {total['files']} ({total['files_import_error']} stop at import); "
        f"{len([e for e in excluded if e.startswith('test/')])} excluded as TPU/GPU/Neuron-only.",
        f"- Test cases: {total['passed']} passed, {total['failed'] + total['error']} failed "
        f"({total['device_only']} of them only because the device type is `jax`), "
        f"{total['skipped']} skipped, {total['xfail']} expected failures."
        + (
            f" Pass rate of the cases that ran: {100 * total['passed'] / ran:.1f} %." if ran else ""
        ),
        f"- Examples: {sum(_status(r).startswith('ok') for r in examples)} of {len(examples)} run "
        f"to the end ({sum(_status(r) == 'ok, loss falling' for r in examples)} with a falling "
        "loss); examples time out after the example timeout. Those that do not, and why, are "
        "noted under Examples.",
        "",
    ]
    vs: dict[str, Any] = {}
    if reference is not None:
        lines, vs = _against_reference(tests, list(reference), {i for i, _ in device_only})
        out[-1:-1] = lines
    if missing:
        out += [
            "## torch_xla modules that stop files at import",
            "",
            "| module | files |",
            "|---|---|",
        ]
        for mod, files in sorted(missing.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            names = ", ".join(sorted(os.path.basename(f) for f in files))
            out.append(f"| `{mod}` | {len(files)}: {names} |")
        out.append("")
    out += [
        "## Test files",
        "",
        "| file | status | collected | passed | failed | skipped | import errors | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in tests:
        c = _counts(r)
        collected = c["passed"] + c["failed"] + c["error"] + c["skipped"] + c["xfail"] + c["xpass"]
        out.append(
            f"| {r['path']} | {_status(r)} | {r.get('collected', collected)} | {c['passed']} | "
            f"{c['failed'] + c['error']} | {c['skipped']} | {c['import_error']} | {r['seconds']} |"
        )
    out += [
        "",
        "## Examples",
        "",
        "Also the test files that are training programs, not test cases (run as scripts with the "
        "flags shown, as torch_xla's CI runs them).",
        "",
        "| example | status | flags | losses (first … last) | s |",
    ]
    out.append("|---|---|---|---|---|")
    for r in examples:
        ls = r.get("losses", [])
        trend = " … ".join(f"{v:.4g}" for v in ls) if ls else ""
        if _status(r) == "failed" and r.get("errors"):
            trend = (trend + " " if trend else "") + f"`{r['errors'][-1][:120]}`"
        flags = " ".join(
            [f"{k}={v}" for k, v in EXAMPLE_ENV.get(r["path"], {}).items()] + r.get("args", [])
        )
        if SHRINK_ENV in r.get("env", {}):
            sizes = _shrunk_sizes(json.loads(r["env"][SHRINK_ENV]))
            flags += " shrunk: " + ", ".join(f"{k}={v}" for k, v in sizes.items())
        out.append(f"| {r['path']} | {_status(r)} | {flags} | {trend} | {r['seconds']} |")
    noted = [r["path"] for r in examples if r["path"] in EXAMPLE_NOTES]
    if noted:
        out += ["", "Notes:", ""] + [f"- {p}: {EXAMPLE_NOTES[p]}" for p in noted]
    out += ["", "## Failures by cause", "", "Each cause: the exception's first line, normalised "]
    out[-1] += "(numbers → N); the count of cases, and up to five of them."
    out.append("")
    for cause, ids in sorted(causes.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(f"`{i}`" for i in ids[:5]) + (" …" if len(ids) > 5 else "")
        out.append(f"- **{len(ids)}** `{cause}`: {shown}")
    if import_errors:
        out += ["", "## Import errors by cause", ""]
        for cause, files in sorted(import_errors.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            out.append(f"- **{len(files)}** `{cause}`: {', '.join(sorted(set(files)))}")
    out += [
        "",
        "## Failures only because the device type is `jax`",
        "",
        "torch_xla's device type is `xla`; lazyxla's is `jax` (see DESIGN: PyTorch owns the `xla` "
        "type). These cases compare a device or its type with `'xla'`:",
        "",
    ]
    out += [f"- `{i}`: `{m}`" for i, m in device_only] or ["- none"]
    if vs:
        out += [
            "",
            "## Cases torch_xla 2.9 passes here and lazyxla does not",
            "",
            "From the reference run (`--reference-results`); lazyxla's outcome after each.",
            "",
        ]
        out += [f"- `{i}`: {vs['ours'].get(i, 'not run')}" for i in vs["missed"]] or ["- none"]
    out += ["", "## Not run (need a TPU, GPU or Neuron device, or not a program)", ""]
    out += [f"- {p}: {why}" for p, why in sorted(excluded.items())]
    return "\n".join(out) + "\n"


def _shrunk_sizes(shrink: dict[str, Any]) -> dict[str, Any]:
    sizes: dict[str, Any] = {}
    for k, v in shrink.items():
        sizes.update(v if isinstance(v, dict) else {k: v})
    return sizes


def _git_commit(ptxla: str) -> str:
    try:
        return subprocess.run(
            ["git", "-C", ptxla, "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"


def load_results(results_dir: str, paths: Iterable[str]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        f = os.path.join(results_dir, _key(p) + ".json")
        if os.path.exists(f):
            with open(f) as fh:
                r = json.load(fh)
            if not r.get("collect_only"):
                out.append(r)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lazyxla.tools.upstream", description=__doc__)
    parser.add_argument("ptxla", help="a pytorch/xla checkout (its test/ and examples/)")
    parser.add_argument("--files", nargs="*", help="globs (relative to the checkout) to run")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per test file")
    parser.add_argument("--example-timeout", type=float, default=300.0, help="seconds per example")
    parser.add_argument("--jobs", type=int, default=2, help=f"files at a time (≤ {MAX_JOBS})")
    parser.add_argument(
        "--memory-limit-gb",
        type=float,
        default=6.0,
        help="kill a program whose processes hold more resident memory than this (0: no limit)",
    )
    parser.add_argument("--results-dir", default=DEFAULT_RESULTS, help="per-file results")
    parser.add_argument("--out", default=DEFAULT_DOC, help="the report to write")
    parser.add_argument("--no-examples", action="store_true", help="test files only")
    parser.add_argument("--collect-only", action="store_true", help="import and collect only")
    parser.add_argument("--report-only", action="store_true", help="rewrite the report, run none")
    parser.add_argument("--list", action="store_true", help="list what would run, with its env")
    parser.add_argument(
        "--torchvision",
        metavar="DIR",
        default=os.environ.get("LAZYXLA_TORCHVISION") or None,
        help="a directory torchvision is installed in (`pip install --no-deps --target DIR`; "
        "`make upstream-deps DIR=...`), put on the programs' PYTHONPATH; a build whose C++ ops "
        "do not load is made importable. Default: $LAZYXLA_TORCHVISION",
    )
    parser.add_argument(
        "--reference-python",
        metavar="PY",
        help="run the test files (not the examples) with this interpreter, one with the real "
        "torch_xla 2.9 installed, without the alias, into --results-dir (a directory of its "
        "own); no report is written. ../shared/peer/setup.sh DIR builds one: DIR/bin/python",
    )
    parser.add_argument(
        "--reference-results",
        metavar="DIR",
        help="the results of a --reference-python run: the report then counts, of the cases "
        "torch_xla passes, how many lazyxla passes, and lists those it does not",
    )
    ns = parser.parse_args(argv)
    if ns.reference_python:
        ns.no_examples, ns.torchvision = True, None
    if ns.torchvision:
        ns.torchvision = os.path.abspath(ns.torchvision)
        why = check_torchvision(ns.torchvision)
        if why:
            parser.error(f"--torchvision: {why}")
    ptxla = os.path.abspath(ns.ptxla)
    if not os.path.isfile(os.path.join(ptxla, "test", "run_tests.sh")):
        parser.error(f"{ptxla} is not a pytorch/xla checkout (no test/run_tests.sh)")
    items, excluded = discover(ptxla)
    selected = items
    if ns.files:
        selected = [
            it for it in items if any(fnmatch.fnmatch(it.path, g.rstrip("/")) for g in ns.files)
        ]
        if not selected:
            parser.error(f"--files {ns.files} matches none of the {len(items)} runnable files")
    if ns.no_examples:
        selected = [it for it in selected if it.kind == "test"]
    if ns.list:
        for it in selected:
            env = " ".join(f"{k}={v}" for k, v in sorted(it.env.items()))
            print(f"{it.kind:8s} {it.path}  {env} {' '.join(it.args)}")
        return 0
    if not ns.report_only:
        run(
            selected,
            ptxla,
            ns.results_dir,
            ns.timeout,
            ns.jobs,
            ns.collect_only,
            ns.example_timeout,
            ns.memory_limit_gb * 2**30,
            ns.torchvision,
            ns.reference_python,
        )
    if ns.collect_only or ns.reference_python:
        return 0
    results = load_results(ns.results_dir, [it.path for it in items])
    reference = None
    if ns.reference_results:
        reference = load_results(ns.reference_results, [it.path for it in items])
    text = report(results, excluded, ptxla, ns.timeout, reference)
    os.makedirs(os.path.dirname(os.path.abspath(ns.out)), exist_ok=True)
    with open(ns.out, "w") as f:
        f.write(text)
    print(f"wrote {ns.out} ({len(results)} of {len(items)} files have results)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
