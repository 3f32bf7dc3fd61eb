"""The verdict code of examples/linearize_mnist1d.py on synthetic runs tables: C1a from the matched
channel − layer differences at NAPL ≤ 2, C1b from the per-seed gap at NAPL 2 minus the gap at NAPL 3, C2
from the per-seed gap of the plain start minus that of the residual start at equal fraction linearized,
and the gates (recovery plateau, seeds matched)."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pandas as pd
import pytest
import torch

from simkit.stats import paired_difference, verdict
from tests.helpers import ROOT

PATH = ROOT / "examples" / "linearize_mnist1d.py"


def example():
    spec = importlib.util.spec_from_file_location("linearize_mnist1d_example", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runs(layer_napl: list[float], channel: list[tuple[float, float]], gaps: list[float], units: int = 4,
         shrink: float = 0.0) -> pd.DataFrame:
    """Runs of seeds 0..len(gaps)-1: layer-wise runs at ``layer_napl`` (accuracy 0.5 + 0.1·NAPL), channel-wise
    runs at ``channel`` (NAPL, accuracy) shifted by the seed's gap, less ``shrink`` × NAPL; accuracy_recovered
    = accuracy + 0.05 for channel-wise runs and + 0.02 for layer-wise ones. The fraction linearized is
    1 − NAPL / units; mean |1 − α| is 0.1 for layer-wise runs, 0.3 for channel-wise ones."""
    rows = []
    for seed, gap in enumerate(gaps):
        for k, napl in enumerate(layer_napl):
            acc = 0.5 + 0.1 * napl
            rows.append((seed, "layer", 0.1 * (k + 1), napl, 1 - napl / units, acc, acc + 0.02, 0.1))
        for k, (napl, acc) in enumerate(channel):
            shifted = acc + gap - shrink * napl
            rows.append((seed, "channel", 0.01 * (k + 1), napl, 1 - napl / units, shifted, shifted + 0.05, 0.3))
    return pd.DataFrame(rows, columns=["seed", "granularity", "omega", "napl", "linearized_fraction", "accuracy",
                                       "accuracy_recovered", "mean_abs_one_minus_alpha"])


PLAIN_CHANNEL = [(3.5, 0.85), (2.5, 0.75), (1.5, 0.65), (0.5, 0.55)]


def test_claim_1a_reads_the_matched_tables_with_their_intervals():
    m = example()
    gaps = [0.10, 0.12, 0.08]
    # channel-wise runs on the layer-wise line (0.5 + 0.1·NAPL) plus the seed's gap: the difference is the gap
    tables = m.matched(runs([3.0, 2.0, 1.0], PLAIN_CHANNEL, gaps))
    per_seed, over = tables["napl", "after recovery"]
    at2 = over[over["napl"] == 2.0].iloc[0]
    expected = paired_difference(np.array(gaps) + 0.05 + 0.7, np.full(3, 0.7 + 0.02))
    assert at2["difference_mean"] == pytest.approx(expected.mean)
    assert (at2["difference_low"], at2["difference_high"]) == pytest.approx((expected.low, expected.high))
    assert at2["layer_mean_abs_one_minus_alpha_mean"] == pytest.approx(0.1)
    lines = m.claim_1(tables, 4.0)
    headline = [line for line in lines if "headline" in line and "channel − layer" in line]
    assert len(headline) == 1 and "after recovery, napl 2:" in headline[0]
    assert headline[0].endswith(f"→ {verdict(expected)} ← headline") and verdict(expected) == "reproduced"
    assert f"{100 * expected.mean:+.1f} pt [{100 * expected.low:+.1f}, {100 * expected.high:+.1f}]" in headline[0]
    assert "mean |1-α| layer 0.100, channel 0.300" in headline[0]
    c1a = lines[1:lines.index("C1b (plain start: the gap shrinks at NAPL 3):")]
    assert [line.split(":")[0] for line in c1a] == ["   after recovery, napl 1", "   after recovery, napl 2"]
    before = [line for line in lines if line.startswith("   before recovery, napl 2:")][0]
    assert f"{100 * float(np.mean(gaps)):+.1f} pt" in before


def test_claim_1b_pairs_the_gap_at_napl_2_with_the_gap_at_napl_3_by_seed():
    m = example()
    # the channel-wise accuracy loses 0.04 per NAPL: the gap at NAPL 3 is 0.04 smaller than at NAPL 2
    tables = m.matched(runs([3.0, 2.0, 1.0], PLAIN_CHANNEL, [0.10, 0.13, 0.08], shrink=0.04))
    line = m.shrink_line(tables["napl", "after recovery"][0])
    per_seed = tables["napl", "after recovery"][0]
    at2 = per_seed[per_seed["napl"] == 2.0].set_index("seed")["difference"]
    at3 = per_seed[per_seed["napl"] == 3.0].set_index("seed")["difference"]
    expected = paired_difference(at2, at3)
    assert expected.mean == pytest.approx(0.04)
    assert f"gap(2) − gap(3) {100 * expected.mean:+.1f} pt" in line and "over 3 seeds" in line
    assert line.endswith(f"→ {verdict(expected)} ← headline")


def test_claim_2_pairs_the_gaps_of_the_two_starts_by_seed_at_equal_fraction():
    m = example()
    plain = m.matched(runs([3.0, 2.0, 1.0], PLAIN_CHANNEL, [0.10, 0.15, 0.20]))
    residual = m.matched(runs([2.0, 1.5, 1.0], [(2.25, 0.725), (1.75, 0.675), (1.25, 0.625), (0.75, 0.575)],
                              [0.01, 0.07, 0.02]))
    lines = m.claim_2(plain, residual, 2.5)
    headline = [line for line in lines if line.endswith("← headline")]
    assert len(headline) == 1 and "after recovery, linearized_fraction 0.5:" in headline[0]
    # after recovery both gaps gain 0.03 (0.05 − 0.02): the difference of gaps is the same as before
    expected = paired_difference([0.10, 0.15, 0.20], [0.01, 0.07, 0.02])
    assert f"plain − residual {100 * expected.mean:+.1f} pt [{100 * expected.low:+.1f}, " in headline[0]
    assert headline[0].endswith(f"→ {verdict(expected)} ← headline")
    # fractions common to both starts: 0.5 and 0.75 (plain 0.25, 0.5, 0.75; residual 0.5, 0.625, 0.75);
    # NAPL: 1 and 2 (1.5 and 3 are not), as references after the headline axis
    assert lines[1].startswith("   after recovery, linearized_fraction 0.5:")
    assert lines[3] == "C2 references (no headline):"
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


def test_a_point_matched_in_fewer_than_three_seeds_is_not_testable():
    m = example()
    tables = m.matched(runs([2.0], [(2.5, 0.75), (1.5, 0.65)], [0.10, 0.12]))
    line = m.point_line("after recovery", "napl", 2.0, tables["napl", "after recovery"][0])
    assert "over 2 seeds" in line and line.endswith("→ not testable (matched in 2 seeds, fewer than 3)")
    # a failed gate overrides every verdict
    gated = m.point_line("after recovery", "napl", 2.0, tables["napl", "after recovery"][0], claimed="not testable (G2)")
    assert gated.endswith("→ not testable (G2)")


def recovery_runs(best_epochs: list[float], late: list[float], cap: float = 10,
                  steps_per_epoch: int = 25) -> pd.DataFrame:
    return pd.DataFrame({"granularity": ["layer"] * len(best_epochs), "steps_recovered": cap * steps_per_epoch,
                         "recover_best_step": [e * steps_per_epoch for e in best_epochs], "late_gain": late})


def test_the_plateau_gate_judges_the_median_late_validation_gain_per_granularity():
    m = example()
    assert list(m.best_epochs(recovery_runs([2, 7, 10], [0, 0, 0]), 10)) == [2, 7, 10]
    passing = m.plateau_gate(recovery_runs([1, 3, 7, 7, 10], [0.0, 0.005, 0.01, 0.03, -0.01]), 10).iloc[0]
    assert passing["median late gain (pt)"] == pytest.approx(0.5) and bool(passing["passes"])
    assert passing["share levelled"] == pytest.approx(0.8) and passing["median best epoch"] == 7
    failing = m.plateau_gate(recovery_runs([1, 3, 7, 8, 10], [0.02, 0.015, 0.011, 0.0, 0.03]), 10).iloc[0]
    assert failing["median late gain (pt)"] == pytest.approx(1.5) and not bool(failing["passes"])


def test_a_failed_gate_makes_only_the_claims_of_its_start_not_testable():
    m = example()
    failed = {"plain": [], "residual": ["G2"]}
    assert m.gate_verdict(failed, ["plain"]) is None
    assert m.gate_verdict(failed, ["plain", "residual"]) == "not testable at this scale (G2 residual failed: see == gates)"


def test_late_gains_read_the_validation_scores_of_each_recovery_checkpoint(tmp_path):
    m = example()
    (tmp_path / "checkpoints").mkdir()
    scores = [(25 * (k + 1), 0.5 + 0.01 * k) for k in range(12)]   # +0.01 per epoch: +0.05 over 5 epochs
    torch.save({"monitor": {"scores": scores}}, tmp_path / "checkpoints" / "linearize_layer_w0.8_s3_recover.pt")
    torch.save({"monitor": {"scores": scores[:6]}}, tmp_path / "checkpoints" / "linearize_channel_w0.002_recover.pt")
    torch.save({}, tmp_path / "checkpoints" / "linearize_layer_w0.8_s3.pt")   # post-training: not a recovery
    gains = m.late_gains(tmp_path, default_seed=7).sort_values("granularity").reset_index(drop=True)
    assert list(gains["granularity"]) == ["channel", "layer"] and list(gains["seed"]) == [7, 3]
    assert list(gains["omega"]) == [0.002, 0.8]
    assert np.isnan(gains["late_gain"][0]) and gains["late_gain"][1] == pytest.approx(0.05)


def test_start_text_names_the_omegas_and_the_deviation_behind_each_matched_point():
    m = example()
    table = runs([2.0], [(2.5, 0.75), (1.5, 0.65)], [0.1, 0.1]).assign(
        accuracy_shape_reset=0.4, steps_recovered=250, recover_best_step=100, late_gain=0.0)
    text = "\n".join(m.start_text("plain", table, [0.9, 0.91], m.matched(table), 4.0, 10))
    assert "0.01 | 0.02" in text                # the channel-wise ω on both sides of the interpolation
    assert re.search(r"layer +0\.1 +0\.00625 ", text)   # u = ω / 16 for a layer-wise run
    assert "after shape reset" in text and re.search(r" 0\.100 .* 0\.300 ", text)


def test_the_results_file_keeps_every_earlier_section(tmp_path):
    m = example()
    path = tmp_path / "results.txt"
    assert m.earlier_sections(path) == ""
    path.write_text("new run\n\n## Earlier run (design before the change)\nold verdicts\n")
    assert m.earlier_sections(path) == "\n## Earlier run (design before the change)\nold verdicts\n"
