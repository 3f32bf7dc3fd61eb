"""The verdict code of examples/linearize_mnist1d.py on synthetic runs tables: C1 from the matched
channel − layer differences (after and before recovery, at matched NAPL and fraction), C2 from the
per-seed gap of the plain start minus that of the residual start."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pandas as pd
import pytest

from simkit.stats import paired_difference, verdict
from tests.helpers import ROOT

PATH = ROOT / "examples" / "linearize_mnist1d.py"


def example():
    spec = importlib.util.spec_from_file_location("linearize_mnist1d_example", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runs(layer_napl: list[float], channel: list[tuple[float, float]], gaps: list[float], units: int = 4) -> pd.DataFrame:
    """Runs of seeds 0..len(gaps)-1: layer-wise runs at ``layer_napl`` (accuracy 0.5 + 0.1·NAPL), channel-wise
    runs at ``channel`` (NAPL, accuracy) shifted by the seed's gap; accuracy_recovered = accuracy + 0.05
    for channel-wise runs and + 0.02 for layer-wise ones. The fraction linearized is 1 − NAPL / units."""
    rows = []
    for seed, gap in enumerate(gaps):
        for k, napl in enumerate(layer_napl):
            acc = 0.5 + 0.1 * napl
            rows.append((seed, "layer", 0.1 * (k + 1), napl, 1 - napl / units, acc, acc + 0.02))
        for k, (napl, acc) in enumerate(channel):
            rows.append((seed, "channel", 0.01 * (k + 1), napl, 1 - napl / units, acc + gap, acc + gap + 0.05))
    return pd.DataFrame(rows, columns=["seed", "granularity", "omega", "napl", "linearized_fraction", "accuracy",
                                       "accuracy_recovered"])


def test_claim_1_reads_the_matched_tables_with_their_intervals():
    m = example()
    gaps = [0.10, 0.12, 0.08]
    # channel-wise runs on the layer-wise line (0.5 + 0.1·NAPL) plus the seed's gap: the difference is the gap
    tables = m.matched(runs([3.0, 2.0, 1.0], [(3.5, 0.85), (2.5, 0.75), (1.5, 0.65), (0.5, 0.55)], gaps))
    per_seed, over = tables["napl", "after recovery"]
    at2 = over[over["napl"] == 2.0].iloc[0]
    expected = paired_difference(np.array(gaps) + 0.05 + 0.7, np.full(3, 0.7 + 0.02))
    assert at2["difference_mean"] == pytest.approx(expected.mean)
    assert (at2["difference_low"], at2["difference_high"]) == pytest.approx((expected.low, expected.high))
    lines = m.claim_1(tables, 4.0)
    headline = [line for line in lines if "headline" in line]
    assert len(headline) == 1 and "after recovery, napl 2:" in headline[0]
    assert headline[0].endswith(f"→ {verdict(expected)} ← headline") and verdict(expected) == "reproduced"
    assert f"{100 * expected.mean:+.1f} pt [{100 * expected.low:+.1f}, {100 * expected.high:+.1f}]" in headline[0]
    # every interior point on both axes, after and before recovery: NAPL 1, 2, 3 and fractions 0.25, 0.5, 0.75
    assert sum("napl" in line for line in lines) == 6 and sum("linearized_fraction" in line for line in lines) == 6
    before = [line for line in lines if line.startswith("   before recovery, napl 2:")][0]
    assert f"{100 * float(np.mean(gaps)):+.1f} pt" in before


def test_claim_2_pairs_the_gaps_of_the_two_starts_by_seed():
    m = example()
    plain = m.matched(runs([3.0, 2.0, 1.0], [(3.5, 0.85), (2.5, 0.75), (1.5, 0.65), (0.5, 0.55)], [0.10, 0.15, 0.20]))
    residual = m.matched(runs([2.0, 1.5, 1.0], [(2.25, 0.725), (1.75, 0.675), (1.25, 0.625), (0.75, 0.575)],
                              [0.01, 0.07, 0.02]))
    lines = m.claim_2(plain, residual, 2.5)
    headline = [line for line in lines if "headline" in line]
    assert len(headline) == 1 and "after recovery, napl 2:" in headline[0]
    # after recovery both gaps gain 0.03 (0.05 − 0.02): the difference of gaps is the same as before
    expected = paired_difference([0.10, 0.15, 0.20], [0.01, 0.07, 0.02])
    assert f"plain − residual {100 * expected.mean:+.1f} pt [{100 * expected.low:+.1f}, " in headline[0]
    assert headline[0].endswith(f"→ {verdict(expected)} ← headline")
    # NAPL 1 and 2 are common to both starts (1.5 and 3 are not); fraction: 0.5 and 0.75 (plain 0.25, 0.5,
    # 0.75; residual 0.5, 0.625, 0.75)
    napls = [line.split(":")[0] for line in lines if ", napl " in line]
    assert napls == ["   after recovery, napl 1", "   after recovery, napl 2", "   before recovery, napl 1",
                     "   before recovery, napl 2"]
    assert sum(", linearized_fraction " in line for line in lines) == 4


def test_the_residual_gap_larger_than_the_plain_one_is_not_reproduced():
    m = example()
    plain = m.matched(runs([2.0], [(2.5, 0.75), (1.5, 0.65)], [0.01, 0.02, 0.00]))
    residual = m.matched(runs([2.0], [(2.5, 0.75), (1.5, 0.65)], [0.10, 0.12, 0.11]))
    text, word = m.gap_difference(plain["napl", "after recovery"][0], residual["napl", "after recovery"][0], "napl", 2.0)
    assert word == "not reproduced" and "over 3 seeds" in text


def test_start_text_names_the_omegas_behind_each_matched_point():
    m = example()
    table = runs([2.0], [(2.5, 0.75), (1.5, 0.65)], [0.1, 0.1])
    aggregate = pd.DataFrame([{"run": "layer ω=1.6", "granularity": "layer", "omega": 1.6, "seeds": 2,
                               **{f"{c}_{s}": 0.5 for c in ("napl", "linearized_fraction", "mean_abs_one_minus_alpha",
                                                             "accuracy", "accuracy_recovered") for s in ("mean", "std")},
                               **{f"recovery_gain_{s}": 0.01 for s in ("mean", "low", "high")}}])
    text = "\n".join(m.start_text("plain", aggregate, [0.9, 0.91], m.matched(table), 4.0))
    assert "0.01 | 0.02" in text                # the channel-wise ω on both sides of the interpolation
    assert re.search(r"layer ω=1.6 +0.1 ", text)   # u = ω / 16 for a layer-wise run
