"""Differential fuzzer for views and mutation: random short programs, eager CPU vs lazyxla.

A *program* is a list of `Op`s. Each op is one line of ordinary PyTorch, one call per line, and is
stored as exactly that line (a JSON-able string), e.g.::

    t0 = torch.arange(12.).reshape(3, 4).to(dev, copy=True).requires_grad_()
    t1 = t0.clone()
    t2 = t1.t()
    t3, t4 = t2.split(2, 1)
    t3.add_(t4)
    sync()
    t2.detach().cpu()
    backward(t0, t1, t2, t3, t4)

The same lines run twice, in lockstep: with ``dev = torch.device('cpu')`` (eager, the oracle) and
with ``dev = lazyxla.device()`` (inputs are made on the CPU and copied over). ``sync()`` is
`lazyxla.sync` on lazyxla and a no-op on CPU; ``tN.detach().cpu()`` is a value read (a sync point
for that tensor); ``backward(*ts)`` is ``sum((t * W(t)).sum() for t in ts).backward()`` with fixed
integer weights ``W``. What is executed is what is printed, so a failure's repro is the program
text itself (`check_program(source)`).

After every op both sides must agree on raising (same exception type; the program then stops).
After a read and at the end, for every live tensor: values (exact: the data is integer valued),
shape, dtype, ``stride()``, ``storage_offset()``, ``is_contiguous()``, ``requires_grad``, ``_base``
(None, or which program tensor), object identity, and for every pair of tensors whether they alias
(``untyped_storage().data_ptr()`` equal); after ``backward``, every leaf's ``.grad``.

Programs are drawn by Hypothesis (`programs()`), reproducibly from a seed. Drawing runs the eager
side as it goes, so each op is drawn for the tensors that actually exist; an op that raises on
eager is kept (as the program's last op) only one time in eight, so most programs run to the end.
Ops whose eager result is undefined are never drawn: in-place writes that hit one memory location
through two elements with different values (add_/mul_/copy_ into an overlapping `unfold`/
`as_strided` view) or that read a source partially overlapping the target when eager does not
reject it. A failing program is then reduced as text (`reduce`: drop lines, route around views,
shrink shapes and integers) to a minimal repro.

    python -m lazyxla.tools.fuzz_views --seconds 600 --seed 0   # a campaign: distinct failures
    python -m lazyxla.tools.fuzz_views --coverage 150           # coverage table of a fixed seed

Each failure is named by a signature, the check and the op kind (``storage_offset / view_dtype``,
``error / fill_ / - / RuntimeError``); a run reports one reduced repro per signature, and a
campaign (batches of seeds seed, seed+1, ...) goes on looking only for new signatures.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

import lazyxla

LAZY_DEV = lazyxla.device()
CPU = torch.device("cpu")

# --- op kinds -------------------------------------------------------------------------------------

VIEW_KINDS = (
    "t",
    "transpose",
    "permute",
    "slice",
    "narrow",
    "diagonal",
    "unfold",
    "expand",
    "view",
    "view_dtype",
    "as_strided",
    "unbind",
    "split",
    "chunk",
    "select",
    "squeeze",
    "unsqueeze",
    "real",
    "imag",
    "view_as_real",
    "view_as_complex",
)
COPY_KINDS = ("contiguous", "clone", "reshape", "flatten", "input")
WRITE_KINDS = ("add_", "mul_", "zero_", "fill_", "copy_", "index_put_", "masked_fill_")
SYNC_KINDS = ("sync", "read")
ALL_KINDS = (*VIEW_KINDS, *COPY_KINDS, *WRITE_KINDS, *SYNC_KINDS, "backward")

_OUT_RE = re.compile(r"^\s*((?:t\d+\s*,\s*)*t\d+\s*,?)\s*=\s*(.+)$")
_VAR_RE = re.compile(r"\bt\d+\b")


def kind_of(expr: str) -> str:
    """The op kind of one program line's right-hand side (or statement)."""
    expr = expr.strip()
    if expr == "sync()":
        return "sync"
    if expr.startswith("backward("):
        return "backward"
    m = re.match(r"torch\.(view_as_real|view_as_complex)\(", expr)
    if m:
        return m.group(1)
    if expr.startswith("torch."):
        return "input"
    m = re.match(r"t\d+(\[|\.real\b|\.imag\b|\.(\w+)\()", expr)
    if not m:
        raise ValueError(f"not a fuzzer program line: {expr!r}")
    if m.group(1) == "[":
        return "slice"
    if m.group(1) in (".real", ".imag"):
        return m.group(1)[1:]
    name = m.group(2)
    if name == "detach" and expr[m.end() :] == ").cpu()":
        return "read"
    if name == "view" and expr[m.end() :].startswith("torch."):
        return "view_dtype"
    if name not in ALL_KINDS:
        raise ValueError(f"unknown op {name!r} in {expr!r}")
    return name


@dataclasses.dataclass(frozen=True)
class Op:
    """One program line: `outs = expr` (views, copies, inputs) or a statement (writes, syncs)."""

    outs: tuple[str, ...]
    expr: str

    @property
    def kind(self) -> str:
        return kind_of(self.expr)

    @property
    def line(self) -> str:
        if not self.outs:
            return self.expr
        lhs = ", ".join(self.outs) + ("," if len(self.outs) == 1 and self._multi else "")
        return f"{lhs} = {self.expr}"

    @property
    def _multi(self) -> bool:
        return self.kind in ("unbind", "split", "chunk")

    @property
    def target(self) -> str | None:
        """The tensor a write or read (`tN.detach().cpu()`) acts on."""
        m = re.match(r"(t\d+)\.", self.expr)
        return m.group(1) if m and not self.outs else None

    @classmethod
    def parse(cls, line: str) -> Op:
        m = _OUT_RE.match(line)
        if m:
            outs = tuple(o.strip() for o in m.group(1).split(",") if o.strip())
            return cls(outs, m.group(2).strip())
        return cls((), line.strip())


@dataclasses.dataclass(frozen=True)
class Program:
    ops: tuple[Op, ...]

    @property
    def source(self) -> str:
        return "\n".join(op.line for op in self.ops)

    @classmethod
    def from_source(cls, source: str) -> Program:
        lines = [ln for ln in textwrap.dedent(source).splitlines() if ln.strip()]
        return cls(tuple(Op.parse(ln) for ln in lines if not ln.strip().startswith("#")))

    def to_json(self) -> list[str]:
        return [op.line for op in self.ops]

    def __repr__(self) -> str:  # what Hypothesis prints for a falsifying example
        return f"Program.from_source({self.source!r})"


# --- execution ------------------------------------------------------------------------------------


def weights(t: torch.Tensor) -> torch.Tensor:
    """The fixed integer weights of `backward`'s loss (distinct, so a permuted gradient shows)."""
    return (torch.arange(t.numel()) % 5 + 1).reshape(t.shape).to(t.dtype).to(t.device)


def backward(*ts: torch.Tensor) -> None:
    """The program op `backward(t0, t3, ...)`: a weighted sum of the tensors, backpropagated."""
    loss = None
    for t in ts:
        if t.is_complex():
            t = torch.view_as_real(t)
        term = (t * weights(t)).sum()
        loss = term if loss is None else loss + term
    if loss is not None:
        loss.backward()


def _noop() -> None:
    return None


def make_env(dev: torch.device) -> dict[str, Any]:
    lazy = dev.type != "cpu"
    return {
        "torch": torch,
        "dev": dev,
        "sync": lazyxla.sync if lazy else _noop,
        "backward": backward,
        "__builtins__": __builtins__,
    }


_CODE: dict[str, Any] = {}


def _compiled(src: str, mode: str) -> Any:
    key = (src, mode)
    code = _CODE.get(key)
    if code is None:
        code = _CODE[key] = compile(src, "<fuzz program>", mode)
    return code


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # XLA:CPU flushes denormals; eager must too, or a bit pattern written through an integer view
    # (a float32 holding int 5 is a denormal), then multiplied, differs for no reason of views.
    torch.set_flush_denormal(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            torch.set_flush_denormal(False)


def _error(e: BaseException) -> tuple[str, str]:
    msg = str(e).strip().splitlines()
    return type(e).__name__, (msg[0] if msg else "")[:200]


def exec_op(op: Op, env: dict[str, Any]) -> tuple[str, str] | None:
    """Run one op in `env`; returns (exception type, message) or None."""
    try:
        if op.outs:
            val = eval(_compiled(op.expr, "eval"), env)
            if len(op.outs) == 1 and not op._multi:
                env[op.outs[0]] = val
            else:
                val = tuple(val)
                if len(val) != len(op.outs):
                    return ("ValueError", f"{len(val)} outputs, expected {len(op.outs)}")
                env.update(zip(op.outs, val))
        else:
            eval(_compiled(op.expr, "eval"), env)
    except Exception as e:  # noqa: BLE001  (any exception is a result to compare)
        return _error(e)
    return None


# --- comparison -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Mismatch:
    check: str
    where: str
    eager: Any
    lazy: Any
    sig: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.check} of {self.where}: eager {self.eager!r}, lazyxla {self.lazy!r}"


def _is_grad_leaf(t: torch.Tensor) -> bool:
    return t.is_leaf and t.requires_grad


def _get(t: torch.Tensor, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`fn(t)`, or the exception's type name: autograd raises reading `grad_fn`/`is_leaf` of a
    multi-output view written in place."""
    try:
        return fn(t)
    except Exception as e:  # noqa: BLE001
        return f"raises {type(e).__name__}"


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach(), b.detach()
    if a.is_complex():
        a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
    if a.dtype == torch.bool:
        return bool(torch.equal(a, b))
    eq = a == b
    if a.is_floating_point():
        eq = eq | (a.isnan() & b.isnan())
        # The programs compute on small integers, exact on both sides, until a product leaves
        # the dtype's exact-integer range (2**24 in float32): from there the rounding depends on
        # FMA contraction and evaluation order, not on views; a few ulps are the same value.
        eps = torch.finfo(a.dtype).eps
        big = a.abs() >= 2 / eps
        eq = eq | (big & ((a - b).abs() <= 4 * eps * a.abs()))
    return bool(eq.all())


def _short(t: torch.Tensor) -> Any:
    flat = t.detach().reshape(-1)
    vals = flat.tolist()
    return vals if len(vals) <= 12 else [*vals[:12], "..."]


class _Run:
    """Lockstep execution of one program on eager CPU and on lazyxla."""

    def __init__(
        self, program: Program, dev: torch.device = LAZY_DEV, other: Program | None = None
    ) -> None:
        self.program = program
        self.other = other or program  # the second side's ops (differs only in the harness's tests)
        self.dev = dev
        self.envs = (make_env(CPU), make_env(dev))
        self.names: list[str] = []
        self.creator: dict[str, str] = {}
        self.line_of: dict[str, str] = {}
        self.last_write: dict[
            int, str
        ] = {}  # eager storage ptr -> creator kind of the written view
        self.mismatches: list[Mismatch] = []

    def desc(self, name: str) -> str:
        return f"{name} (`{self.line_of[name]}`)"

    def add(self, check: str, where: str, e: Any, z: Any, *sig: str) -> None:
        self.mismatches.append(Mismatch(check, where, e, z, (check, *sig)))

    def run(self) -> list[Mismatch]:
        eager, lazy = self.envs
        with _quiet():
            for op, op2 in zip(self.program.ops, self.other.ops):
                kind = op.kind
                ee = exec_op(op, eager)
                if ee is None and kind in WRITE_KINDS:
                    tgt = eager[op.target]
                    self.last_write[_ptr(tgt)] = self.creator.get(op.target, "?")
                ez = exec_op(op2, lazy)
                if (ee is None) != (ez is None) or (ee and ez and ee[0] != ez[0]):
                    self.add(
                        "error",
                        f"`{op.line}`",
                        ee and f"{ee[0]}: {ee[1]}",
                        ez and f"{ez[0]}: {ez[1]}",
                        kind,
                        ee[0] if ee else "-",
                        ez[0] if ez else "-",
                    )
                    return self.mismatches  # the states may differ arbitrarily now
                for o in op.outs:
                    self.names.append(o)
                    self.creator[o] = kind
                    self.line_of[o] = op.line
                if ee:
                    break  # both raised alike: the program stops here
                if kind == "read":
                    self.compare_values([op.target], "read")
            self.compare_all()
        return self.mismatches

    # -- checks ------------------------------------------------------------------------------------

    def compare_all(self) -> None:
        eager, lazy = self.envs
        names = [n for n in self.names if n in eager and n in lazy]
        if not names:
            return
        for n in names:
            self.compare_meta(n, eager[n], lazy[n])
        self.compare_structure(names)
        try:
            lazyxla.sync()
        except Exception as e:  # noqa: BLE001
            self.add("error", "final lazyxla.sync()", None, ": ".join(_error(e)), "final_sync")
            return
        self.compare_values(names, "end")
        self.compare_grads(names)

    def compare_meta(self, n: str, e: torch.Tensor, z: torch.Tensor) -> None:
        kind, where = self.creator[n], self.desc(n)
        if isinstance(e, torch.Tensor) and e.numel() == 0:
            kind += " (empty)"
        if not isinstance(e, torch.Tensor) or not isinstance(z, torch.Tensor):
            if type(e) is not type(z):
                self.add("type", where, type(e).__name__, type(z).__name__, kind)
            return
        if tuple(e.shape) != tuple(z.shape):
            self.add("shape", where, tuple(e.shape), tuple(z.shape), kind)
            return
        if e.dtype != z.dtype:
            self.add("dtype", where, e.dtype, z.dtype, kind)
        if z.device.type != self.dev.type:
            self.add("device", where, self.dev.type, str(z.device), kind)
        rg_e, rg_z = _get(e, lambda t: t.requires_grad), _get(z, lambda t: t.requires_grad)
        if rg_e != rg_z:
            self.add("requires_grad", where, rg_e, rg_z, kind)
        if e.stride() != z.stride():
            self.add("stride", where, e.stride(), z.stride(), kind)
        if e.storage_offset() != z.storage_offset():
            self.add("storage_offset", where, e.storage_offset(), z.storage_offset(), kind)
        if e.is_contiguous() != z.is_contiguous():
            self.add("is_contiguous", where, e.is_contiguous(), z.is_contiguous(), kind)

    def _tensor_names(self, names: list[str]) -> list[str]:
        eager, lazy = self.envs
        return [
            n
            for n in names
            if isinstance(eager[n], torch.Tensor) and isinstance(lazy[n], torch.Tensor)
        ]

    def compare_structure(self, names: list[str]) -> None:
        """`_base`, identity and aliasing, expressed in program names so both sides compare."""
        eager, lazy = self.envs
        names = self._tensor_names(names)

        def base_name(env: dict[str, Any], n: str) -> str | None:
            try:
                b = env[n]._base
            except Exception as e:  # noqa: BLE001
                return f"raises {type(e).__name__}"
            if b is None:
                return None
            return next((m for m in names if env[m] is b), "<a tensor outside the program>")

        for n in names:
            be, bz = base_name(eager, n), base_name(lazy, n)
            if be != bz:
                self.add("_base", self.desc(n), be, bz, self.creator[n])
        for i, a in enumerate(names):
            for b in names[:i]:
                ea, eb, za, zb = eager[a], eager[b], lazy[a], lazy[b]
                newer = self.creator[a]
                if (ea is eb) != (za is zb):
                    self.add("identity", f"{self.desc(a)} is {b}", ea is eb, za is zb, newer)
                    continue
                if ea.numel() == 0 or eb.numel() == 0:
                    continue  # empty tensors alias nothing (eager's empty storages all have ptr 0)
                ae, az = _ptr(ea) == _ptr(eb), _ptr(za) == _ptr(zb)
                if ae != az:
                    self.add(
                        "alias",
                        f"{self.desc(a)} and {b}",
                        "shares storage" if ae else "separate",
                        "shares storage" if az else "separate",
                        "eager shares" if ae else "eager separate",
                        newer,
                    )

    def compare_values(self, names: list[str], when: str) -> None:
        eager, lazy = self.envs
        for n in self._tensor_names(names):
            e, z = eager[n], lazy[n]
            if tuple(e.shape) != tuple(z.shape) or e.dtype != z.dtype:
                continue
            try:
                zc = z.detach().cpu()
            except Exception as ex:  # noqa: BLE001
                self.add("error", f"{n}.cpu() ({when})", None, ": ".join(_error(ex)), "read")
                continue
            if not _same_values(e, zc):
                via = self.last_write.get(_ptr(e), "no write") if e.numel() else "no write"
                self.add(
                    "value" if when == "end" else "value at read",
                    self.desc(n),
                    _short(e),
                    _short(zc),
                    self.creator[n],
                    f"written via {via}",
                )

    def compare_grads(self, names: list[str]) -> None:
        eager, lazy = self.envs
        for n in self._tensor_names(names):
            e, z = eager[n], lazy[n]
            leaf_e, leaf_z = _get(e, _is_grad_leaf), _get(z, _is_grad_leaf)
            if leaf_e != leaf_z:
                self.add("is_leaf", self.desc(n), leaf_e, leaf_z, self.creator[n])
            if leaf_e is not True:
                continue
            ge, gz = e.grad, z.grad
            if (ge is None) != (gz is None):
                self.add("grad", f"{n}.grad", ge is not None, gz is not None, "presence")
                continue
            if ge is None:
                continue
            if ge.shape != gz.shape or ge.dtype != gz.dtype:
                self.add(
                    "grad", f"{n}.grad", (ge.shape, ge.dtype), (gz.shape, gz.dtype), "shape/dtype"
                )
                continue
            gzc = gz.detach().cpu()
            if not _same_values(ge, gzc):
                kinds = sorted({k for k in map(kind_of, [o.expr for o in self.program.ops])})
                self.add("grad", f"{n}.grad", _short(ge), _short(gzc), "+".join(kinds))


# Priority of checks when one program shows several: the first is the failure's name.
_PRIORITY = (
    "error",
    "type",
    "shape",
    "dtype",
    "device",
    "value at read",
    "value",
    "requires_grad",
    "is_leaf",
    "identity",
    "_base",
    "alias",
    "stride",
    "storage_offset",
    "is_contiguous",
    "grad",
)


def _primary(ms: list[Mismatch], known: frozenset[tuple[str, ...]]) -> Mismatch | None:
    new = [m for m in ms if m.sig not in known]
    if not new:
        return None
    return min(new, key=lambda m: _PRIORITY.index(m.check))


class FuzzFailure(AssertionError):
    """lazyxla and eager CPU disagree on a program. Subclassed per failure signature so Hypothesis
    shrinks (and reports) different kinds of failure separately."""

    program: Program
    mismatches: list[Mismatch]


_FAILURE_TYPES: dict[tuple[str, ...], type[FuzzFailure]] = {}


def _failure_type(sig: tuple[str, ...]) -> type[FuzzFailure]:
    cls = _FAILURE_TYPES.get(sig)
    if cls is None:
        name = "Mismatch_" + "_".join(re.sub(r"\W+", "", s) or "x" for s in sig)
        cls = _FAILURE_TYPES[sig] = type(name, (FuzzFailure,), {"sig": sig})
    return cls


def repro(program: Program) -> str:
    body = textwrap.indent(program.source, "    ")
    return f'from lazyxla.tools.fuzz_views import check_program\ncheck_program("""\n{body}\n""")'


def report(program: Program, ms: list[Mismatch], primary: Mismatch | None = None) -> str:
    primary = primary or ms[0]
    lines = [f"lazyxla disagrees with eager CPU: {' / '.join(primary.sig)}", ""]
    lines += [f"  {m}" for m in ms[:25]]
    if len(ms) > 25:
        lines.append(f"  ... and {len(ms) - 25} more")
    lines += ["", "Repro (runs the program on eager CPU and on lazyxla, raises on any difference):"]
    lines += ["", textwrap.indent(repro(program), "    ")]
    return "\n".join(lines)


def run_program(program: Program, dev: torch.device = LAZY_DEV) -> list[Mismatch]:
    """Every difference between eager CPU and lazyxla on `program` (empty: they agree).

    `dev=torch.device("cpu")` runs eager against itself: the generator's own sanity check (a
    program whose eager result is undefined would differ between two runs, or on aliasing)."""
    return _Run(program, dev).run()


def check(program: Program, known: frozenset[tuple[str, ...]] = frozenset()) -> None:
    """Raise a `FuzzFailure` (its type named by the failure's signature) if lazyxla disagrees with
    eager CPU in a way whose signature is not in `known`."""
    ms = run_program(program)
    primary = _primary(ms, known)
    if primary is not None:
        raise _failure(program, ms, primary)


def _failure(program: Program, ms: list[Mismatch], primary: Mismatch) -> FuzzFailure:
    exc = _failure_type(primary.sig)(report(program, ms, primary))
    exc.program, exc.mismatches = program, ms
    return exc


def check_program(source: str) -> None:
    """Run a program written as text (a failure's repro) on both sides; raise on any difference."""
    check(Program.from_source(source))


# --- reducing a failing program ---------------------------------------------------------------
# Hypothesis shrinks the choices a program was drawn from; this pass then edits the program text
# itself, which Hypothesis cannot do well once tensor names are involved: drop a line, route around
# a view (`t2 = t1.t()` goes, later uses of t2 read t1), drop a tensor from `backward`, shrink the
# input's shape and integer arguments. A candidate is kept if it still fails with the same
# signature.

_INPUT_RE = re.compile(
    r"^torch\.arange\((\d+)(\.|, dtype=torch\.int32)\)(\.view\(torch\.complex64\))?"
    r"(?:\.reshape\(([^)]*)\))?(\.to\(dev, copy=True\).*)$"
)
_INT_RE = re.compile(r"(?<![\w.])-?\d+(?![\w.])")


def _parse_input(expr: str) -> tuple[tuple[int, ...], torch.dtype, str] | None:
    m = _INPUT_RE.match(expr)
    if not m:
        return None
    n = int(m.group(1))
    dtype = torch.int32 if "int32" in m.group(2) else torch.float32
    if m.group(3):
        dtype, n = torch.complex64, n // 2
    if m.group(4) is None:
        shape: tuple[int, ...] = (n,)
    else:
        shape = tuple(
            int(v) for v in m.group(4).replace("(", "").replace(")", "").split(",") if v.strip()
        )
    return shape, dtype, m.group(5)[len(".to(dev, copy=True)") :]


def _replace_op(program: Program, i: int, op: Op | None) -> Program:
    ops = list(program.ops)
    if op is None:
        del ops[i]
    else:
        ops[i] = op
    return Program(tuple(ops))


def _rename(expr: str, old: str, new: str) -> str:
    return re.sub(rf"\b{old}\b", new, expr)


def _candidates(program: Program) -> Iterator[Program]:
    ops = program.ops
    for i in range(len(ops) - 1, -1, -1):  # drop a line
        yield _replace_op(program, i, None)
    for i in range(len(ops) - 1, 0, -1):  # route later uses of a view's output to its input
        op = ops[i]
        srcs = _VAR_RE.findall(op.expr)
        if len(op.outs) != 1 or not srcs:
            continue
        rest = [Op(o.outs, _rename(o.expr, op.outs[0], srcs[0])) for o in ops[i + 1 :]]
        yield Program((*ops[:i], *rest))
        for j in range(i + 1, len(ops)):  # ... and around the next view of it too
            nxt = ops[j]
            if len(nxt.outs) == 1 and _VAR_RE.findall(nxt.expr)[:1] == [op.outs[0]]:
                rest = [Op(o.outs, _rename(o.expr, nxt.outs[0], srcs[0])) for o in ops[j + 1 :]]
                yield Program((*ops[:i], *ops[i + 1 : j], *rest))
    for op in ops:  # no autograd
        if op.expr.endswith(".requires_grad_()"):
            plain = [o for o in ops if o.kind != "backward"]
            k = plain.index(op)
            plain[k] = Op(op.outs, op.expr[: -len(".requires_grad_()")])
            yield Program(tuple(plain))
    for i, op in enumerate(ops):
        if op.kind == "backward":
            args = _VAR_RE.findall(op.expr)
            for a in args:
                if len(args) > 1:
                    keep = ", ".join(x for x in args if x != a)
                    yield _replace_op(program, i, Op((), f"backward({keep})"))
    for i, op in enumerate(ops):
        parsed = _parse_input(op.expr) if op.kind == "input" else None
        if parsed is not None:
            shape, dtype, suffix = parsed
            if dtype != torch.float32:
                yield _replace_op(
                    program, i, Op(op.outs, _input_expr(shape, torch.float32) + suffix)
                )
            for d in range(len(shape)):
                smaller = [*shape[:d], shape[d] - 1, *shape[d + 1 :]] if shape[d] > 1 else None
                for cand in (smaller, [*shape[:d], *shape[d + 1 :]]):
                    if cand is not None:
                        expr = _input_expr(tuple(cand), dtype) + suffix
                        yield _replace_op(program, i, Op(op.outs, expr))
            continue
        if op.kind in ("input", "backward", "sync"):
            continue
        for m in _INT_RE.finditer(op.expr):
            v = int(m.group())
            for smaller in sorted({0, v // 2, v - 1 if v > 0 else v + 1}, key=abs):
                if abs(smaller) < abs(v) or (smaller == -v and v < 0):
                    expr = op.expr[: m.start()] + str(smaller) + op.expr[m.end() :]
                    yield _replace_op(program, i, Op(op.outs, expr))


def _has_empty(program: Program) -> bool:
    """Whether any tensor of the program is empty on eager."""
    env = make_env(CPU)
    with _quiet():
        for op in program.ops:
            if exec_op(op, env) is not None:
                break
            for o in op.outs:
                if isinstance(env[o], torch.Tensor) and env[o].numel() == 0:
                    return True
    return False


def renumber(program: Program) -> Program:
    """Tensor names t0, t1, ... in order of definition."""
    names: dict[str, str] = {}
    for op in program.ops:
        for o in op.outs:
            names.setdefault(o, f"t{len(names)}")

    def sub(expr: str) -> str:
        return _VAR_RE.sub(lambda m: names.get(m.group(), m.group()), expr)

    return Program(tuple(Op(tuple(names[o] for o in op.outs), sub(op.expr)) for op in program.ops))


def reduce(program: Program, sig: tuple[str, ...], seconds: float = 120.0) -> Program:
    """A smaller program that still fails with signature `sig` (greedy, first improvement)."""
    t0 = time.monotonic()

    empty_ok = _has_empty(program)

    def fails(p: Program) -> bool:
        try:
            found = any(m.sig == sig for m in _Run(p).run())
        except Exception:  # noqa: BLE001  (a candidate that breaks the harness is no repro)
            return False
        # Shrinking a size to 0 often keeps a failure but turns it into an empty-tensor edge case
        # of it: only accepted if the program had empty tensors to begin with.
        return found and (empty_ok or not _has_empty(p))

    seen: set[Program] = {program}
    changed = True
    while changed and time.monotonic() - t0 < seconds:
        changed = False
        for cand in _candidates(program):
            if cand in seen:
                continue
            seen.add(cand)
            if fails(cand):
                program, changed = cand, True
                break
    return renumber(program)


def reduced_failure(f: FuzzFailure, seconds: float = 120.0) -> FuzzFailure:
    """`f` again, for its program reduced by `reduce` (itself if nothing smaller fails)."""
    sig = type(f).sig
    small = reduce(f.program, sig, seconds)
    ms = run_program(small)
    primary = next((m for m in ms if m.sig == sig), None)
    if primary is None:  # not reproducible on a rerun: keep the original
        return f
    return _failure(small, ms, primary)


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
        name = g.pick(pairs) if pairs and g.int(0, 3) else g.pick()
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


# --- running with Hypothesis ------------------------------------------------------------------


def _settings(max_examples: int, phases: tuple[Any, ...], **kw: Any) -> Any:
    from hypothesis import HealthCheck, Verbosity, settings

    return settings(
        **kw,
        max_examples=max_examples,
        deadline=None,
        database=None,  # no example database: a run depends on its seed only
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        phases=phases,
        verbosity=Verbosity.quiet,
    )


def fuzz(
    *,
    seed: int,
    max_examples: int,
    max_ops: int = 12,
    known: set[tuple[str, ...]] | None = None,
    reduce_seconds: float = 60.0,
    until: float | None = None,
    log: Callable[[FuzzFailure], None] | None = None,
) -> list[FuzzFailure]:
    """Run `max_examples` programs drawn by Hypothesis from `seed`; return one reduced failure per
    distinct kind of difference (signature), every signature not already in `known`.

    Hypothesis generates (the same programs for the same seed); it does not shrink: a failure is
    reduced by `reduce` instead, at once, and its signatures join `known` (updated in place), so
    the run goes on looking for other kinds of failure. `until`: a `time.monotonic()` deadline
    after which the remaining examples are skipped."""
    from hypothesis import Phase, given
    from hypothesis import seed as hseed

    known = set() if known is None else known
    found: list[FuzzFailure] = []

    def body(program: Program) -> None:
        if until is not None and time.monotonic() > until:
            return
        ms = run_program(program)
        while (primary := _primary(ms, frozenset(known))) is not None:
            f = reduced_failure(_failure(program, ms, primary), reduce_seconds)
            known.add(primary.sig)
            known.update(m.sig for m in f.mismatches)
            found.append(f)
            if log is not None:
                log(f)

    @_settings(max_examples, (Phase.generate,))
    @hseed(seed)
    @given(programs(max_ops=max_ops))
    def fuzz_views(program: Program) -> None:
        body(program)

    fuzz_views()
    return found


def hypothesis_test(
    *, seed: int, max_examples: int, max_ops: int = 12, report_multiple_bugs: bool = False
) -> Callable[[], None]:
    """The same programs as a plain Hypothesis test, shrunk by Hypothesis's own shrinker (slower
    than `fuzz`, as every shrink step runs lazyxla; the result is not text-reduced)."""
    from hypothesis import Phase, given
    from hypothesis import seed as hseed

    phases = (Phase.explicit, Phase.generate, Phase.shrink)

    @_settings(max_examples, phases, report_multiple_bugs=report_multiple_bugs)
    @hseed(seed)
    @given(programs(max_ops=max_ops))
    def fuzz_views(program: Program) -> None:
        check(program)

    return fuzz_views


def summary(found: list[FuzzFailure]) -> str:
    lines = [f"{len(found)} distinct failures:"]
    for i, f in enumerate(found, 1):
        lines.append(f"  {i:2d}. {' / '.join(type(f).sig)}")
        lines += [f"        {ln}" for ln in f.program.source.splitlines()]
    return "\n".join(lines)


def campaign(seconds: float, seed: int, batch: int, max_ops: int) -> list[FuzzFailure]:
    """Batches of `batch` programs (seeds seed, seed+1, ...) until `seconds` pass."""
    t0 = time.monotonic()
    until = t0 + seconds
    known: set[tuple[str, ...]] = set()
    found: list[FuzzFailure] = []
    n = 0

    def log(f: FuzzFailure) -> None:
        print(f"\n[{time.monotonic() - t0:6.0f}s] failure #{len(found) + 1}\n{f}\n", flush=True)
        found.append(f)

    while time.monotonic() < until:
        fuzz(seed=seed + n, max_examples=batch, max_ops=max_ops, known=known, until=until, log=log)
        n += 1
        print(f"[{time.monotonic() - t0:6.0f}s] seed {seed + n - 1} done", flush=True)
    print(f"\n{n} batches of {batch} programs in {time.monotonic() - t0:.0f}s; {summary(found)}")
    return found


# --- coverage -------------------------------------------------------------------------------------


def coverage(seed: int, examples: int, max_ops: int) -> str:
    """A markdown table: how often each op kind occurs in the programs of one fixed-seed run, by
    autograd (a leaf requiring grad, ending in `backward`, or not) and by the sync point that
    follows it: a `sync()`, a `.detach().cpu()` read, or only the final sync. `eager raised`: the
    program's last op, raising on eager (lazyxla must raise the same)."""
    cols = ("plain", "autograd", "sync", "read", "final", "raised")
    rows: dict[str, dict[str, int]] = {k: dict.fromkeys(cols, 0) for k in ALL_KINDS}

    def count(p: Program) -> None:
        grad = p.ops[0].expr.endswith(".requires_grad_()")
        env = make_env(CPU)
        with _quiet():
            raised = [exec_op(op, env) is not None for op in p.ops]
        for i, op in enumerate(p.ops):
            r = rows[op.kind]
            r["autograd" if grad else "plain"] += 1
            later = {o.kind for o in p.ops[i + 1 :]}
            r["sync"] += "sync" in later
            r["read"] += "read" in later
            r["final"] += not ({"sync", "read"} & later)
            r["raised"] += raised[i]

    from hypothesis import Phase, given
    from hypothesis import seed as hseed

    @_settings(examples, (Phase.generate,))
    @hseed(seed)
    @given(programs(max_ops=max_ops))
    def gen(p: Program) -> None:
        count(p)

    gen()
    out = [
        "| op kind | no autograd | autograd | then `sync()` | then read | final sync only "
        "| eager raised |",
        "|---|" + "--:|" * len(cols),
    ]
    for k in ALL_KINDS:
        out.append(f"| `{k}` | " + " | ".join(str(rows[k][c]) for c in cols) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="campaign length")
    p.add_argument("--seed", type=int, default=0, help="first batch's seed")
    p.add_argument("--batch", type=int, default=200, help="programs per batch (one seed each)")
    p.add_argument("--max-ops", type=int, default=12, help="ops per program (after its input)")
    p.add_argument(
        "--coverage", type=int, metavar="N", help="print the coverage table of N programs"
    )
    p.add_argument("--repro", metavar="FILE", help="check one program (its text) and exit")
    a = p.parse_args(argv)
    if a.repro:
        with open(a.repro) as f:
            source = f.read()
        try:
            check_program(source)
        except FuzzFailure as e:
            print(e)
            return 1
        print("eager CPU and lazyxla agree")
        return 0
    if a.coverage:
        print(coverage(a.seed, a.coverage, a.max_ops))
        return 0
    found = campaign(a.seconds, a.seed, a.batch, a.max_ops)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
