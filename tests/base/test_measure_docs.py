"""The documentation's measure table (docs/measures-table.md) is generated from the catalogue and stays equal
to it; it is torch-free, as the catalogue is."""

from __future__ import annotations

import subprocess
import sys

from simkit.catalog import BUILT_IN_METRICS, MEASURE_SETTINGS, MEASURES
from simkit.catalog_docs import measures_markdown
from tests.helpers import ROOT

PAGE = ROOT / "docs" / "measures-table.md"


def test_the_committed_measure_table_is_the_generated_one():
    assert PAGE.read_text(encoding="utf-8") == measures_markdown(), \
        "regenerate: python -m simkit.catalog_docs > docs/measures-table.md"


def test_every_measure_and_setting_has_its_row_with_the_catalogue_values():
    text = measures_markdown()
    for name in BUILT_IN_METRICS:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        assert MEASURES[name].range_text.replace("|", "\\|") in row
        assert " / ".join(MEASURES[name].chance) in row and " / ".join(MEASURES[name].stream) in row
        for invariance in MEASURES[name].invariances:
            assert invariance in row
    for name in MEASURE_SETTINGS:
        assert f"| `{name}` (" in text


def test_the_generator_runs_without_torch():
    code = ("import sys, simkit.catalog_docs as d; d.measures_markdown(); "
            "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
