"""PyTorch's OpInfo database through torch.compile(backend="lazyxla"), traced then replayed, and
float32 gradients through AOTAutograd's graphs, vs eager CPU (lazyxla/tools/
op_coverage_compiled.py). Split over this file and test_opinfo_compiled_part2.py so that
`--dist loadfile` runs them on two workers."""

from __future__ import annotations

import pytest

from lazyxla.tools import op_coverage as oc
from lazyxla.tools import op_coverage_compiled as occ
from lazyxla.tools import op_coverage_report as ocr

NSHARDS = 2


def shard(i: int) -> list[str]:
    return ocr.doc_keys()[i::NSHARDS]


def check_entry(key: str) -> None:
    why = occ.check(key) or occ.check_grad(key)
    assert why is None, f"{key} through torch.compile(backend='lazyxla'): {why}"


@pytest.mark.parametrize("key", shard(0))
def test_opinfo_compiled(key):
    check_entry(key)


def test_compile_skips_have_reasons():
    for key, reason in {**occ.COMPILE_SKIPS, **oc.LAYOUT_DIFFERS}.items():
        assert reason.strip() and key in ocr.doc_keys(), key
