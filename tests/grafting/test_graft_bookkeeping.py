"""Surgery bookkeeping judged (issue #39): the slope of bookkeeping time against insertion depth with its
95 % interval, E3's correlation with its Fisher-z interval (from given timings: nothing is timed here), and
E3 on a deeper built-in model (``e3_blocks``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simkit.errors import SimkitError
from simkit.grafting import GraftSettings, graft
from simkit.grafting.experiments import e3_sites
from simkit.grafting.tasks import deeper_builtin, is_builtin
from simkit.grafting.verdict import (
    BOOKKEEPING_FLAT,
    bookkeeping_verdict,
    correlation_interval,
    e3_statistics,
    slope_interval,
)
from simkit.models import load_model
from simkit.report.graft import findings
from tests.grafting.test_graft_verdict import PASSING

# Student t and normal quantiles for 95 %, from tables (not from scipy): n − 2 = 4, 6, 7; z = 1.959964
T975 = {4: 2.776445, 6: 2.446912, 7: 2.364624}
Z975 = 1.959964


def reference_slope(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(slope, low, high) of ordinary least squares written from the formulas."""
    n = len(x)
    sxx = ((x - x.mean()) ** 2).sum()
    slope = ((x - x.mean()) * (y - y.mean())).sum() / sxx
    residuals = y - (y.mean() + slope * (x - x.mean()))
    stderr = math.sqrt((residuals ** 2).sum() / (n - 2) / sxx)
    return slope, slope - T975[n - 2] * stderr, slope + T975[n - 2] * stderr


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([6, 8, 9]), st.floats(-1e-5, 1e-5), st.floats(1e-4, 1e-3), st.integers(0, 10_000))
def test_the_slope_and_its_interval_follow_the_formulas(n, slope, base, seed):
    rng = np.random.default_rng(seed)
    depth = np.arange(n, dtype=float)
    times = base + slope * depth + rng.normal(0, 2e-5, n)
    fit = slope_interval(depth, times)
    expected = reference_slope(depth, times)
    width = expected[2] - expected[1]   # the tabled t quantile has 7 digits: bounds near 0 need an absolute slack
    assert (fit.slope, fit.low, fit.high) == pytest.approx(expected, rel=1e-6, abs=1e-6 * width)
    assert fit.n == n and fit.low <= fit.slope <= fit.high


def test_the_correlation_interval_is_fisher_z():
    cone = np.array([40.0, 36, 31, 27, 22, 18, 13, 9, 4])
    recompute = np.array([2.0, 1.85, 1.61, 1.42, 1.18, 0.97, 0.72, 0.55, 0.31]) * 1e-3
    r, low, high = correlation_interval(cone, recompute)
    r_ref = float(np.sum((cone - cone.mean()) * (recompute - recompute.mean()))
                  / math.sqrt(np.sum((cone - cone.mean()) ** 2) * np.sum((recompute - recompute.mean()) ** 2)))
    half = Z975 / math.sqrt(len(cone) - 3)
    assert r == pytest.approx(r_ref)
    assert (low, high) == pytest.approx((math.tanh(math.atanh(r_ref) - half), math.tanh(math.atanh(r_ref) + half)))
    assert low < r < high < 1
    assert math.isnan(correlation_interval(cone[:3], recompute[:3])[1])     # n < 4: no interval
    assert correlation_interval([1, 2, 3, 4], [2, 4, 6, 8]) == (pytest.approx(1.0),) * 3


def test_bookkeeping_verdicts_from_given_timings():
    depth = np.arange(9, dtype=float)
    wobble = np.array([1, -1, 1, -1, 0, 1, -1, 1, -1]) * 1e-6
    flat = e3_statistics(depth, 40 - 4 * depth, 2e-3 - 2e-4 * depth, 7.5e-4 + wobble)
    assert flat["e3_bookkeeping_verdict"] == "flat" and flat["e3_bookkeeping_median_s"] == pytest.approx(7.5e-4)
    assert flat["e3_bookkeeping_slope_low"] <= 0 <= flat["e3_bookkeeping_slope_high"]
    growing = e3_statistics(depth, 40 - 4 * depth, 2e-3 - 2e-4 * depth, 5e-4 + 1e-4 * depth + wobble)
    assert growing["e3_bookkeeping_verdict"] == "grows with depth"
    assert growing["e3_bookkeeping_slope_s"] == pytest.approx(1e-4, rel=1e-2)
    noisy = e3_statistics(depth, 40 - 4 * depth, 2e-3 - 2e-4 * depth, 7.5e-4 + 100 * wobble * depth)
    assert noisy["e3_bookkeeping_verdict"] == "undecided"
    shrinking = e3_statistics(depth, 40 - 4 * depth, 2e-3 - 2e-4 * depth, 2e-3 - 1e-4 * depth + wobble)
    assert shrinking["e3_bookkeeping_verdict"] == "shrinks with depth"
    # the rule's edge: the interval's larger end times the depth span against a quarter of the median
    fit = slope_interval(depth, 7.5e-4 + wobble)
    edge = max(abs(fit.low), abs(fit.high)) * 8 / BOOKKEEPING_FLAT
    assert bookkeeping_verdict(fit, edge * 1.01, 8) == "flat"
    assert bookkeeping_verdict(fit, edge * 0.99, 8) != "flat"


def test_report_findings_quote_the_intervals():
    summary = {**PASSING, "verdict": "E1, E2, E3, F3 pass", "e3_sites": 9, "e3_cone_cost_correlation_low": 0.99,
               "e3_cone_cost_correlation_high": 0.999, "e3_bookkeeping_slope_s": 1e-6,
               "e3_bookkeeping_slope_low": -2e-6, "e3_bookkeeping_slope_high": 4e-6,
               "e3_bookkeeping_median_s": 7.5e-4, "e3_bookkeeping_verdict": "flat"}
    text = " ".join(findings(summary, {}))
    assert "(95 % interval [0.990, 0.999], Fisher z) over 9 graft depths" in text
    assert "median 0.75 ms, +1 µs per depth (95 % interval [-2, +4]): flat" in text


def test_a_deeper_builtin_model_gives_e3_at_least_8_sites():
    model = load_model("simkit:llama:d=16,heads=2,blocks=2", seed=0)
    deeper = deeper_builtin(model, 8, seed=3)
    assert is_builtin(deeper) and len(deeper.blocks) == 8 and deeper.embed.embedding_dim == 16
    assert deeper.blocks[0].branch.attn.heads == 2 and deeper.vocab == model.vocab
    sites, _ = e3_sites(deeper, GraftSettings().validate(), builtin=True)
    assert sites == ["embed"] + [f"blocks.{i}" for i in range(8)]
    again = deeper_builtin(model, 8, seed=3)
    assert all(np.array_equal(a.detach().numpy(), b.detach().numpy())
               for a, b in zip(deeper.parameters(), again.parameters(), strict=True))


def test_e3_blocks_runs_e3_on_the_deeper_model_and_refuses_a_users_model():
    s = GraftSettings(model="simkit:llama:d=16,blocks=2", steps=6, n=16, seq_len=8, batch_size=8, e3_blocks=7)
    result = graft(load_model(s.model, seed=0), None, s, progress=False)
    e3 = result.tables["e3"]
    assert e3["site"].tolist() == ["embed"] + [f"blocks.{i}" for i in range(7)] and result.summary["e3_sites"] == 8
    assert set(result.summary) >= {"e3_cone_cost_correlation_low", "e3_bookkeeping_slope_s", "e3_bookkeeping_verdict"}
    judged = e3_statistics(e3["depth"], e3["cone_nodes"], e3["recompute_s"], e3["bookkeeping_s"])
    assert {k: result.summary[k] for k in judged} == pytest.approx(judged, nan_ok=True)
    assert result.meta["settings"]["e3_blocks"] == 7
    mlp = load_model("simkit:mlp:in_features=4,hidden=8,depth=2,num_classes=3", seed=0)
    with pytest.raises(SimkitError, match="`e3_blocks` deepens the built-in model"):
        deeper_builtin(mlp, 8, seed=0)
