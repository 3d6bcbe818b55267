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

The code is in three modules: fuzz_exec.py (the op kinds, `Op`, `Program`, running a program on
both sides and comparing), fuzz_gen.py (drawing programs, one example per op kind), and this one
(reducing a failure, the Hypothesis runs, coverage, the command line), which re-exports what the
tests use.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .fuzz_exec import (
    _VAR_RE,
    ALL_KINDS,
    CPU,
    FuzzFailure,
    Op,
    Program,
    _failure,
    _primary,
    _quiet,
    _Run,
    check,
    check_program,
    exec_op,
    make_env,
    run_program,
)
from .fuzz_exec import report as report
from .fuzz_exec import repro as repro
from .fuzz_gen import KIND_EXAMPLES as KIND_EXAMPLES
from .fuzz_gen import _input_expr, programs
from .fuzz_gen import with_autograd as with_autograd

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
