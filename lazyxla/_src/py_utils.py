"""The rest of torch_xla's `torch_xla.utils.utils`: nested-structure walks, timing, temporary
folders and synthetic data (`SampleGenerator`, `getenv_as` and `check_env_flag` are in
env_utils.py).

The nested walks are torch_xla's: they descend into dicts (keys and values), lists, tuples, sets,
`DataWrapper`s and the `__dict__` of other objects, visit each object once (by identity), and the
rewriting walk returns lists where it found tuples (it registers the new container before filling
it, so cycles and shared sub-structures map to one copy).
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent import futures
from typing import Any

import torch


class Cleaner:
    """Calls `func` when collected."""

    def __init__(self, func: Callable[[], Any]) -> None:
        self.func = func

    def __del__(self) -> None:
        self.func()


class LazyProperty:
    """`value` is `gen_fn()`, computed on first access."""

    def __init__(self, gen_fn: Callable[[], Any]) -> None:
        self._gen_fn: Callable[[], Any] | None = gen_fn
        self._value: Any = None

    @property
    def value(self) -> Any:
        if self._gen_fn is not None:
            self._value, self._gen_fn = self._gen_fn(), None
        return self._value


class TmpFolder:
    """A temporary directory (`name`), removed when this object is collected."""

    def __init__(self) -> None:
        self.name = tempfile.mkdtemp()
        name = self.name
        self.cleaner = Cleaner(lambda: shutil.rmtree(name, ignore_errors=True))


class FnDataGenerator:
    """`count` batches of `(data, func(data))` with `data = gen_tensor(batch_size, *dims)`."""

    def __init__(
        self,
        func: Callable[[torch.Tensor], Any],
        batch_size: int,
        gen_tensor: Callable[..., torch.Tensor],
        dims: Iterable[int] | None = None,
        count: int = 1,
    ) -> None:
        self._func = func
        self._batch_size = batch_size
        self._gen_tensor = gen_tensor
        self._dims = list(dims) if dims else [1]
        self._count = count
        self._emitted = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> FnDataGenerator:
        return FnDataGenerator(
            self._func, self._batch_size, self._gen_tensor, dims=self._dims, count=self._count
        )

    def __next__(self) -> tuple[Any, Any]:
        return self.next()

    def next(self) -> tuple[Any, Any]:
        if self._emitted >= self._count:
            raise StopIteration
        data = self._gen_tensor(self._batch_size, *self._dims)
        self._emitted += 1
        return data, self._func(data)


class ToXlaTensorArena:
    """torch_xla's `xm.ToXlaTensorArena`: `transform(data)` collects every `x` in `data` with
    `select_fn(x)`, converts them all in one call `convert_fn(list)` (one transfer, one graph),
    and returns `data` rewritten with the converted values (as `for_each_instance_rewrite`)."""

    def __init__(
        self,
        convert_fn: Callable[[list[Any]], list[Any]],
        select_fn: Callable[[Any], bool],
    ) -> None:
        self._convert_fn = convert_fn
        self._select_fn = select_fn

    def transform(self, inputs: Any) -> Any:
        found: list[Any] = []
        for_each_instance(inputs, self._select_fn, found.append)
        converted = list(self._convert_fn(found)) if found else []
        if len(converted) != len(found):
            raise ValueError(
                f"ToXlaTensorArena: convert_fn returned {len(converted)} values for "
                f"{len(found)} inputs"
            )
        by_id = {id(x): c for x, c in zip(found, converted)}
        return for_each_instance_rewrite(inputs, self._select_fn, lambda x: by_id[id(x)])


class DataWrapper:
    """Base class for objects that hold tensors to send to a device: `get_tensors()` lists them,
    `from_tensors(tensors)` builds the object back from their device copies (same order)."""

    def get_tensors(self) -> list[torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} must implement get_tensors()")

    def from_tensors(self, tensors: list[torch.Tensor]) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement from_tensors(tensors)")


def as_list(t: Any) -> Any:
    """`t` itself if it is a list or tuple, else `[t]`."""
    return t if isinstance(t, (tuple, list)) else [t]


def _visit(
    value: Any, select_fn: Callable[[Any], bool], fn: Callable[[Any], Any], seen: set
) -> None:
    if id(value) in seen:
        return
    seen.add(id(value))
    if select_fn(value):
        fn(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _visit(k, select_fn, fn, seen)
            _visit(v, select_fn, fn, seen)
    elif isinstance(value, (list, tuple, set)):
        for x in value:
            _visit(x, select_fn, fn, seen)
    elif isinstance(value, DataWrapper):
        for x in value.get_tensors():
            _visit(x, select_fn, fn, seen)
    elif hasattr(value, "__dict__"):
        for v in list(value.__dict__.values()):
            _visit(v, select_fn, fn, seen)


def for_each_instance(
    value: Any, select_fn: Callable[[Any], bool], fn: Callable[[Any], Any]
) -> None:
    """Call `fn(x)` on every object `x` inside `value` for which `select_fn(x)` (once each)."""
    _visit(value, select_fn, fn, set())


def _rewrite(
    value: Any, select_fn: Callable[[Any], bool], fn: Callable[[Any], Any], done: dict
) -> Any:
    if id(value) in done:
        return done[id(value)]
    result: Any = value
    if select_fn(value):
        result = fn(value)
        done[id(value)] = result
    elif isinstance(value, dict):
        result = done[id(value)] = {}
        for k, v in value.items():
            key = _rewrite(k, select_fn, fn, done)  # the key first: `fn` sees torch_xla's order
            result[key] = _rewrite(v, select_fn, fn, done)
    elif isinstance(value, set):
        result = done[id(value)] = set()
        for x in value:
            result.add(_rewrite(x, select_fn, fn, done))
    elif isinstance(value, (list, tuple)):  # tuples become lists, as in torch_xla
        result = done[id(value)] = []
        result.extend(_rewrite(x, select_fn, fn, done) for x in value)
    elif isinstance(value, DataWrapper):
        result = value.from_tensors([_rewrite(x, select_fn, fn, done) for x in value.get_tensors()])
        done[id(value)] = result
    elif hasattr(value, "__dict__"):
        result = done[id(value)] = copy.copy(value)
        for k, v in list(result.__dict__.items()):
            result.__dict__[k] = _rewrite(v, select_fn, fn, done)
    else:
        done[id(value)] = result
    return result


def for_each_instance_rewrite(
    value: Any, select_fn: Callable[[Any], bool], fn: Callable[[Any], Any]
) -> Any:
    """A copy of `value` with every `x` for which `select_fn(x)` replaced by `fn(x)`."""
    return _rewrite(value, select_fn, fn, {})


def shape(inputs: Any) -> list[int]:
    """The shape of a nested list/tuple structure (all members must have one shape)."""
    if not isinstance(inputs, (list, tuple)):
        return []
    shapes = [shape(x) for x in inputs]
    if any(s != shapes[0] for s in shapes):
        raise ValueError(f"nested sequences of different shapes: {shapes}")
    return [len(inputs)] + (shapes[0] if shapes else [])


def flatten_nested_tuple(inputs: Any) -> tuple:
    """The leaves of a nested list/tuple structure, in order."""
    if not isinstance(inputs, (list, tuple)):
        return (inputs,)
    return tuple(leaf for x in inputs for leaf in flatten_nested_tuple(x))


def list_copy_append(ilist: Iterable[Any], item: Any) -> list:
    return [*ilist, item]


def null_print(*args: Any, **kwargs: Any) -> None:
    return None


def eprint(*args: Any, **kwargs: Any) -> None:
    print(*args, file=sys.stderr, **kwargs)


def get_print_fn(debug: Any = None) -> Callable[..., None]:
    """`eprint` if `debug` (default: the `DEBUG` environment variable) is set, else `null_print`."""
    if debug is None:
        debug = int(os.environ.get("DEBUG", "0"))
    return eprint if debug else null_print


def timed(
    fn: Callable[[], Any], msg: str = "", printfn: Callable[..., None] | None = eprint
) -> Any:
    """`fn()`, printing `msg` and the wall time in ms (`printfn=None`: as `get_print_fn()`)."""
    printfn = printfn or get_print_fn()
    start = time.time()
    result = fn()
    printfn(f"{msg}{1000.0 * (time.time() - start):.3f}ms")
    return result


class TimedScope:
    """A `with` block that prints `msg` and its wall time in ms on exit (unless `set_error`)."""

    def __init__(self, msg: str = "", printfn: Callable[..., None] | None = eprint) -> None:
        self._msg = msg
        self._printfn = printfn or get_print_fn()
        self._error: Any = None
        self._start = 0.0

    def __enter__(self) -> TimedScope:
        self._start = time.time()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._error is None:
            self._printfn(f"{self._msg}{1000.0 * (time.time() - self._start):.3f}ms")

    def set_error(self, error: Any) -> None:
        self._error = error


def get_free_tcp_ports(n: int = 1) -> list[int]:
    """`n` TCP ports free at the time of the call."""
    ports = []
    for _ in range(n):
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
            s.bind(("", 0))
            ports.append(s.getsockname()[1])
    return ports


def parallel_work(num_workers: int, fn: Callable[..., Any], *args: Iterable[Any]) -> list:
    """`fn` over `zip(*args)` on `num_workers` threads; the results in order (re-raises)."""
    with futures.ThreadPoolExecutor(max_workers=num_workers) as executor:
        return list(executor.map(fn, *args))
