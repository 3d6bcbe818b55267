"""The opt-in `torch_xla` alias: torch_xla's module names resolve to lazyxla's modules.

# Note [The torch_xla alias]
`install()` puts one finder on `sys.meta_path`. `torch_xla` itself is a small package module of its
own (torch_xla's top-level functions, forwarded to `lazyxla`, plus `_XLAC` and `__version__`);
every other `torch_xla.<path>` resolves, when first imported, to the *same module object* as
`lazyxla.<path>` (so `torch_xla.core.xla_model is lazyxla.core.xla_model`). Resolution is lazy: a
name maps to whatever lazyxla provides at import time, so `torch_xla.distributed.spmd` works as soon
as `lazyxla.distributed.spmd` exists, and fails with a message naming the missing lazyxla module
until then. The alias never shadows a real torch_xla: `install()` refuses if one is importable.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

import torch

from . import api, debug, graph, metrics, runtime

VERSION = "2.9.0+lazyxla"


# --- torch_xla._XLAC -----------------------------------------------------------------------------


def _sharding_module() -> Any:
    for name in ("lazyxla.debug", "lazyxla._src.sharding"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "sharding_spec"):
            return mod
    return None


def _get_xla_sharding_spec(tensor: torch.Tensor) -> str:
    mod = _sharding_module()
    return mod.sharding_spec(tensor) if mod is not None else ""


def _get_xla_sharding_type(tensor: torch.Tensor) -> int | None:
    try:
        from . import sharding
    except ImportError:
        return None
    t = sharding.sharding_type(tensor) if hasattr(sharding, "sharding_type") else None
    return None if t is None else int(t)


def _xla_increment_counter(name: str, value: int = 1) -> None:
    metrics.counter_inc(name, value)


def _set_allow_execution(allow: bool) -> None:
    graph.set_allow_execution(allow)


def _get_allow_execution() -> bool:
    return graph._allow_execution


def _get_graph_hash(tensors: Sequence[torch.Tensor]) -> bytes:
    return api.graph_hash(list(tensors))


def _init_computation_client() -> None:
    runtime.jax_devices()


_PRECISIONS = ("default", "high", "highest")


def _xla_set_mat_mul_precision(precision: str) -> None:
    if precision not in _PRECISIONS:
        raise ValueError(f"mat mul precision {precision!r} is not one of {_PRECISIONS}")
    import jax

    if jax.config.jax_default_matmul_precision != precision:
        jax.config.update("jax_default_matmul_precision", precision)
        graph.CACHE.clear()  # executables were compiled at the old precision


def _xla_get_mat_mul_precision() -> str:
    import jax

    return jax.config.jax_default_matmul_precision or "default"


def _xla_get_default_device() -> str:
    return str(api.device())


def _xla_sync_multi(
    tensors: Sequence[torch.Tensor], devices: Sequence[str] = (), wait: bool = True, **_: Any
) -> None:
    from .tensor import state

    graph.sync_states([state(t) for t in tensors], wait=wait)


def _make_xlac() -> types.ModuleType:
    m = types.ModuleType("torch_xla._XLAC", "lazyxla's stand-in for torch_xla's C extension.")
    m._get_xla_tensors_text = debug.ir_text
    m._get_xla_tensors_hlo = debug.hlo_text
    m._get_xla_sharding_spec = _get_xla_sharding_spec
    m._get_xla_sharding_type = _get_xla_sharding_type
    m._xla_increment_counter = _xla_increment_counter
    m._set_allow_execution = _set_allow_execution
    m._get_allow_execution = _get_allow_execution
    m._get_graph_hash = _get_graph_hash
    m._xla_metrics_report = metrics.metrics_report
    m._init_computation_client = _init_computation_client
    m._xla_set_mat_mul_precision = _xla_set_mat_mul_precision
    m._xla_get_mat_mul_precision = _xla_get_mat_mul_precision
    m._xla_get_default_device = _xla_get_default_device
    m._xla_sync_multi = _xla_sync_multi
    return m


# --- the top-level torch_xla module --------------------------------------------------------------


class _TorchXlaModule(types.ModuleType):
    """`torch_xla`: its own few names; anything else is looked up on `lazyxla`, or imported as the
    submodule `torch_xla.<name>` (torch_xla's `__init__` imports its main submodules eagerly)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        import lazyxla

        if hasattr(lazyxla, name):
            return getattr(lazyxla, name)
        try:
            return importlib.import_module(f"torch_xla.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module 'torch_xla' has no attribute {name!r}") from None


def _make_torch_xla() -> types.ModuleType:
    m = _TorchXlaModule("torch_xla", "torch_xla, provided by lazyxla (see lazyxla.compat).")
    m.__version__ = VERSION
    for name in ("device", "devices", "device_count", "real_devices", "sync", "step", "compile"):
        setattr(m, name, getattr(api, name))
    m.launch = api.launch
    m.manual_seed = api.manual_seed
    m.__path__ = []  # a package: submodules come from the finder
    return m


# --- the finder ----------------------------------------------------------------------------------


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType) -> None:
        self.module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # already executed (it is a lazyxla module) or built complete


class TorchXlaFinder(importlib.abc.MetaPathFinder):
    """Resolves `torch_xla` and `torch_xla.<path>` (see Note [The torch_xla alias])."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname == "torch_xla":
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.loader = _AliasLoader(_make_torch_xla())
            return spec
        if not fullname.startswith("torch_xla."):
            return None
        rest = fullname[len("torch_xla.") :]
        if rest == "_XLAC":
            module = _make_xlac()
        else:
            target_name = "lazyxla." + rest
            try:
                module = importlib.import_module(target_name)
            except ModuleNotFoundError as e:
                if e.name is not None and not target_name.startswith(e.name):
                    raise  # a dependency of an existing lazyxla module is missing
                raise ModuleNotFoundError(
                    f"No module named {fullname!r}: the torch_xla alias maps it to "
                    f"{target_name!r}, which this version of lazyxla does not provide",
                    name=fullname,
                ) from None
        is_pkg = hasattr(module, "__path__")
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module), is_package=is_pkg)


_finder: TorchXlaFinder | None = None


def real_torch_xla() -> str | None:
    """Where a real torch_xla would be imported from (None if there is none)."""
    loaded = sys.modules.get("torch_xla")
    if loaded is not None and not isinstance(loaded, _TorchXlaModule):
        return getattr(loaded, "__file__", None) or repr(loaded)
    spec = importlib.machinery.PathFinder.find_spec("torch_xla")
    if spec is None:
        return None
    return spec.origin or (list(spec.submodule_search_locations or []) or ["?"])[0]


def install() -> None:
    """Make `import torch_xla` (and its submodules) resolve to lazyxla.

    Idempotent. Refuses, with RuntimeError, when a real torch_xla is importable: the alias never
    shadows it.

    Example:
        >>> import lazyxla.compat
        >>> lazyxla.compat.install()
        >>> import torch_xla.core.xla_model as xm   # lazyxla.core.xla_model
    """
    global _finder
    if _finder is not None:
        return
    where = real_torch_xla()
    if where is not None:
        raise RuntimeError(
            f"a real torch_xla is installed ({where}); lazyxla.compat.install() will not shadow "
            "it. Use `import lazyxla` directly, or uninstall torch_xla "
            "(pip uninstall torch_xla) to run torch_xla programs on lazyxla"
        )
    _finder = TorchXlaFinder()
    sys.meta_path.insert(0, _finder)
    # torch.compile(backend="openxla") is PyTorch's own backend: it imports
    # torch_xla.core.dynamo_bridge, which the alias resolves to lazyxla's trace-once bridge.


def uninstall() -> None:
    """Remove the alias and forget every `torch_xla` module it made."""
    global _finder
    if _finder is None:
        return
    sys.meta_path.remove(_finder)
    _finder = None
    for name in [n for n in sys.modules if n == "torch_xla" or n.startswith("torch_xla.")]:
        del sys.modules[name]


def is_installed() -> bool:
    return _finder is not None
