"""Matched comparisons of another accuracy column (``value``: after recovery) and the channel-wise ω
behind every match (``channel_omega``), at matched NAPL and at equal fraction linearized."""

from __future__ import annotations

import pandas as pd
import pytest

from simkit.linearization import matched_napl, matched_over_seeds

ROWS = [  # seed, granularity, omega, napl, linearized_fraction, accuracy, accuracy_recovered
    (0, "channel", 0.01, 3.0, 0.25, 0.90, 0.93), (0, "channel", 0.02, 3.0, 0.25, 0.88, 0.95),
    (0, "channel", 0.05, 1.0, 0.75, 0.60, 0.80),
    (0, "layer", 0.3, 3.0, 0.25, 0.85, 0.90), (0, "layer", 1.0, 2.0, 0.5, 0.50, 0.70),
    (0, "layer", 3.0, 0.0, 1.0, 0.30, 0.31),
    (1, "channel", 0.01, 3.5, 0.125, 0.92, 0.94), (1, "channel", 0.05, 1.5, 0.625, 0.70, 0.85),
    (1, "layer", 1.0, 2.0, 0.5, 0.40, 0.60)]


def runs() -> pd.DataFrame:
    return pd.DataFrame(ROWS, columns=["seed", "granularity", "omega", "napl", "linearized_fraction", "accuracy",
                                       "accuracy_recovered"])


def test_value_compares_the_recovered_accuracy_with_the_same_matching():
    table = runs()
    recovered = matched_napl(table, value="accuracy_recovered", duplicates="mean")
    # the same as matching a table whose accuracy column holds the recovered accuracies
    swapped = matched_napl(table.assign(accuracy=table["accuracy_recovered"]), duplicates="mean")
    pd.testing.assert_frame_equal(recovered, swapped)
    before = matched_napl(table, duplicates="mean")
    assert not before["layer_accuracy"].equals(recovered["layer_accuracy"])
    seed0 = recovered[recovered["seed"] == 0].set_index("napl")
    # NAPL 3: both channel runs there (mean of 0.93 and 0.95) against the layer run's 0.90
    assert seed0.loc[3.0, "channel_accuracy"] == pytest.approx(0.94)
    assert seed0.loc[3.0, "difference"] == pytest.approx(0.04)
    # NAPL 2: interpolated halfway between NAPL 1 (0.80) and NAPL 3 (0.94)
    assert seed0.loc[2.0, "channel_accuracy"] == pytest.approx(0.87)
    assert seed0.loc[2.0, "layer_accuracy"] == pytest.approx(0.70)
    # seed 1, NAPL 2: a quarter of the way from NAPL 1.5 (0.85) to 3.5 (0.94)
    seed1 = recovered[recovered["seed"] == 1].iloc[0]
    assert seed1["channel_accuracy"] == pytest.approx(0.85 + 0.25 * 0.09)
    over = matched_over_seeds(recovered)
    at2 = over[over["napl"] == 2.0].iloc[0]
    assert at2["matched_seeds"] == 2
    assert at2["difference_mean"] == pytest.approx(((0.87 - 0.70) + (0.85 + 0.0225 - 0.60)) / 2)


def test_channel_omega_names_the_runs_behind_each_match():
    matched = matched_napl(runs(), duplicates="mean")
    seed0 = matched[matched["seed"] == 0].set_index("napl")
    assert seed0.loc[3.0, "how"] == "exact" and seed0.loc[3.0, "channel_omega"] == "0.01, 0.02"
    assert seed0.loc[2.0, "how"] == "interpolated" and seed0.loc[2.0, "channel_omega"] == "0.05 | 0.01, 0.02"
    assert seed0.loc[0.0, "how"] == "nearest" and seed0.loc[0.0, "channel_omega"] == "0.05"
    assert seed0.loc[2.0, "layer_omega"] == "1"
    seed1 = matched[matched["seed"] == 1].iloc[0]
    assert (seed1["how"], seed1["channel_omega"]) == ("interpolated", "0.05 | 0.01")


def test_equal_fraction_linearized_with_the_recovered_accuracy():
    by_fraction = matched_napl(runs(), x="linearized_fraction", value="accuracy_recovered", duplicates="mean")
    assert "napl" not in by_fraction.columns and "channel_omega" in by_fraction.columns
    seed0 = by_fraction[by_fraction["seed"] == 0].set_index("linearized_fraction")
    # fraction 0.5 lies halfway between the channel points at 0.25 (0.94) and 0.75 (0.80)
    assert seed0.loc[0.5, "channel_accuracy"] == pytest.approx(0.87)
    assert seed0.loc[0.5, "channel_omega"] == "0.01, 0.02 | 0.05"
    # seed 1: 0.5 lies between 0.125 (0.94) and 0.625 (0.85): three quarters of the way
    seed1 = by_fraction[by_fraction["seed"] == 1].iloc[0]
    assert seed1["channel_accuracy"] == pytest.approx(0.94 + 0.75 * (0.85 - 0.94))
    over = matched_over_seeds(by_fraction, x="linearized_fraction")
    assert over.loc[over["linearized_fraction"] == 0.5, "matched_seeds"].item() == 2


def test_the_default_match_uses_the_weakest_omega_at_each_point():
    weakest = matched_napl(runs(), value="accuracy_recovered")
    seed0 = weakest[weakest["seed"] == 0].set_index("napl")
    # NAPL 3: the channel run at ω 0.01 alone (0.93), not the mean with ω 0.02's 0.95
    assert seed0.loc[3.0, "channel_accuracy"] == pytest.approx(0.93)
    assert seed0.loc[3.0, "channel_omega"] == "0.01" and seed0.loc[3.0, "channel_runs"] == 2
    # NAPL 2: interpolated halfway between NAPL 1 (0.80) and the weakest run at NAPL 3 (0.93)
    assert seed0.loc[2.0, "channel_accuracy"] == pytest.approx(0.865)
    assert seed0.loc[2.0, "channel_omega"] == "0.05 | 0.01"
