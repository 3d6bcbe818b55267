"""The view fuzzer's programs (see fuzz_views.py, the entry point): the op kinds, `Op` and
`Program`, and running a program in lockstep on eager CPU and lazyxla, comparing every live
tensor after each read and at the end."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import textwrap
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


def _same_values(a: torch.Tensor, b: torch.Tensor, divided: bool = False) -> bool:
    """Equal values; `divided`: the values went through a division that leaves the integers
    (compared to a few ulps, as past the exact-integer range, below)."""
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
        if divided:
            big = torch.ones_like(big)
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
        kinds = sorted({k for k in map(kind_of, [o.expr for o in self.program.ops])})
        # as_strided's backward over an input whose elements share locations (an expand's)
        # divides each location's gradient by how many input elements read it, and the
        # backward of what made the overlap sums those shares again: 7 / 6 summed six times
        # is 6.9999995 on eager and 7.0 on lazyxla, 17 is 17.0 and 16.999998. Neither is the
        # exact one; the sum's order differs (eager's CPU kernel against XLA's reduction).
        divided = "as_strided" in kinds
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
            if not _same_values(ge, gzc, divided):
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
