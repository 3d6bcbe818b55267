"""`lazyxla run script.py [args]`: run a torch_xla program on lazyxla, unmodified."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from collections.abc import Sequence


def _script_traceback(exc: BaseException, script: str) -> None:
    """Print `exc` as `python script.py` would: without the runner's frames."""
    tb = exc.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__)


def run(script: str, args: Sequence[str]) -> int:
    """Run `script` as `__main__` with `sys.argv = [script, *args]` and the torch_xla alias.

    Returns:
        The exit status: 0, the script's `sys.exit` code, or 1 if it raised.
    """
    from . import compat

    if not os.path.isfile(script):
        print(f"lazyxla run: can't open file {script!r}: no such file", file=sys.stderr)
        return 2
    try:
        compat.install()
    except RuntimeError as e:
        print(f"lazyxla run: {e}", file=sys.stderr)
        return 2
    path = os.path.abspath(script)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(path)  # as `python script.py` sets it
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit:
        raise
    except KeyboardInterrupt as e:
        _script_traceback(e, path)
        return 130
    except BaseException as e:
        _script_traceback(e, path)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The `lazyxla` command line."""
    parser = argparse.ArgumentParser(prog="lazyxla", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser(
        "run", help="run a Python script with `import torch_xla` resolving to lazyxla"
    )
    p_run.add_argument("script", help="the script to run")
    p_run.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if ns.command == "run":
        return run(ns.script, ns.args)
    parser.error(f"unknown command {ns.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
