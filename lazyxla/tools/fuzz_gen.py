"""The view fuzzer's programs drawn at random by Hypothesis (`programs()`), each op drawn for the
tensors the eager side actually holds, and one deterministic program per op kind
(`KIND_EXAMPLES`, `with_autograd`). See fuzz_views.py, the entry point."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .fuzz_exec import (
    COPY_KINDS,
    CPU,
    SYNC_KINDS,
    VIEW_KINDS,
    WRITE_KINDS,
    Op,
    Program,
    _compiled,
    _ptr,
    _quiet,
    exec_op,
    make_env,
)

# --- generation -----------------------------------------------------------------------------------

_DTYPE_VIEWS = {
    torch.float32: (
        torch.int32,
        torch.int16,
        torch.uint8,
        torch.int64,
        torch.complex64,
        torch.float16,
        torch.float32,
    ),
    torch.int32: (torch.float32, torch.int16, torch.uint8, torch.int64, torch.int32),
    torch.complex64: (torch.float32, torch.int32, torch.float64, torch.complex64),
}


def _fmt(v: Any) -> str:
    if isinstance(v, torch.dtype):
        return str(v)
    return repr(v)


def _args(*vs: Any) -> str:
    return ", ".join(_fmt(v) for v in vs)


def _shape_args(shape: tuple[int, ...]) -> str:
    return _args(*shape) if shape else "()"


def _input_expr(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    n = 1
    for s in shape:
        n *= s
    if dtype == torch.complex64:
        src = f"torch.arange({2 * n}.).view(torch.complex64)"
    elif dtype == torch.int32:
        src = f"torch.arange({n}, dtype=torch.int32)"
    else:
        src = f"torch.arange({n}.)"
    if shape != (n,):
        src += f".reshape({_shape_args(shape)})"
    return src + ".to(dev, copy=True)"


def _storage_elems(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes() // t.element_size()


def _offsets(t: torch.Tensor) -> list[int]:
    """Byte offsets (in the storage) of every byte `t` covers."""
    if t.numel() == 0:
        return []
    base = torch.arange(_storage_elems(t))
    idx = torch.as_strided(base, t.shape, t.stride(), t.storage_offset()).reshape(-1).tolist()
    sz = t.element_size()
    return [i * sz + b for i in idx for b in range(sz)]


def _internal_overlap(t: torch.Tensor) -> bool:
    offs = _offsets(t)
    return len(set(offs)) < len(offs)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.element_size() == b.element_size()
    )


def _complex_pairs(t: torch.Tensor) -> bool:
    """Whether `torch.view_as_complex(t)` is allowed (float32, pairs of adjacent elements)."""
    return (
        t.dtype == torch.float32
        and t.dim() > 0
        and t.shape[-1] == 2
        and t.stride(-1) == 1
        and t.storage_offset() % 2 == 0
        and all(st % 2 == 0 for st in t.stride()[:-1])
    )


def _stride0(t: torch.Tensor) -> bool:
    return any(st == 0 and sz > 1 for st, sz in zip(t.stride(), t.shape))


def _broadcastable(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    if len(src) > len(dst):
        return False
    return all(s in (1, d) for s, d in zip(reversed(src), reversed(dst)))


class _Gen:
    """The eager side of a program being drawn: its tensors, so each op is drawn for them."""

    def __init__(self, draw: Callable[..., Any], st: Any, autograd: bool) -> None:
        self.draw, self.st, self.autograd = draw, st, autograd
        self.env = make_env(CPU)
        self.names: list[str] = []
        self.ops: list[Op] = []
        self.counter = 0
        self.stopped = False

    # -- drawing helpers --
    def int(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi))

    def size(self, hi: int) -> int:
        """A length in [1, hi], and 0 one time in eight (empty tensors are an edge case, not the
        common one)."""
        if hi < 1 or self.int(0, 7) == 7:
            return 0
        return self.int(1, hi)

    def bool(self) -> bool:
        return self.draw(self.st.booleans())

    def choice(self, seq: Any) -> Any:
        return self.draw(self.st.sampled_from(seq))

    def pick(self, names: list[str] | None = None) -> str:
        """A live tensor, by default the most recent one (chains of views shrink well)."""
        names = self.names if names is None else names
        return names[-1 - self.int(0, len(names) - 1)]

    def dim(self, t: torch.Tensor, extra: int = 0) -> int:
        n = max(t.dim() + extra, 1)
        return self.int(-n, n - 1)

    def fresh(self) -> str:
        name = f"t{self.counter}"
        self.counter += 1
        return name

    def tensor(self, name: str) -> torch.Tensor:
        return self.env[name]

    # -- shapes --
    def factor_shape(self, numel: int) -> tuple[int, ...]:
        if numel == 0:
            return self.choice([(0,), (2, 0), (0, 3)])
        k = self.int(1, 3)
        shape, rest = [], numel
        for _ in range(k - 1):
            divs = [d for d in range(1, rest + 1) if rest % d == 0]
            d = self.choice(divs)
            shape.append(d)
            rest //= d
        shape.append(rest)
        if self.bool():
            shape[self.int(0, len(shape) - 1)] = -1
        return tuple(shape)

    # -- executing on the eager side --
    def try_op(self, op: Op, dry: Callable[[], bool] | None = None) -> bool:
        """Run `op` on eager; keep it if it succeeds, or rarely if it raises (then stop)."""
        if dry is not None and not dry():
            return False
        err = exec_op(op, self.env)
        if err is not None:
            if self.int(0, 7) != 7:
                return False  # rejected: an erroring op raised before mutating anything
            self.ops.append(op)
            self.stopped = True
            return True
        self.ops.append(op)
        self.names.extend(op.outs)
        return True

    def bind(self, expr: str) -> bool:
        """A view/copy: evaluate once to learn its output count, then record `outs = expr`."""
        try:
            val = eval(_compiled(expr, "eval"), self.env)
        except Exception:  # noqa: BLE001
            if self.int(0, 7) != 7:
                return False
            self.ops.append(Op((self.fresh(),), expr))
            self.stopped = True
            return True
        if isinstance(val, torch.Tensor):
            outs = (self.fresh(),)
            self.env[outs[0]] = val
        else:
            val = tuple(val)
            if not val:
                return False
            outs = tuple(self.fresh() for _ in val)
            self.env.update(zip(outs, val))
        self.ops.append(Op(outs, expr))
        self.names.extend(outs)
        return True

    def write(self, target: str, expr: str, operand: str | None, kind: str) -> bool:
        """An in-place write, unless eager's result would be undefined (overlapping memory)."""
        t = self.tensor(target)
        op = Op((), expr)
        if _internal_overlap(t):
            # Eager allows fill_, zero_, masked_fill_ and index_put_ into overlapping memory; with
            # one value written everywhere the result is defined. add_/mul_/copy_ raise on an
            # expanded (stride 0) target, and otherwise write overlapping elements in loop order.
            one_value = kind in ("fill_", "zero_", "masked_fill_") or (
                kind == "index_put_" and "accumulate=False" in expr and ", torch.tensor(" in expr
            )
            if not one_value and not (kind in ("add_", "mul_", "copy_") and _stride0(t)):
                return False
        if operand is not None:
            o = self.tensor(operand)
            if (
                _ptr(o) == _ptr(t)
                and o.numel()
                and set(_offsets(o)) & set(_offsets(t))
                and not _same_layout(o, t)
            ):
                # Eager raises for a partial overlap it can see; otherwise its result is undefined.
                return self.try_op(op, dry=lambda: self._dry_raises(op, target, operand))
        return self.try_op(op)

    def _dry_raises(self, op: Op, target: str, operand: str) -> bool:
        t = self.tensor(target)
        clone = torch.UntypedStorage(t.untyped_storage().nbytes())
        clone.copy_(t.untyped_storage())
        env = dict(self.env)
        with torch.no_grad():
            for n in (target, operand):
                x = self.tensor(n)
                env[n] = torch.empty(0, dtype=x.dtype).set_(
                    clone, x.storage_offset(), x.shape, x.stride()
                )
            return exec_op(op, env) is not None


def _gen_view(g: _Gen, kind: str) -> bool:
    if kind in ("real", "imag", "view_as_real"):
        cplx = [n for n in g.names if g.tensor(n).is_complex()]
        name = g.pick(cplx) if cplx and g.int(0, 3) else g.pick()
    elif kind == "view_as_complex":
        pairs = [n for n in g.names if _complex_pairs(g.tensor(n))]
        # Otherwise any tensor, for eager's errors, but a float16 one: eager views it as
        # complex32, a dtype XLA has no type for, which lazyxla refuses by design (a TypeError
        # naming the dtypes it holds).
        others = [n for n in g.names if g.tensor(n).dtype != torch.float16]
        if pairs and g.int(0, 3):
            name = g.pick(pairs)
        elif others:
            name = g.pick(others)
        else:
            return False
    else:
        name = g.pick()
    x = g.tensor(name)
    nd, sh = x.dim(), tuple(x.shape)
    if kind == "t":
        return g.bind(f"{name}.t()")
    if kind == "transpose":
        return g.bind(f"{name}.transpose({_args(g.dim(x), g.dim(x))})")
    if kind == "permute":
        perm = g.draw(g.st.permutations(range(nd)))
        return g.bind(f"{name}.permute({_shape_args(tuple(perm))})")
    if kind in ("slice", "narrow", "select", "unfold", "split", "chunk", "unbind", "squeeze"):
        d = g.dim(x)
        n = sh[d] if nd else 1
        if kind == "slice":
            start = g.int(-n, n) if g.bool() else None
            stop = g.int(-n, n) if g.bool() else None
            step = g.int(1, 3)
            s = f"{'' if start is None else start}:{'' if stop is None else stop}"
            s += f":{step}" if step != 1 else ""
            idx = ", ".join([":"] * (d % max(nd, 1)) + [s])
            return g.bind(f"{name}[{idx}]")
        if kind == "narrow":
            start = g.int(0, max(n - 1, 0))
            return g.bind(f"{name}.narrow({_args(d, start, g.size(n - start))})")
        if kind == "select":
            return g.bind(f"{name}.select({_args(d, g.int(-n, max(n - 1, 0)))})")
        if kind == "unfold":
            return g.bind(f"{name}.unfold({_args(d, g.size(n), g.int(1, 3))})")
        if kind == "split":
            if g.bool() and n:
                sizes, rest = [], n
                while rest:
                    sizes.append(g.int(1, rest))
                    rest -= sizes[-1]
                return g.bind(f"{name}.split({sizes!r}, {d})")
            return g.bind(f"{name}.split({_args(g.int(1, max(n, 1)), d)})")
        if kind == "chunk":
            return g.bind(f"{name}.chunk({_args(g.int(1, 4), d)})")
        if kind == "unbind":
            return g.bind(f"{name}.unbind({d})")
        return g.bind(f"{name}.squeeze({d})" if g.bool() else f"{name}.squeeze()")
    if kind == "unsqueeze":
        return g.bind(f"{name}.unsqueeze({g.dim(x, extra=1)})")
    if kind == "diagonal":
        return g.bind(f"{name}.diagonal({_args(g.int(-2, 2), g.dim(x), g.dim(x))})")
    if kind == "expand":
        size = [g.int(1, 3) for _ in range(g.int(0, 1))]
        for s in sh:
            size.append((g.int(1, 3) if s == 1 else s) if g.bool() else -1)
        return g.bind(f"{name}.expand({_args(*size) if size else '[]'})")
    if kind == "view":
        return g.bind(f"{name}.view({_shape_args(g.factor_shape(x.numel()))})")
    if kind == "view_dtype":
        return g.bind(f"{name}.view({g.choice(_DTYPE_VIEWS.get(x.dtype, (x.dtype,)))})")
    if kind == "as_strided":
        avail = _storage_elems(x)
        k = g.int(0, 3)
        size = [g.int(1, 3) for _ in range(k)]
        order = g.draw(g.st.permutations(range(k)))
        stride = [0] * k
        run = g.int(1, 2)
        for d in reversed(order):
            stride[d] = run
            run *= size[d] * g.int(1, 2)
        if k and g.int(0, 3) == 0:
            stride[g.int(0, k - 1)] = 0  # an expanded (self-overlapping) layout
        span = sum((s - 1) * st for s, st in zip(size, stride))
        if span >= avail:
            return False
        offset = g.int(0, avail - 1 - span)
        return g.bind(f"{name}.as_strided({tuple(size)!r}, {tuple(stride)!r}, {offset})")
    if kind in ("real", "imag"):
        return g.bind(f"{name}.{kind}")
    if kind == "view_as_real":
        return g.bind(f"torch.view_as_real({name})")
    if kind == "view_as_complex":
        return g.bind(f"torch.view_as_complex({name})")
    raise AssertionError(kind)


def _gen_copy(g: _Gen, kind: str) -> bool:
    if kind == "input":
        shape = tuple(g.draw(g.st.lists(g.st.integers(1, 4), max_size=3)))
        dtype = g.choice([torch.float32, torch.complex64, torch.int32])
        return g.bind(_input_expr(shape, dtype))
    name = g.pick()
    x = g.tensor(name)
    if kind == "contiguous":
        return g.bind(f"{name}.contiguous()")
    if kind == "clone":
        return g.bind(f"{name}.clone()")
    if kind == "reshape":
        return g.bind(f"{name}.reshape({_shape_args(g.factor_shape(x.numel()))})")
    if kind == "flatten":
        if g.bool() or x.dim() < 2:
            return g.bind(f"{name}.flatten()")
        a, b = sorted((g.dim(x), g.dim(x)), key=lambda d: d % x.dim())
        return g.bind(f"{name}.flatten({a}, {b})")
    raise AssertionError(kind)


def _gen_write(g: _Gen, kind: str) -> bool:
    target = g.pick()
    x = g.tensor(target)
    sh, dt = tuple(x.shape), x.dtype
    if kind in ("add_", "mul_", "copy_"):
        fits = [n for n in g.names if _broadcastable(tuple(g.tensor(n).shape), sh)]
        if kind == "mul_" and dt.is_complex:
            # A complex product of two tensors is not rounded once: eager's vectorized kernel and
            # XLA's round (ac - bd) differently, by a few ulps of the product (with operands
            # reinterpreted from int bits, below 2**24 too), and an int view of the result then
            # shows it. Not a view's effect: complex targets are multiplied by numbers only.
            fits = []
        if kind == "copy_" or (fits and g.bool()):
            if not fits:
                return False
            operand = g.pick(fits)
            return g.write(target, f"{target}.{kind}({operand})", operand, kind)
        if kind == "add_":
            v = g.choice([1, 2, -1, 3, -2, 0.5])
        else:
            v = g.choice([2, -1, 3, 0, 0.5])
        return g.write(target, f"{target}.{kind}({v!r})", None, kind)
    if kind == "zero_":
        return g.write(target, f"{target}.zero_()", None, kind)
    if kind == "fill_":
        return g.write(target, f"{target}.fill_({g.int(-3, 9)})", None, kind)
    if kind == "index_put_":
        n = sh[0] if sh else 1
        accumulate = g.bool()
        if accumulate:
            idx = [g.int(-n, n - 1) for _ in range(g.int(1, 3))] if n else [0]
        else:
            pool = list(range(n)) or [0]
            idx = list(g.draw(g.st.permutations(pool)))[: g.int(1, len(pool))]
        rest = sh[1:]
        if g.bool():
            vals = f"torch.tensor(7, dtype={dt}).to(dev)"
        else:
            m = len(idx)
            for s in rest:
                m *= s
            vals = f"torch.arange({m}).reshape({_shape_args((len(idx), *rest))}).to({dt}).to(dev)"
        index = f"(torch.tensor({idx!r}).to(dev),)"
        return g.write(
            target, f"{target}.index_put_({index}, {vals}, accumulate={accumulate})", None, kind
        )
    if kind == "masked_fill_":
        mshape = sh[-1:] if sh and g.bool() else sh
        m = 1
        for s in mshape:
            m *= s
        r = g.int(0, 2)
        mask = f"(torch.arange({m}) % 3 == {r})"
        if mshape != (m,):
            mask += f".reshape({_shape_args(mshape)})"
        return g.write(target, f"{target}.masked_fill_({mask}.to(dev), {g.int(-3, 9)})", None, kind)
    raise AssertionError(kind)


def _gen_sync(g: _Gen, kind: str) -> bool:
    if kind == "sync":
        g.ops.append(Op((), "sync()"))
        return True
    g.ops.append(Op((), f"{g.pick()}.detach().cpu()"))
    return True


# Roles are drawn first (repeated entries weight them), then a kind within the role; Hypothesis
# shrinks toward the first entries.
_VIEW = ("view", VIEW_KINDS, _gen_view)
_WRITE = ("write", WRITE_KINDS, _gen_write)
_COPY = ("copy", COPY_KINDS[:-1], _gen_copy)
_SYNC = ("sync", SYNC_KINDS, _gen_sync)
_INPUT = ("input", ("input",), _gen_copy)
_ROLES = (*(_VIEW, _WRITE) * 5, _VIEW, _COPY, _COPY, _SYNC, _SYNC, _INPUT)

# The first input's rank (Hypothesis shrinks toward the first entry: 1-D repros first).
_RANKS = (1, 2, 3, 2, 3, 2, 0)


def programs(max_ops: int = 12, autograd: bool | None = None) -> Any:
    """A Hypothesis strategy for programs of at most `max_ops` ops (after the input)."""
    from hypothesis import strategies as st

    @st.composite
    def strategy(draw: Callable[..., Any]) -> Program:
        with _quiet():
            return _draw_program(draw, st, max_ops, autograd)

    return strategy()


def _draw_program(
    draw: Callable[..., Any], st: Any, max_ops: int, autograd: bool | None
) -> Program:
    grad = draw(st.booleans()) if autograd is None else autograd
    g = _Gen(draw, st, grad)
    shape = tuple(draw(st.integers(1, 4)) for _ in range(draw(st.sampled_from(_RANKS))))
    dtype = draw(st.sampled_from([torch.float32, torch.complex64, torch.int32]))
    if grad and dtype == torch.int32:
        dtype = torch.float32
    g.bind(_input_expr(shape, dtype) + (".requires_grad_()" if grad else ""))
    if grad and draw(st.booleans()):
        g.bind("t0.clone()")  # a non-leaf to write into (writes into a grad leaf raise)
    for _ in range(draw(st.integers(1, max_ops))):
        for _attempt in range(4):
            role = draw(st.sampled_from(_ROLES))
            if role[2](g, draw(st.sampled_from(role[1]))):
                break
        if g.stopped:
            break
    if grad and not g.stopped:
        env = g.env
        ts = [
            n
            for n in g.names
            if isinstance(env[n], torch.Tensor)
            and env[n].requires_grad
            and (env[n].is_floating_point() or env[n].is_complex())
        ]
        if ts:
            g.ops.append(Op((), f"backward({', '.join(ts)})"))
    return Program(tuple(g.ops))


# --- one deterministic program per op kind ------------------------------------------------------
# Each makes the kind's result, writes through it or next to it, syncs and reads, so every kind is
# covered whatever the random programs draw. `with_autograd` derives a variant of each that starts
# from a leaf requiring grad and ends in `backward`.

_F34 = "t0 = torch.arange(12.).reshape(3, 4).to(dev, copy=True)"
_F234 = "t0 = torch.arange(24.).reshape(2, 3, 4).to(dev, copy=True)"
_C34 = "t0 = torch.arange(24.).view(torch.complex64).reshape(3, 4).to(dev, copy=True)"


def _view_example(make: str, first: str = _F34, out: str = "t1") -> str:
    """`make` a view, write through it, sync, write the base, read the view."""
    return "\n".join(
        [first, make, f"{out}.mul_(2)", "sync()", "t0.add_(1)", f"{out}.detach().cpu()"]
    )


def _write_example(write: str, *before: str) -> str:
    """A write into a strided view (t1: every other column) beside another view (t2)."""
    return "\n".join(
        [
            _F34,
            "t1 = t0[:, 1::2]",
            "t2 = t0[:, ::2]",
            *before,
            write,
            "sync()",
            "t2.add_(1)",
            "t1.detach().cpu()",
        ]
    )


def _copy_example(make: str) -> str:
    """A copy of a transposed view must not alias it."""
    return "\n".join(
        [
            _F34,
            "t1 = t0.t()",
            make,
            "t2.mul_(2)",
            "sync()",
            "t0.add_(1)",
            "t1.mul_(-1)",
            "t2.detach().cpu()",
        ]
    )


KIND_EXAMPLES: dict[str, str] = {
    "t": _view_example("t1 = t0.t()"),
    "transpose": _view_example("t1 = t0.transpose(0, 2)", _F234),
    "permute": _view_example("t1 = t0.permute(2, 0, 1)", _F234),
    "slice": _view_example("t1 = t0[1:, ::3]"),
    "narrow": _view_example("t1 = t0.narrow(1, 1, 2)"),
    "diagonal": _view_example("t1 = t0.diagonal(1)"),
    "unfold": _view_example("t1 = t0.unfold(1, 2, 2)", _F234),
    "expand": "\n".join(
        [
            "t0 = torch.arange(3.).reshape(3, 1).to(dev, copy=True)",
            "t1 = t0.expand(2, 3, 4)",
            "t0.add_(1)",
            "sync()",
            "t1.detach().cpu()",
            "t1.fill_(7)",
            "t1.mul_(2)",  # eager: more than one element refers to a single memory location
        ]
    ),
    "view": "\n".join(
        [_F34, "t1 = t0.view(2, 6)", "t1.mul_(2)", "sync()", "t2 = t0.t()", "t3 = t2.view(12)"]
    ),
    # The dtype-reinterpreting views start from a view at a storage offset (which they rescale).
    "view_dtype": _view_example("t2 = t1.view(torch.int16)", _F34 + "\nt1 = t0[1:]", "t2"),
    "as_strided": "\n".join(
        [
            _F34,
            "t1 = t0[1:]",
            "t2 = t1.as_strided((2, 2), (1, 4), 1)",
            "t2.mul_(2)",
            "sync()",
            "t0.add_(1)",
            "t2.detach().cpu()",
        ]
    ),
    "unbind": _view_example("t1, t2, t3 = t0.unbind(0)", out="t2"),
    "split": _view_example("t1, t2 = t0.split([1, 3], 1)", out="t2"),
    "chunk": _view_example("t1, t2 = t0.chunk(2, 1)", out="t2"),
    "select": _view_example("t1 = t0.select(1, 2)"),
    "squeeze": _view_example(
        "t1 = t0.squeeze(1)", "t0 = torch.arange(12.).reshape(3, 1, 4).to(dev, copy=True)"
    ),
    "unsqueeze": _view_example("t1 = t0.unsqueeze(1)"),
    "real": _view_example("t2 = t1.real", _C34 + "\nt1 = t0[1:]", "t2"),
    "imag": _view_example("t2 = t1.imag", _C34 + "\nt1 = t0[1:]", "t2"),
    "view_as_real": _view_example("t2 = torch.view_as_real(t1)", _C34 + "\nt1 = t0[1:]", "t2"),
    "view_as_complex": _view_example(
        "t2 = torch.view_as_complex(t1)",
        "t0 = torch.arange(12.).reshape(3, 2, 2).to(dev, copy=True)\nt1 = t0[1:]",
        "t2",
    ),
    "contiguous": _copy_example("t2 = t1.contiguous()"),
    "clone": _copy_example("t2 = t1.clone()"),
    "reshape": _copy_example("t2 = t1.reshape(2, 6)"),
    "flatten": _copy_example("t2 = t1.flatten()"),
    "input": "\n".join(
        [
            _F34,
            "t1 = torch.arange(4.).to(dev, copy=True)",
            "t0.copy_(t1)",
            "t1.add_(1)",
            "t0.detach().cpu()",
        ]
    ),
    "add_": _write_example("t1.add_(t2)"),
    "mul_": _write_example("t1.mul_(t3)", "t3 = torch.arange(2.).to(dev, copy=True)"),
    "zero_": _write_example("t1.zero_()"),
    "fill_": _write_example("t1.fill_(-3)"),
    "copy_": _write_example("t1.copy_(t2)"),
    "index_put_": _write_example(
        "t1.index_put_((torch.tensor([2, 0]).to(dev),), torch.tensor(7.).to(dev), accumulate=True)"
    ),
    "masked_fill_": _write_example("t1.masked_fill_((torch.arange(2) % 2 == 0).to(dev), -5)"),
    "sync": "\n".join([_F34, "t1 = t0.t()", "sync()", "t1.add_(1)", "sync()", "t0.mul_(2)"]),
    "read": "\n".join(
        [
            _F34,
            "t1 = t0[1]",
            "t1.detach().cpu()",
            "t0.add_(1)",
            "t1.detach().cpu()",
            "t0.detach().cpu()",
        ]
    ),
    "backward": "\n".join(
        [
            "t0 = torch.arange(12.).reshape(3, 4).to(dev, copy=True).requires_grad_()",
            "t1 = t0.clone()",
            "t2 = t1.t()",
            "t2.mul_(2)",
            "t3 = t1[1:]",
            "t4 = t0.select(0, 0)",
            "t3.add_(t4)",
            "backward(t0, t1, t2, t3, t4)",
        ]
    ),
}


def with_autograd(source: str) -> str:
    """`source` started from a leaf requiring grad (renamed; `t0` becomes its clone), ending in
    `backward` of every tensor that requires grad on eager."""
    program = Program.from_source(source)
    if any(op.kind == "backward" for op in program.ops):
        return source
    first, *rest = program.ops
    leaf = "t99"
    ops = [
        Op((leaf,), first.expr + ".requires_grad_()"),
        Op(first.outs, f"{leaf}.clone()"),
        *rest,
    ]
    env = make_env(CPU)
    names: list[str] = []
    with _quiet():
        for op in ops:
            if exec_op(op, env) is not None:
                return "\n".join(o.line for o in ops[: ops.index(op) + 1])
            names.extend(op.outs)
    grads = [
        n
        for n in names
        if env[n].requires_grad and (env[n].is_floating_point() or env[n].is_complex())
    ]
    return "\n".join([*(o.line for o in ops), f"backward({', '.join(grads)})"])
