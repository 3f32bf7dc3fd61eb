"""The catalogue of measures (simkit.catalog) is the one list: the docs' table, the CLI help, the
accumulator's routing, the report's ranges and notes and the recorded settings all agree with it."""

from __future__ import annotations

import re

import numpy as np
import pytest
from typer.testing import CliRunner

from simkit.catalog import (
    BUILT_IN_METRICS,
    DEFAULT_METRICS,
    MEASURES,
    METRICS,
    STRATEGIES,
    chance_kind,
    colour_bounds,
    strategy,
    used_by,
)
from simkit.cli.main import app
from simkit.metrics.streaming import make_accumulator
from simkit.report.compare import colour_range
from simkit.settings.compare import MEASURE_FIELDS, CompareSettings
from tests.helpers import ROOT

GUIDE = ROOT / "docs" / "measures.md"   # "Choosing a measure" (moved there from the README)


def guide_measures() -> dict[str, str]:
    """``{name: range}`` from the table of docs/measures.md ("Choosing a measure")."""
    text = GUIDE.read_text(encoding="utf-8")
    table = text[text.index("| measure (`--metric`)"):]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[re.match(r"`(\w+)`", cells[0]).group(1)] = cells[1]
    return rows


def test_the_guide_table_lists_every_measure_with_the_catalogue_range():
    """Every built-in measure (an installed plug-in is in METRICS, not in simkit's docs)."""
    rows = guide_measures()
    assert list(rows) == list(BUILT_IN_METRICS) == [m for m in METRICS if MEASURES[m].function is None]
    assert {name: MEASURES[name].range_text for name in BUILT_IN_METRICS} == rows


def test_the_metric_help_lists_every_measure_and_the_defaults():
    out = CliRunner().invoke(app, ["compare", "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"}).output
    flat = " ".join(out.replace("│", " ").split())   # rich wraps long help inside its box
    for name in METRICS:
        assert name in flat
    assert f"default: {','.join(DEFAULT_METRICS)}" in flat  # as the user would type it


def test_every_measure_is_routed_to_the_strategy_the_catalogue_names():
    for mode in ("minibatch", "exact"):
        for name in METRICS:
            acc = make_accumulator(CompareSettings(metrics=[name], mode=mode, null=0), [3, 2], [4])
            where = {"MinibatchPart": "gram", "FeaturePart": "features", "FoldPart": "folds",
                     "StoredPart": "stored"}
            assert [where[type(p).__name__] for p in acc.parts] == [strategy(name, mode)], (name, mode)
            assert strategy(name, mode) in STRATEGIES


def test_a_null_or_a_small_budget_sends_streamed_measures_to_the_stored_strategy():
    for name in METRICS:
        if strategy(name, "exact") in ("features", "folds"):
            for changes in ({"null": 2}, {"memory_budget_bytes": 1}):
                acc = make_accumulator(CompareSettings(metrics=[name], mode="exact", **changes), [3], [4])
                assert [type(p).__name__ for p in acc.parts] == ["StoredPart"]
                assert acc.describe()[name]["path"].startswith("stored")


def test_the_default_null_follows_the_catalogue():
    cheap = [m for m in METRICS if chance_kind(m, "minibatch") == "null"]
    assert cheap == ["linear_cka", "unbiased_cka", "rbf_cka"]
    assert default_null(cheap, "minibatch") == dict.fromkeys(cheap, 10)
    assert default_null(cheap, "exact") == {"linear_cka": 0, "unbiased_cka": 0, "rbf_cka": 5}
    assert default_null(["unbiased_cka", "cca", "procrustes"], "minibatch") == {
        "unbiased_cka": 10, "cca": 0, "procrustes": 5}


def default_null(metrics: list[str], mode: str) -> dict[str, int]:
    """The permutations ``null=None`` resolves to, per measure, as a run records them."""
    return CompareSettings(metrics=metrics, mode=mode).validate().resolved()["null"]
    assert chance_kind("cca", "exact", cca_eps=0.1) == "sampled"  # the closed form holds without a ridge
    assert CompareSettings(metrics=["cca"], null=3).validate().resolved()["null"] == {"cca": 3}


def test_settings_are_recorded_only_for_the_measures_they_change():
    for field in MEASURE_FIELDS:
        users = used_by(field)
        assert users, field
        assert field in CompareSettings(metrics=[users[0]]).to_dict()
        others = [m for m in METRICS if m not in users]
        assert field not in CompareSettings(metrics=others).to_dict()


@pytest.mark.parametrize("name", METRICS)
def test_report_colour_ranges_come_from_the_catalogue(name):
    lo, hi = colour_bounds(name)
    got = colour_range(name, np.array([0.2, 0.3]))
    measure = MEASURES[name]
    if measure.lo is None or measure.hi is None or measure.lo < 0:  # unbounded or signed: the data's range
        assert (lo, hi) == (None, None) and got == (None, None)
    else:
        assert got == (MEASURES[name].lo, MEASURES[name].hi)
