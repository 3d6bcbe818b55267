"""PyTorch's OpInfo database on lazyxla vs eager CPU (see lazyxla/tools/op_coverage.py).

Default (CI): the first samples of every `op_db` entry in its primary dtype and one sample in each
of bfloat16/float16/int64/bool/float64/complex64/uint8 it supports; each entry's status must equal
the one committed in docs/op_coverage.md (regenerate it with `python -m lazyxla.tools.op_coverage`),
and no entry may fail. `make test-ops-full` (LAZYXLA_OPINFO_FULL=1): every sample in each of those
dtypes, no entry may fail. The entries are split over this file and test_opinfo_part2.py so that
`--dist loadfile` runs them on two workers.
"""

from __future__ import annotations

import os

import pytest

from lazyxla.tools import op_coverage as oc
from lazyxla.tools import op_coverage_report as ocr

FULL = os.environ.get("LAZYXLA_OPINFO_FULL") == "1"
NSHARDS = 2


def _committed() -> dict[str, tuple[str, str]]:
    with open(oc.DOC_PATH) as f:
        return {r.key: (r.status, r.grad) for r in ocr.parse_markdown(f.read())}


def shard(i: int) -> list[str]:
    return ocr.doc_keys()[i::NSHARDS]


def check_entry(key: str) -> None:
    r = oc.run_entry(key, full=FULL)
    assert r.status != oc.FAILS, f"{key}: {r.reason}"
    assert r.grad != oc.FAILS, f"{key} gradient: {r.grad_reason}"
    if not FULL:
        want = _committed()[key]
        assert (r.status, r.grad) == want, (
            f"{key}: now {r.status}/{r.grad} ({r.reason or r.grad_reason}), docs/op_coverage.md "
            f"says {want[0]}/{want[1]}: run `python -m lazyxla.tools.op_coverage`"
        )


@pytest.mark.parametrize("key", shard(0))
def test_opinfo(key):
    check_entry(key)


def test_report_is_current():
    """The committed report lists exactly op_db's entries, and is what the renderer makes of its
    own rows (totals, header); each row's status is checked live by test_opinfo."""
    with open(oc.DOC_PATH) as f:
        text = f.read()
    results = ocr.parse_markdown(text)
    assert sorted(r.key for r in results) == sorted(oc.op_db())
    assert ocr.render_markdown(results) == text


def test_targets():
    """The issue's acceptance numbers, on the committed (live-checked) statuses."""
    t = ocr.totals(list(ocr.parse_markdown(open(oc.DOC_PATH).read())))
    assert t[oc.FAILS] == 0 and t["grad"][oc.FAILS] == 0
    assert t["native_pct"] >= 90.0
    assert t["native_or_fallback_pct"] >= 97.0
    assert t["grad_match_pct"] >= 85.0


def test_skips_have_reasons():
    for table in (oc.SKIPS, oc.GRAD_SKIPS, oc.UNDEFINED_VALUES):
        for key, reason in table.items():
            assert reason.strip(), key
    for key, (_, reason) in (*oc.TOLERANCES.items(), *oc.UINT8_TOLERANCES.items()):
        assert reason.strip(), key
