"""Executables on disk, indexed by the graph they run: a warm start without lowering.

# Note [Executables on disk by graph key]
JAX's persistent cache (`initialize_cache`) is keyed by the lowered program, so a warm start still
traces every graph to a jaxpr and lowers it to StableHLO before it can look its executable up: for
a 16-layer decoder's training step, 0.37 s of the 0.9 s its graph takes to load. lazyxla keeps a
second index in the same directory (`lazyxla-exe/`), keyed by what its in-memory cache is keyed
by, the graph's data-free key, so that a warm start deserializes the executable without lowering.

A stale entry would run a different program than the graph asks for: a wrong number, not a slow
one. So the digest names everything the executable depends on, and a graph is indexed only when
its key can be written out completely (`_Descriptors.form`, `digest`):
- each node's descriptor, expanded from its process-local interned number: the op, the rule's
  code (file, name, line), its statics with floats by their bits, and its output specs. Only
  aten ops, lazyxla's own ops (`lazyxla::flash_attention_fwd`, einsum) and its leaf and layout
  nodes are written out, with statics of plain types
  (numbers, strings, dtypes, shapes, tuples of them), and a trace-once replay
  (`xla::dynamo_graph`), whose nested graph is expanded in turn. Anything else (a function in a
  static, a nested sub-graph of a scan or a manual region, a custom call, a JAX function) leaves
  the graph to JAX's own cache, which lowers it first;
- the graph's roots, buffer donation and index checking, as in the in-memory key;
- the devices its inputs are on (the executable is loaded onto the devices it was built for);
- the environment: a digest of lazyxla's own source files, the torch, numpy, jax and jaxlib
  versions, the backend's platform version and devices, lazyxla's flags (but those that only
  report), the XLA/LAZYXLA/JAX environment variables, and the jax options that change lowering
  (x64, matmul precision, PRNG).
SPMD graphs and graphs run across processes are not indexed (their executables also depend on
device assignments). An entry that fails to load is ignored (a warning, once), and the graph is
lowered and compiled as without it. A hit counts `PersistentCacheHit`, as JAX's hits do.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile
import warnings
from typing import Any

import jax
import torch

from . import ir
from .config import _FLAGS, FLAGS

_DIR = "lazyxla-exe"
_JAX_OPTIONS = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_default_prng_impl",
    "jax_threefry_partitionable",
    "jax_numpy_dtype_promotion",
    "jax_use_shardy_partitioner",
)
_ENV_PREFIXES = ("XLA_", "LAZYXLA_", "JAX_", "PJRT_", "TPU_", "PT_XLA")
# Flags that only change what is reported or how the host runs, never a program: a debugging run
# (PT_XLA_DEBUG_LEVEL, a metrics file) still finds the executables of the run before it.
_REPORTING = frozenset(
    (
        "debug_level",
        "pt_xla_debug",
        "debug_file",
        "save_tensors_file",
        "save_tensors_fmt",
        "metrics_file",
        "compilation_cache_size",
        "gc_freeze",
        "autograd_threads",
    )
)
_REPORTING_ENV = frozenset(_FLAGS[n].env for n in _REPORTING)
_LEAVES = frozenset((ir.DEVICE_DATA, ir.SCALAR, "xla::layout_of"))
_DYNAMO = "xla::dynamo_graph"


_PLAIN = (
    type(None),
    bool,
    int,
    str,
    bytes,
    torch.dtype,
    torch.memory_format,
    torch.layout,
    torch.device,
    type(Ellipsis),
)
_UNSTABLE = object()


def _static(v: Any) -> Any:
    """`v` in a form whose repr is the same in every process, or _UNSTABLE."""
    t = type(v)
    if t in _PLAIN or t is ir.Ref:
        return v
    if t is float:
        return ("f", v.hex())
    if t is complex:
        return ("c", v.real.hex(), v.imag.hex())
    if t is tuple or t is list or t is ir.TensorSpec:
        out = tuple(_static(x) for x in v)
        return _UNSTABLE if any(x is _UNSTABLE for x in out) else out
    if t is slice:
        out = _static((v.start, v.stop, v.step))
        return _UNSTABLE if out is _UNSTABLE else ("slice", out)
    return _UNSTABLE


def _code(rule_code: Any) -> Any:
    """The rule's identity: its code's file, name and first line (the source digest pins the
    rest), or a jax.numpy ufunc by name; a leaf has none."""
    if rule_code is None:
        return None
    if hasattr(rule_code, "co_qualname"):
        return (rule_code.co_filename, rule_code.co_qualname, rule_code.co_firstlineno)
    if type(rule_code).__name__ == "ufunc" and type(rule_code).__module__.startswith("jax"):
        return ("jnp.ufunc", rule_code.__name__)
    return _UNSTABLE


class _Descriptors:
    """Each interned descriptor's stable form (memoized; _UNSTABLE when it has none)."""

    def __init__(self) -> None:
        self.forms: dict[int, Any] = {}
        self.keys: list[tuple] = []  # interned key by id, rebuilt as descriptors are added

    def _key(self, i: int) -> tuple:
        if len(self.keys) != len(ir._desc_list):
            keys: list[Any] = [None] * len(ir._desc_list)
            for k, j in ir._desc_ids.items():
                keys[j] = k
            self.keys = keys
        return self.keys[i]

    def form(self, i: int) -> Any:
        f = self.forms.get(i)
        if f is None:
            f = self.forms[i] = self._build(i)
        return f

    def _build(self, i: int) -> Any:
        key = self._key(i)
        if key[0] == "dynamo_graph":  # a trace's structural id (dynamo.Trace)
            return self._trace_form(key)
        if len(key) != 6:
            return _UNSTABLE
        op, code, args, kwargs, specs, extra = key
        if op == _DYNAMO:  # (Ref per leaf..., the trace's id)
            if not args or type(args[-1]) is not int:
                return _UNSTABLE
            nested = self.form(args[-1])
            statics = _static(args[:-1])
            if nested is _UNSTABLE or statics is _UNSTABLE:
                return _UNSTABLE
            parts: tuple = (op, _code(code), statics, nested, _static(specs))
        elif op.startswith(("aten::", "lazyxla::")) or op in _LEAVES:
            parts = (op, _code(code), _static(args), _static(kwargs), _static(specs))
            parts += (_static(extra),)
        else:
            return _UNSTABLE
        return _UNSTABLE if any(p is _UNSTABLE for p in parts) else repr(parts)

    def _trace_form(self, key: tuple) -> Any:
        """A replayed trace's structure: ("dynamo_graph", parts, roots), whose parts hold
        interned ids (`ir.structure_key`)."""
        if len(key) != 3:
            return _UNSTABLE
        out = self.parts(key[1])
        return _UNSTABLE if out is _UNSTABLE else repr(("dynamo_graph", out, key[2]))

    def parts(self, parts: tuple) -> Any:
        """A graph key's parts (`Capture.key[0]`, `ir.structure_key`) in stable form: each a
        descriptor, a descriptor with its input positions, or a leaf's (op, specs)."""
        out = []
        for p in parts:
            if type(p) is int:
                f = self.form(p)
            elif type(p[0]) is int:  # (descriptor, input positions)
                f = self.form(p[0])
                f = f if f is _UNSTABLE else (f, p[1])
            else:  # a leaf: (op, specs)
                f = _static(p)
            if f is _UNSTABLE:
                return _UNSTABLE
            out.append(f)
        return tuple(out)


_descriptors = _Descriptors()
_env: list[str] = []
_warned: list[bool] = []


def _source_digest() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the lazyxla package
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def _environment() -> str:
    """Everything outside the graph an executable depends on, computed once per process (the
    flags and options that may change at run time are read per key, in `digest`)."""
    if not _env:
        import jaxlib
        import numpy
        import torch

        backend = jax.devices()[0].client
        devices = [(d.platform, d.device_kind, d.id) for d in jax.devices()]
        _env.append(
            repr(
                (
                    _source_digest(),
                    torch.__version__,
                    numpy.__version__,
                    jax.__version__,
                    jaxlib.__version__,
                    backend.platform_version,
                    devices,
                    jax.process_count(),
                    sys.version,
                )
            )
        )
    return _env[0]


def digest(cap: Any) -> str | None:
    """The disk key of `cap`'s executable, or None when its key cannot be written out."""
    from .sharding import is_spmd

    if is_spmd() or cap.replicas or any(s is not None for s in cap.out_shardings):
        return None
    parts = _descriptors.parts(cap.key[0])
    if parts is _UNSTABLE:
        return None
    flags = tuple((n, getattr(FLAGS, n)) for n in _FLAGS if n not in _REPORTING)
    env = tuple(
        sorted(
            (k, v)
            for k, v in os.environ.items()
            if k.startswith(_ENV_PREFIXES) and k not in _REPORTING_ENV
        )
    )
    options = tuple((o, str(getattr(jax.config, o, None))) for o in _JAX_OPTIONS)
    devices = sorted({d.id for a in cap.data for d in a.devices()})  # where its inputs are
    text = repr((_environment(), flags, env, options, devices, parts, cap.key[1:]))
    return hashlib.sha256(text.encode()).hexdigest()


def _path(cache_dir: str, key: str) -> str:
    return os.path.join(cache_dir, _DIR, key + ".exe")


def _warn_once(what: str, err: BaseException) -> None:
    if not _warned:
        _warned.append(True)
        warnings.warn(
            f"lazyxla: {what} the persistent cache's executable index failed ({err!r}); graphs "
            "are lowered and compiled instead (JAX's own persistent cache still applies)",
            stacklevel=3,
        )


def load(cache_dir: str, key: str) -> Any:
    """The executable stored under `key`, or None."""
    path = _path(cache_dir, key)
    try:
        with open(path, "rb") as f:
            payload, in_tree, out_tree, device_ids = pickle.load(f)
        by_id = {d.id: d for d in jax.devices()}
        devices = [by_id[i] for i in device_ids]
    except FileNotFoundError:
        return None
    except Exception as err:  # a truncated or foreign file
        _warn_once(f"reading {path} from", err)
        return None
    from jax.experimental import serialize_executable

    try:
        return serialize_executable.deserialize_and_load(
            payload, in_tree, out_tree, execution_devices=devices
        )
    except Exception as err:
        _warn_once(f"loading {path} from", err)
        return None


def store(cache_dir: str, key: str, exe: Any) -> None:
    """Write `exe` under `key` (atomically: a concurrent reader sees all of it or nothing)."""
    from jax.experimental import serialize_executable

    folder = os.path.join(cache_dir, _DIR)
    try:
        devices = [d.id for d in exe._executable.xla_executable.local_devices()]
        blob = pickle.dumps((*serialize_executable.serialize(exe), devices))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, _path(cache_dir, key))
    except Exception as err:
        _warn_once(f"writing {folder} for", err)
