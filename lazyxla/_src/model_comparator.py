"""torch_xla's `torch_xla.debug.model_comparator` (`mc`): save named intermediate tensors of two
runs of a model (say on the CPU and on the device, or before and after a change) and report where
they differ.

`configure(save_dir)` (or the `MODELCMP_SAVEDIR` environment variable) turns saving on; with no
directory `save` is a no-op that returns its tensor, so the calls can stay in a model. Each
`save(name, t)` writes `t` (on the CPU) to `save_dir/name.<k>`, `k` counting that name's saves
(per step, under `step-<n>/`, when `step=` is given); `name=None` names it after the caller's file
and line. `compare(dir1, dir2)` returns a report of every file present in only one directory and
the largest element differences (beyond `rtol`/`atol`) of the rest; an empty report means equal.
Run as a program (`python -m lazyxla.debug.model_comparator DIR1 DIR2`) it prints the report and
exits 1 when there is one.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import torch

_save_dir: str | None = None
_ids: dict[str, int] = {}
_step: int | None = None


def _is_master_ordinal() -> bool:
    from . import runtime_api

    return runtime_api.local_ordinal() == 0


def _index_of(sizes: Sequence[int], flat: int) -> list[int]:
    index = []
    for size in reversed(sizes):
        index.append(flat % size)
        flat //= size
    return index[::-1]


def _save_dir_now() -> str | None:
    return _save_dir if _save_dir is not None else os.environ.get("MODELCMP_SAVEDIR")


def _caller_name() -> str:
    here = os.path.basename(__file__)
    for frame in reversed(traceback.extract_stack(limit=8)[:-1]):
        if os.path.basename(frame.filename) != here:
            return f"{os.path.basename(frame.filename)}.l{frame.lineno}"
    return "noname"


def compare_tensors(
    tensor1: torch.Tensor,
    tensor2: torch.Tensor,
    rtol: float = 1e-05,
    atol: float = 1e-08,
    max_diffs: int = 25,
) -> str:
    """A report of the elements of two tensors that differ by more than `max(rtol*|v|, atol)`,
    largest first (at most `max_diffs` lines); '' if none do."""
    sizes1, sizes2 = list(tensor1.size()), list(tensor2.size())
    if sizes1 != sizes2:
        return f"Tensors have different shape: {sizes1} vs. {sizes2}\n"
    values1 = tensor1.detach().cpu().flatten().tolist()
    values2 = tensor2.detach().cpu().flatten().tolist()
    diffs = []
    for i, (v1, v2) in enumerate(zip(values1, values2)):
        error = abs(v1 - v2)
        if error > max(max(abs(v1), abs(v2)) * rtol, atol):
            diffs.append((error, i, v1, v2))
    diffs.sort(key=lambda d: d[0], reverse=True)
    report = "".join(
        f"{_index_of(sizes1, i)}: {v1} vs. {v2}\terror={error}\n"
        for error, i, v1, v2 in diffs[:max_diffs]
    )
    if len(diffs) > max_diffs:
        report += f"... aborting after {max_diffs} differences\n"
    return report


def configure(save_dir: str | None) -> None:
    """Save into `save_dir` from now on (None: stop saving); restarts the per-name counters."""
    global _save_dir, _ids, _step
    _save_dir, _ids, _step = save_dir, {}, None


def save(name: str | None, tensor: torch.Tensor, step: int | None = None) -> torch.Tensor:
    """Save `tensor` as the next `name.<k>` in the configured directory; returns `tensor`."""
    global _ids, _step
    save_dir = _save_dir_now()
    if save_dir is None:
        return tensor
    data = tensor.detach().cpu()
    if not _is_master_ordinal():
        return tensor
    name = _caller_name() if name is None else name
    path = save_dir
    if step is not None:
        path = os.path.join(save_dir, f"step-{step}")
        os.makedirs(path, exist_ok=True)
        if step != _step:
            _step, _ids = step, {}
    k = _ids.get(name, 0)
    _ids[name] = k + 1
    torch.save(data, os.path.join(path, f"{name}.{k}"))
    return tensor


def _saved_files(path: str) -> set[str]:
    """The saved tensors under `path`, relative to it (`step-<n>/` included)."""
    out = set()
    for root, _, files in os.walk(path):
        for f in files:
            if re.match(r".*\.\d+$", f):
                out.add(os.path.relpath(os.path.join(root, f), path))
    return out


def _parse_path(path: str) -> tuple[str, int, int | None]:
    name_k = re.match(r"(.*)\.(\d+)$", os.path.basename(path))
    if name_k is None:
        raise ValueError(f"{path} is not a saved tensor (expected NAME.<k>)")
    m = re.match(r"step-(\d+)$", os.path.basename(os.path.dirname(path)))
    return name_k.group(1), int(name_k.group(2)), int(m.group(1)) if m else None


def tensor_file_compare(
    path1: str, path2: str, rtol: float = 1e-05, atol: float = 1e-08, max_diffs: int = 25
) -> str:
    """`compare_tensors` of two saved files, headed by the tensor's name, id and step."""
    report = compare_tensors(
        torch.load(path1), torch.load(path2), rtol=rtol, atol=atol, max_diffs=max_diffs
    )
    if not report:
        return ""
    name, k, step = _parse_path(path1)
    at = f" at step={step}" if step else ""
    head = f'Changes in saved tensor "{name}" with id={k}{at}\n'
    return head + "".join(f"  {line}\n" for line in report.split("\n"))


def compare(
    save_dir1: str, save_dir2: str, rtol: float = 1e-05, atol: float = 1e-08, max_diffs: int = 25
) -> str:
    """The differences between two save directories ('' if they hold equal tensors)."""
    files1, files2 = _saved_files(save_dir1), _saved_files(save_dir2)
    report = ""
    for f in sorted(files1):
        if f not in files2:
            report += f"Mismatch: {f} not in {save_dir2}\n"
        else:
            report += tensor_file_compare(
                os.path.join(save_dir1, f),
                os.path.join(save_dir2, f),
                rtol=rtol,
                atol=atol,
                max_diffs=max_diffs,
            )
    for f in sorted(files2 - files1):
        report += f"Mismatch: {f} not in {save_dir1}\n"
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtol", type=float, default=1e-05)
    parser.add_argument("--atol", type=float, default=1e-08)
    parser.add_argument("--max_diffs", type=int, default=25)
    parser.add_argument("savedir1", metavar="SAVEDIR1", help="the first run's save directory")
    parser.add_argument("savedir2", metavar="SAVEDIR2", help="the second run's save directory")
    args: Any = parser.parse_args(argv)
    report = compare(args.savedir1, args.savedir2, args.rtol, args.atol, args.max_diffs)
    if report:
        print(report, file=sys.stderr)
        return 1
    return 0
