"""torch_xla's metrics_compare_utils: parse metrics reports and flag values that left their range.

A report is the text `metrics_report()` prints. `parse_metrics_report` turns it into
`{'<Metric>__<field>[_unit]': number}`: times become seconds (`_sec`), sizes megabytes (`_mb`),
counters `'<Counter>__Value'`. `compare_metrics` checks one report against the mean and standard
deviation of earlier ones.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np

_PERCENTILES = (1, 5, 10, 20, 50, 80, 90, 95, 99)
_SERVER_PERCENTILES = {
    25: 20,
    50: 50,
    80: 80,
    90: 90,
    95: 95,
    99: 99,
}  # server reports start at 25%
_METRIC = re.compile(
    r"Metric: (?P<name>\S+)\s+TotalSamples: (?P<samples>\d+)\s+Accumulator: (?P<acc>\S+)"
    r"[^P]+Percentiles: (?P<pct>[^\n]*)"
)
_COUNTER = re.compile(r"Counter: (\S+)\s+Value: (\d+)")
_TIME_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
_SIZE_UNITS = {"PB": 1e9, "TB": 1e6, "GB": 1e3, "MB": 1.0, "KB": 1e-3, "B": 1e-6}
_TIME_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|d|h|m|s)")
_SIZE_PART = re.compile(r"(\d+(?:\.\d+)?)(PB|TB|GB|MB|KB|B)")
_TIME = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|us|d|h|m|s))+$")
_SIZE = re.compile(r"^(?:\d+(?:\.\d+)?(?:PB|TB|GB|MB|KB|B))+$")


def _number(text: str) -> tuple[float, str]:
    """`text` as (value, unit): a plain number, a duration in seconds or a size in megabytes."""
    try:
        return float(text), ""
    except ValueError:
        pass
    if _TIME.match(text):
        return sum(float(v) * _TIME_UNITS[u] for v, u in _TIME_PART.findall(text)), "sec"
    if _SIZE.match(text):
        return sum(float(v) * _SIZE_UNITS[u] for v, u in _SIZE_PART.findall(text)), "mb"
    raise ValueError(f"Unknown metric_str format: {text}")


def parse_metrics_report(report: str, dehumanize: bool = True) -> dict[str, Any]:
    """`{'<Metric>__<field>[_unit]': value, '<Counter>__Value': int}` from a metrics report.

    With `dehumanize=False` each metric value is `(number, the text it was parsed from)`.
    """
    points: dict[str, Any] = {}
    for m in _METRIC.finditer(report):
        fields = {"TotalSamples": m.group("samples"), "Accumulator": m.group("acc")}
        for pct, value in re.findall(r"(\d+)%=([^;\s]+)", m.group("pct")):
            p = int(pct)
            if m.group("pct").startswith("25%"):
                p = _SERVER_PERCENTILES.get(p, p)
            if p in _PERCENTILES:
                fields[f"Percentile_{p}"] = value
        for field, text in fields.items():
            value, unit = _number(text)
            key = f"{m.group('name')}__{field}" + (f"_{unit}" if unit else "")
            points[key] = value if dehumanize else (value, text)
    for name, value in _COUNTER.findall(report):
        points[f"{name}__Value"] = int(value)
    return points


def get_data_points_from_metrics_reports(reports: list[str]) -> dict[str, list[Any]]:
    """Per metric key, its value in each report in order (None where a report lacks it)."""
    points: dict[str, list[Any]] = defaultdict(lambda: [None] * len(reports))
    for i, report in enumerate(reports):
        for key, value in parse_metrics_report(report).items():
            points[key][i] = value
    return points


def _aggregates(points: dict[str, list[Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for key, values in points.items():
        present = [v for v in values if v is not None]
        if present:
            out[key] = {"mean": float(np.mean(present)), "stddev": float(np.std(present))}
    return out


def compare_metrics(
    data_points: dict[str, list[Any]],
    metrics_report: str,
    config: dict[str, str] | None = None,
) -> str:
    """One line per metric of `metrics_report` outside its historical range, and per new `aten::`
    counter (a new CPU fallback).

    `config['base_expression']` (default `'v <= v_mean + (v_stddev * 2.0)'`) is a Python
    expression over `v`, `v_mean`, `v_stddev`; `config['<key>_expression']` overrides it for a
    key.
    """
    config = config or {"base_expression": "v <= v_mean + (v_stddev * 2.0)"}
    aggregates = _aggregates(data_points)
    lines = []
    for key, v in sorted(parse_metrics_report(metrics_report).items()):
        if key not in aggregates:
            if key.startswith("aten::"):
                lines.append(f"Found new aten counter: {key}: {v}\n")
            continue
        mean, stddev = aggregates[key]["mean"], aggregates[key]["stddev"]
        expression = config.get(f"{key}_expression", config["base_expression"])
        if not eval(expression, {}, {"v": v, "v_mean": mean, "v_stddev": stddev}):
            lines.append(
                f"{key} failed its expression check. Expression: {expression}.  "
                f"Mean: {mean}.  Stddev: {stddev}.  Actual Value: {v}\n"
            )
    return "".join(lines)
