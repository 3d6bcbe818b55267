"""The pytest plugin of `lazyxla.tools.upstream`: each test's outcome appended, as it happens, to
the JSON-lines file named by $LAZYXLA_UPSTREAM_RESULTS (a file that times out or crashes still
reports the cases that ran).

Standard library only: the tool copies this file next to its generated sitecustomize and loads it
with `-p lazyxla_upstream_plugin`, so it also runs under another interpreter (the reference run
under real torch_xla, `--reference-python`) where lazyxla cannot be imported.
"""

from __future__ import annotations

import json
import os
from typing import Any

RESULTS_ENV = "LAZYXLA_UPSTREAM_RESULTS"


def _crash_line(report: Any) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return str(crash.message).strip().splitlines()[0] if crash.message.strip() else ""
    text = str(getattr(report, "longreprtext", "") or report.longrepr or "")
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln[2:].strip() for ln in lines if ln.startswith("E ")]
    return (errors[0] if errors else (lines[-1] if lines else "")).strip()


def _emit(record: dict[str, Any]) -> None:
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _emit(
            {
                "id": report.nodeid,
                "phase": "collect",
                "outcome": "error",
                "message": _crash_line(report),
                "detail": str(getattr(report, "longreprtext", ""))[-4000:],
            }
        )


def pytest_configure(config: Any) -> None:
    """absltest files read absl flags (`--test_tmpdir`) that `absltest.main()` would parse."""
    try:
        from absl import flags
    except ImportError:
        return
    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["pytest"], known_only=True)


def pytest_collection_finish(session: Any) -> None:
    """The test module becomes `__main__`, as under `python test_x.py` (tests patch
    `__main__.f`)."""
    import sys

    for item in session.items:
        module = getattr(getattr(item, "module", None), "__name__", None)
        if module is not None and module in sys.modules:
            sys.modules["__main__"] = sys.modules[module]
            return


def pytest_runtest_logreport(report: Any) -> None:
    if report.when == "call" or report.outcome != "passed" or getattr(report, "wasxfail", None):
        outcome = report.outcome
        if report.when != "call" and outcome == "failed":
            outcome = "error"  # setup/teardown failure
        if hasattr(report, "wasxfail"):
            outcome = "xfail" if report.skipped else "xpass"
        message = ""
        if outcome == "skipped":
            lr = report.longrepr
            message = str(lr[2] if isinstance(lr, tuple) and len(lr) == 3 else lr)
        elif outcome in ("failed", "error"):
            message = _crash_line(report)
        _emit(
            {
                "id": report.nodeid,
                "phase": report.when,
                "outcome": outcome,
                "message": message,
                "detail": str(getattr(report, "longreprtext", ""))[-4000:]
                if outcome in ("failed", "error")
                else "",
            }
        )
