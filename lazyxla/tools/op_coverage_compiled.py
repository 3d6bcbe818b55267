"""PyTorch's OpInfo database through `torch.compile(backend="lazyxla")`, against eager CPU.

Each entry that runs on lazyxla (docs/op_coverage.md: lowered or fallback) is called through the
trace-once backend on its first sample in its primary dtype (float32 where supported, else int64),
twice on fresh device copies: the first call traces the graph dynamo and AOTAutograd give it, the
second replays it. Values and the inputs after the call (in-place ops) are compared with eager as
op_coverage compares them (its tolerances, tie rules and float64 judge). Entries with float32
autograd also run their first sample with inputs that require grad: AOTAutograd's forward and
backward graphs, traced and replayed, must give eager's gradients. What this finds is the
backend's own failures, which the recorded path does not meet: functionalization's wrapper
tensors reaching a kernel, FakeTensor's fallback for ops without a meta kernel, value reads
inside a traced graph, meta kernels that disagree with eager's CPU outputs.

    python -m lazyxla.tools.op_coverage_compiled           # every entry, prints the failures
    python -m lazyxla.tools.op_coverage_compiled -k linalg
"""

from __future__ import annotations

import argparse
import warnings

import torch

from lazyxla.tools import op_coverage as oc
from lazyxla.tools import op_coverage_report as ocr

# Entries not run through the backend, with the reason (none today; a failure is fixed or listed).
COMPILE_SKIPS: dict[str, str] = {}


def _dtype(op: object) -> torch.dtype | None:
    supported = op.supported_dtypes("cpu")  # type: ignore[attr-defined]
    return next((d for d in (torch.float32, torch.int64) if d in supported), None)


def check(key: str) -> str | None:
    """None if `key` runs through the backend as eager does (or has nothing to run), else why."""
    if key in oc.SKIPS or key in oc.UNDEFINED_VALUES or key in oc.KEEP_CPU_ARGS:
        return None
    if key in COMPILE_SKIPS:
        return None
    op = oc.op_db()[key]
    dtype = _dtype(op)
    if dtype is None:
        return None
    tol = dict(oc.TOLERANCES.get(key, ({}, ""))[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in oc._samples(op, dtype, False, 1):
            cpu_s = oc._clone_cpu((s.input, s.args, s.kwargs))
            try:
                expected = op(cpu_s[0], *cpu_s[1], **cpu_s[2])
            except Exception:
                continue  # eager rejects the sample
            if any(t.dtype == torch.complex32 for t in oc._tensors(expected)):
                continue
            torch._dynamo.reset()
            compiled = torch.compile(lambda *a, **kw: op(*a, **kw), backend="lazyxla")
            for call in ("traced", "replayed"):
                lazy_s = oc._to_lazy((s.input, s.args, s.kwargs))
                try:
                    actual = oc._to_cpu(compiled(lazy_s[0], *lazy_s[1], **lazy_s[2]))
                    inputs = oc._to_cpu(lazy_s)
                    _compare(op, key, s, dtype, actual, expected, tol)
                    if key not in oc.LAYOUT_DIFFERS:
                        oc.compare_layouts(actual, expected)
                    _compare_inputs(op, s, dtype, inputs, cpu_s, tol)
                except Exception as e:
                    return f"{call}: {oc._short(e)}"
    return None


def check_grad(key: str) -> str | None:
    """None if `key`'s float32 gradients through the backend are eager's (or it has none)."""
    if key in oc.SKIPS or key in oc.UNDEFINED_VALUES or key in oc.KEEP_CPU_ARGS:
        return None
    if key in COMPILE_SKIPS or key in oc.GRAD_SKIPS:
        return None
    op = oc.op_db()[key]
    if not op.supports_autograd or torch.float32 not in op.supported_backward_dtypes("cpu"):
        return None
    tol = dict(oc.TOLERANCES.get(key, ({}, ""))[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, s in enumerate(oc._samples(op, torch.float32, True, 1)):
            cpu_s = oc._clone_cpu((s.input, s.args, s.kwargs))
            eager = oc.eager_grads(op, s, cpu_s, i)
            if eager is None:
                continue
            outs_c, cot, grads_c = eager
            torch._dynamo.reset()
            compiled = torch.compile(lambda *a, **kw: op(*a, **kw), backend="lazyxla")
            lazy_s = oc._to_lazy(cpu_s)
            wrt_l = [t for t in oc._tensors(lazy_s) if t.requires_grad]
            try:
                out_l = s.output_process_fn_grad(compiled(lazy_s[0], *lazy_s[1], **lazy_s[2]))
                outs_l = [o for o in oc._tensors(out_l) if o.requires_grad]
                if len(outs_l) != len(outs_c):
                    return f"{len(outs_l)} differentiable outputs, eager has {len(outs_c)}"
                grads_l = torch.autograd.grad(
                    outs_l, wrt_l, [c.to(oc.DEV) for c in cot], allow_unused=True
                )
                grads_l = [None if g is None else g.cpu() for g in grads_l]
                oc.compare_grads(op, s, grads_l, grads_c, cot, tol)
            except Exception as e:
                return f"gradients: {oc._short(e)}"
    return None


def _compare(op, key, s, dtype, actual, expected, tol) -> None:
    try:
        oc._compare(actual, expected, tol, True, key)
    except AssertionError:
        if key in oc.TIE_FREE_INDICES:
            oc._indices_select_values(key, s, actual, expected)
            return
        if dtype not in oc._WIDER:
            raise
        oc._no_worse_than_eager(actual, expected, oc._rerun_wide(op, s, dtype)[1], tol, key)


def _compare_inputs(op, s, dtype, inputs, cpu_s, tol) -> None:
    """In-place ops: the mutated inputs, judged as op_coverage judges them."""
    try:
        oc._compare(oc._tensors(inputs), oc._tensors(cpu_s), tol, True)
    except AssertionError:
        if dtype not in oc._WIDER:
            raise
        wide_inputs = oc._rerun_wide(op, s, dtype)[0]
        oc._no_worse_than_eager(
            oc._tensors(inputs), oc._tensors(cpu_s), oc._tensors(wide_inputs), tol
        )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-k", default="", help="only entries whose key contains this substring")
    args = p.parse_args(argv)
    failed = 0
    keys = [k for k in ocr.doc_keys() if args.k in k]
    for key in keys:
        why = check(key) or check_grad(key)
        if why is not None:
            failed += 1
            print(f"{key}: {why}")
    print(f"{len(keys)} entries, {failed} fail through torch.compile(backend='lazyxla')")


if __name__ == "__main__":
    main()
