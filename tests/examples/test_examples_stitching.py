"""The logic of the stitching examples (issue #24): the planted patch, and claims assembled from a tiny
synthetic stitching table by the paired-difference verdict rule."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
import torch

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "examples"))

import stitching_robust as robust  # noqa: E402
import stitching_shortcut as shortcut  # noqa: E402


def test_edge_corners_are_distinct_inside_the_image_and_on_the_side_edges():
    corners = shortcut.edge_corners(8, 3, 10)
    assert len(set(corners)) == 10
    for r, c in corners:
        assert 0 <= r <= 5 and c in (0, 5)


def test_edge_corners_refuse_more_positions_than_fit():
    with pytest.raises(ValueError, match="fewer than"):
        shortcut.edge_corners(6, 3, 10)


def test_plant_patch_sets_exactly_the_square_of_each_sample_and_copies():
    x = torch.zeros(3, 1, 8, 8)
    positions = torch.tensor([0, 4, 9])
    out = shortcut.plant_patch(x, positions)
    assert float(x.abs().sum()) == 0  # the input is not modified
    for i, p in enumerate(positions.tolist()):
        r, c = shortcut.PATCH_CORNERS[p]
        expected = torch.zeros(8, 8)
        expected[r:r + 3, c:c + 3] = 1.0
        assert torch.equal(out[i, 0], expected)


def _table(gaps: dict[tuple[str, str], list[float]], seeds: int = 5, noise: float = 0.0) -> pd.DataFrame:
    """A stitching table: for every (pair, setting) the penalties of every seed, objective and layer are
    a base of 0.02 plus ``gaps[(pair, setting)][seed]`` (fractions), plus uniform noise."""
    rng = np.random.default_rng(0)
    rows = []
    for (pair, setting), per_seed in gaps.items():
        for seed in range(seeds):
            for layer in shortcut.LAYERS:
                for objective in shortcut.ALL_OBJECTIVES:
                    if objective == "fula" and layer == shortcut.LAYERS[-1]:
                        continue
                    value = 0.02 + per_seed[seed] + noise * rng.uniform(-1, 1)
                    rows.append({"pair": pair, "setting": setting, "seed": seed, "layer_a": layer,
                                 "objective": objective, "penalty": value, "penalty_min": value})
    return pd.DataFrame(rows)


def _shortcut_gaps(iri_gap: list[float], std_gap: list[float], exploit: list[float],
                   iri_exploit: list[float]) -> dict[tuple[str, str], list[float]]:
    zero = [0.0] * 5
    gaps = {}
    for setting, gap in (("standard", std_gap), ("iri", iri_gap)):
        gaps[("A->A2", setting)] = zero
        gaps[("S->S2", setting)] = zero
        gaps[("A->S", setting)] = gap
        gaps[("S->A", setting)] = gap
    gaps[("A->A2 (wrong patch)", "standard")] = exploit
    gaps[("A->A2 (wrong patch)", "iri")] = iri_exploit
    return gaps


def test_shortcut_claims_follow_the_paired_rule():
    table = _table(_shortcut_gaps(iri_gap=[0.20, 0.25, 0.22, 0.30, 0.24], std_gap=[0.01, 0.0, 0.02, 0.01, 0.0],
                                  exploit=[0.08, 0.10, 0.09, 0.07, 0.11], iri_exploit=[0.01, 0.02, 0.0, 0.01, 0.02]))
    verdicts = {c.name: c.verdict() for c in shortcut.claims(table, set(), shortcut.LAYERS)}
    assert verdicts == {"Claim 1": "reproduced", "Claim 2": "reproduced", "Claim 2b": "reproduced",
                        "Claim 3": "reproduced"}


def test_shortcut_claims_fail_direction_only_and_gate():
    # standard gaps of ~6 points: claim 1 fails (not below +5); IRI gaps straddle 10: direction only at best
    table = _table(_shortcut_gaps(iri_gap=[0.02, 0.25, 0.05, 0.30, 0.01], std_gap=[0.06] * 5,
                                  exploit=[0.03] * 5, iri_exploit=[0.0] * 5), noise=0.005)
    found = {c.name: c for c in shortcut.claims(table, set(), shortcut.LAYERS)}
    assert found["Claim 1"].verdict() == "not reproduced"
    assert found["Claim 2"].verdict() == "direction only"  # mean 12.6 > 10, interval reaches below
    assert found["Claim 3"].verdict().startswith("not testable here")  # standard exploitation 3 < 5 points
    first = found["Claim 1"].comparisons[0]
    assert first.per_seed.tolist() == pytest.approx([6.0] * 5, abs=1.0)


def test_failed_precondition_blocks_the_claims_it_needs():
    table = _table(_shortcut_gaps(iri_gap=[0.2] * 5, std_gap=[0.0] * 5, exploit=[0.1] * 5, iri_exploit=[0.0] * 5),
                   noise=0.01)
    found = {c.name: c.verdict() for c in shortcut.claims(table, {"S"}, shortcut.LAYERS)}
    assert found["Claim 1"].startswith("precondition failed")
    assert found["Claim 3"] == "reproduced"  # claim 3 needs only A and A2


def test_compare_upper_bound_and_units():
    left, right = pd.Series([0.05, 0.06, 0.04]), pd.Series([0.02, 0.02, 0.02])
    below = shortcut.compare("x", left, right, False, -5.0)  # claimed: difference < +5 points
    assert below.interval.mean == pytest.approx(3.0)
    assert below.verdict in ("reproduced", "direction only")
    assert "claimed < +5" in below.line()
    raw = shortcut.compare("y", pd.Series([1.0, 2.0]), pd.Series([0.5, 0.5]), True, 0.0, points=False)
    assert raw.interval.mean == pytest.approx(1.0) and "pts" not in raw.line()


def test_robust_claims_order_and_preconditions():
    gaps = {}
    for setting in ("standard", "iri"):
        big = setting == "iri"
        gaps[("R->R2", setting)] = [0.0] * 3
        gaps[("R->N", setting)] = [0.05 if big else 0.0, 0.06 if big else 0.01, 0.07 if big else 0.0]
        gaps[("N->R", setting)] = [0.20 if big else 0.01, 0.22 if big else 0.0, 0.25 if big else 0.01]
        gaps[("N->N2", setting)] = [0.30 if big else 0.0, 0.28 if big else 0.01, 0.33 if big else 0.0]
    table = _table(gaps, seeds=3)
    assert [c.verdict() for c in robust.claims(table, set())] == ["reproduced"] * 3
    assert all(v.startswith("precondition failed for N") for v in (c.verdict() for c in robust.claims(table, {"N"})))


def test_s1_is_decided_by_hlm_and_slm_alone_and_dm_is_reported_apart():
    table = _table(_shortcut_gaps(iri_gap=[0.0] * 5, std_gap=[0.01, 0.0, 0.02, 0.01, 0.0],
                                  exploit=[0.0] * 5, iri_exploit=[0.0] * 5), noise=0.002)
    far = table["pair"].isin(["A->S", "S->A"]) & (table["objective"] == "dm")
    table.loc[far, ["penalty", "penalty_min"]] += 0.12  # DM rates clean<->shortcut 12 points worse
    found = {c.name: c.verdict() for c in shortcut.claims_by_objective(table, set())}
    names = list(found)
    assert names[:3] == ["S1 (HLM)", "S1 (SLM)", "S1 overall"] and len(names) == 5
    assert [found[n] for n in names[:3]] == ["reproduced"] * 3
    dm = next(n for n in names if n.startswith("DM"))
    assert found[dm] == "not reproduced" and "decides nothing" in dm
    assert all(v.startswith("precondition failed") for v in
               (c.verdict() for c in shortcut.claims_by_objective(table, {"S"})))
