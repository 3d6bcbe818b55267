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
from typing import Any

import torch

from . import api
from .xlac import VERSION, _make_xlac

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
        if name == "xm":  # torch_xla's __init__ imports core.xla_model as xm
            return importlib.import_module("torch_xla.core.xla_model")
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


# --- the 'xla' device spelling -------------------------------------------------------------------

# Note [The 'xla' device spelling]
# Under the alias, `'xla'`, `'xla:N'` and `torch.device('xla', N)` given as a device mean lazyxla's
# `jax:N`. PyTorch owns the `xla` device type, so a tensor can never *be* on it (see DESIGN: Device
# identity); the spelling is translated where it enters: a boxed fallback on the XLA dispatch key
# (factories such as `torch.rand(3, device='xla')` reach it through BackendSelect) rewrites the
# device arguments and re-dispatches, and `Tensor.to` / `torch.tensor` / `torch.as_tensor`, which
# check the device in C++ before any dispatch, are wrapped to rewrite it first. Code that never
# spells 'xla' pays nothing per op (the fallback is never reached); each `.to()` call pays one
# Python wrapper call. `t.device.type` stays `'jax'`: comparisons with 'xla' remain the one
# documented difference.


def _is_xla(v: Any) -> bool:
    if isinstance(v, torch.device):
        return v.type == "xla"
    return isinstance(v, str) and (v == "xla" or v.startswith("xla:"))


def _jax_device(v: Any) -> Any:
    """`v` with an 'xla' device spelling replaced by lazyxla's device of the same index."""
    if isinstance(v, torch.device):
        return api.device(v.index or 0) if v.type == "xla" else v
    if isinstance(v, str) and _is_xla(v):
        _, _, index = v.partition(":")
        try:
            return api.device(int(index) if index else 0)
        except ValueError:
            raise RuntimeError(
                f"Invalid device string: {v!r} (expected 'xla' or 'xla:N')"
            ) from None
    if isinstance(v, list | tuple):
        return type(v)(_jax_device(x) for x in v)
    return v


def _xla_key_fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    args = tuple(_jax_device(a) for a in args)
    kwargs = {k: _jax_device(v) for k, v in kwargs.items()}
    return op(*args, **kwargs)


def _wrap_device_arg(fn: Any, position: int) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if len(args) > position and _is_xla(args[position]):
            args = (*args[:position], _jax_device(args[position]), *args[position + 1 :])
        if "device" in kwargs and _is_xla(kwargs["device"]):
            kwargs["device"] = _jax_device(kwargs["device"])
        return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(fn, "__name__", "wrapper")
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    return wrapper


_xla_spelling: dict[str, Any] = {}

# Factories with a composite kernel: the XLA key finds that kernel (which then allocates on 'xla'
# and fills through an `out=` overload) instead of the fallback, so each gets its own XLA kernel.
_FACTORIES = (
    "arange", "full", "zeros", "ones", "rand", "randn", "randint", "randperm", "linspace",
    "logspace", "eye", "empty", "empty_strided", "scalar_tensor", "normal", "bernoulli",
    "tril_indices", "triu_indices", "hann_window", "hamming_window", "bartlett_window",
    "blackman_window", "kaiser_window", "new_empty", "new_zeros", "new_ones", "new_full",
)  # fmt: skip


def _redispatch(op: Any) -> Any:
    return lambda *args, **kwargs: _xla_key_fallback(op, *args, **kwargs)


def _install_xla_spelling() -> None:
    if _xla_spelling:
        return
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(_xla_key_fallback, dispatch_key="XLA", with_keyset=False)
    aten_lib = torch.library.Library("aten", "IMPL")
    for name in _FACTORIES:
        packet = getattr(torch.ops.aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            op = getattr(packet, overload)
            if any(a.name == "device" for a in op._schema.arguments) and not op._schema.is_mutable:
                aten_lib.impl(op, _redispatch(op), "XLA")
    _xla_spelling["aten_lib"] = aten_lib
    _xla_spelling["lib"] = lib
    for owner, name, position in (
        (torch.Tensor, "to", 1),
        (torch.nn.Module, "to", 1),
        (torch, "tensor", 99),
        (torch, "as_tensor", 99),
    ):
        original = getattr(owner, name)
        _xla_spelling[name] = (owner, original)
        setattr(owner, name, _wrap_device_arg(original, position))


def _patch_gru() -> None:
    """`torch.nn.GRU` becomes the scan-based GRU, as `import torch_xla` makes it."""
    from .gru import GRU

    if torch.nn.GRU is not GRU:
        GRU._orig = torch.nn.GRU
        torch.nn.GRU = GRU


def _unpatch_gru() -> None:
    from .gru import GRU

    if torch.nn.GRU is GRU and GRU._orig is not None:
        torch.nn.GRU = GRU._orig


_clip_grad_norm_orig: list[Any] = []


def _patch_clip_grad_norm() -> None:
    """`nn.utils.clip_grad_norm_` as `import torch_xla` patches it: with no gradients among lazy
    parameters the (zero) norm is a lazy tensor, not a CPU one; otherwise torch's own."""
    if _clip_grad_norm_orig:
        return
    original = torch.nn.utils.clip_grad_norm_

    def clip_grad_norm_(
        parameters: Any,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
        foreach: bool | None = None,
    ) -> torch.Tensor:
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        device = api.device()
        if all(p.grad is None for p in params) and any(p.device == device for p in params):
            return torch.tensor(0.0).to(device)
        return original(params, max_norm, norm_type, error_if_nonfinite, foreach)

    clip_grad_norm_._orig = original  # type: ignore[attr-defined]
    _clip_grad_norm_orig.append(original)
    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_


def _unpatch_clip_grad_norm() -> None:
    if _clip_grad_norm_orig:
        torch.nn.utils.clip_grad_norm_ = _clip_grad_norm_orig.pop()


def _uninstall_xla_spelling() -> None:
    for key in ("lib", "aten_lib"):
        lib = _xla_spelling.pop(key, None)
        if lib is not None:
            lib._destroy()
    for name in list(_xla_spelling):
        owner, original = _xla_spelling.pop(name)
        setattr(owner, name, original)


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
    _install_xla_spelling()
    _patch_gru()
    _patch_clip_grad_norm()
    # torch.compile(backend="openxla") is PyTorch's own backend: it imports
    # torch_xla.core.dynamo_bridge, which the alias resolves to lazyxla's trace-once bridge.


def uninstall() -> None:
    """Remove the alias and forget every `torch_xla` module it made."""
    global _finder
    if _finder is None:
        return
    sys.meta_path.remove(_finder)
    _finder = None
    _uninstall_xla_spelling()
    _unpatch_gru()
    _unpatch_clip_grad_norm()
    for name in [n for n in sys.modules if n == "torch_xla" or n.startswith("torch_xla.")]:
        del sys.modules[name]


def is_installed() -> bool:
    return _finder is not None
