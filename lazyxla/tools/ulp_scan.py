"""Accuracy of lazyxla's elementwise functions beside eager's, in ulps of the dtype.

    python -m lazyxla.tools.ulp_scan                 # float32 and float64, every function
    python -m lazyxla.tools.ulp_scan --dtype float64 --only erfc erfinv

Each function runs on a grid of its domain (linear, or logarithmic over wide positive ranges) on
lazyxla and in eager; both are measured against a reference: the function in float64 for float32
inputs, mpmath at 40 digits for float64 ones. A row is flagged when lazyxla's worst error is both
above 4 ulps and above twice eager's: that is how XLA's cosh/sinh (x + log(1/2) rounded), exp2,
float64 log1p, erfc's tail, erfinv near ±1 and log_ndtr were found (docs/architecture.md, "Where
XLA's own functions are not eager's"). Errors are relative to the reference, in units of the
dtype's spacing there; points where the reference is zero, infinite or below 1e-30 are left out.
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Callable
from typing import Any

import mpmath
import torch
from rich.console import Console
from rich.table import Table

import lazyxla

M = mpmath
# name: ((low, high), mpmath reference or None: the function itself in float64 only)
FUNCTIONS: dict[str, tuple[tuple[float, float], Callable[[Any], Any] | None]] = {
    "exp": ((-87, 88), M.exp),
    "expm1": ((-20, 88), M.expm1),
    "exp2": ((-120, 120), lambda v: M.power(2, v)),
    "log": ((1e-30, 1e30), M.log),
    "log1p": ((-0.999, 1e6), M.log1p),
    "log2": ((1e-30, 1e30), lambda v: M.log(v, 2)),
    "log10": ((1e-30, 1e30), M.log10),
    "sqrt": ((0, 1e30), M.sqrt),
    "rsqrt": ((1e-30, 1e30), lambda v: 1 / M.sqrt(v)),
    "sin": ((-100, 100), M.sin),
    "cos": ((-100, 100), M.cos),
    "tan": ((-1.5, 1.5), M.tan),
    "asin": ((-1, 1), M.asin),
    "acos": ((-1, 1), M.acos),
    "atan": ((-1e4, 1e4), M.atan),
    "sinh": ((-88, 88), M.sinh),
    "cosh": ((-88, 88), M.cosh),
    "tanh": ((-20, 20), M.tanh),
    "asinh": ((-1e30, 1e30), M.asinh),
    "acosh": ((1, 1e30), M.acosh),
    "atanh": ((-0.9999, 0.9999), M.atanh),
    "sigmoid": ((-80, 80), lambda v: 1 / (1 + M.exp(-v))),
    "erf": ((-5, 5), M.erf),
    "erfc": ((-5, 26), M.erfc),
    "erfinv": ((-0.9999, 0.9999), M.erfinv),
    "special.ndtri": ((1e-6, 0.999999), lambda v: M.sqrt(2) * M.erfinv(2 * v - 1)),
    "special.log_ndtr": ((-30, 10), lambda v: M.log(M.ncdf(v))),
    "special.erfcx": ((-9, 40), lambda v: M.exp(v * v) * M.erfc(v)),
    "special.i0e": ((-80, 80), lambda v: M.besseli(0, v) * M.exp(-abs(v))),
    "special.i1e": ((-80, 80), lambda v: M.besseli(1, v) * M.exp(-abs(v))),
    "lgamma": ((0.01, 1e3), M.loggamma),
    "nn.functional.softplus": ((-80, 80), lambda v: M.log1p(M.exp(v))),
    "nn.functional.silu": ((-80, 80), lambda v: v / (1 + M.exp(-v))),
}


def _function(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    obj: Any = torch
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _grid(low: float, high: float, n: int) -> torch.Tensor:
    if low > 0 and high / low > 1e6:
        return torch.logspace(math.log10(low), math.log10(high), n, dtype=torch.float64)
    return torch.linspace(low, high, n, dtype=torch.float64)


def _ulps(got: torch.Tensor, ref: torch.Tensor, bits: int, keep: torch.Tensor) -> torch.Tensor:
    tiny = 2.0**-126 if bits < 30 else 2.0**-1022  # (the smallest normal number's spacing below)
    spacing = torch.exp2(torch.floor(torch.log2(ref.abs().clamp(min=tiny))) - bits)
    return ((got - ref).abs() / spacing)[keep]


def scan(
    dtype: torch.dtype, names: list[str], points: int
) -> list[tuple[str, float, float, float]]:
    """(name, eager's worst ulps, lazyxla's worst ulps, the argument of lazyxla's worst)."""
    bits = -int(math.log2(torch.finfo(dtype).eps))  # mantissa bits: 23, 52
    rows = []
    dev = lazyxla.device()
    for name in names:
        (low, high), exact = FUNCTIONS[name]
        fn = _function(name)
        x = _grid(low, high, points).to(dtype)
        if dtype == torch.float64 and exact is not None:
            with mpmath.workdps(40):
                ref = torch.tensor(
                    [float(exact(M.mpf(v))) for v in x.tolist()], dtype=torch.float64
                )
        else:
            ref = fn(x.double())
        eager = fn(x).double()
        got = fn(x.to(dev)).cpu().double()
        keep = torch.isfinite(ref) & (ref.abs() > 1e-30)
        e, g = _ulps(eager, ref, bits, keep), _ulps(got, ref, bits, keep)
        worst = int(g.argmax())
        rows.append((name, e.max().item(), g.max().item(), x[keep][worst].item()))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=["float32", "float64"], nargs="*")
    parser.add_argument("--only", nargs="*", help="function names (default: all)")
    parser.add_argument("--points", type=int, default=2001, help="grid points per function")
    args = parser.parse_args(argv)
    names = args.only or list(FUNCTIONS)
    console = Console()
    for dname in args.dtype or ["float32", "float64"]:
        table = Table(title=f"{dname}: worst error in ulps (reference: float64 / mpmath)")
        for col in ("function", "eager", "lazyxla", "at x", ""):
            table.add_column(col, justify="left" if col == "function" else "right")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows = scan(getattr(torch, dname), names, args.points)
        for name, e, g, at in rows:
            flag = "[bold red]worse[/]" if g > max(4.0, 2 * e) else ""
            table.add_row(name, f"{e:.1f}", f"{g:.1f}", f"{at:.4g}", flag)
        console.print(table)


if __name__ == "__main__":
    main()
