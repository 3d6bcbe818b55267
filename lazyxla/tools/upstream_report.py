"""The conformance report (upstream.py, the entry point): per-file counts and statuses, failures
grouped by normalised cause, the torch_xla modules that stop files at import, and the failures that
happen only because lazyxla's device type is `jax`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from lazyxla.tools.upstream_files import EXAMPLE_ENV, EXAMPLE_NOTES, SHRINK_ENV

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
