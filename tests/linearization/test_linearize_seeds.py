"""Several seeds in one linearization sweep; matched NAPL with duplicate NAPL values; aggregates over
seeds; the warning for a run that linearized nothing; the report's findings and cautions."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from simkit.data import Dataset
from simkit.errors import SimkitError
from simkit.linearization import LinearizeSettings, linearize, matched_napl, matched_over_seeds
from simkit.linearization.aggregate import aggregate_runs, mean_over_seeds
from simkit.linearization.matched import lowest_matched
from simkit.report import render_html
from simkit.report.linearize import context
from simkit.results import LinearizeResult


def net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv1d(1, 3, 3, padding=1), nn.BatchNorm1d(3), nn.ReLU(), nn.Conv1d(3, 3, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(24, 4)).eval()


def toy(n: int = 60) -> Dataset:
    gen = torch.Generator().manual_seed(0)
    return Dataset(torch.randn(n, 1, 8, generator=gen), torch.randint(0, 4, (n,), generator=gen), "toy")


def runs_frame(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["seed", "granularity", "omega", "napl", "accuracy"])


# ---------------------------------------------------------------------------------------------------
# matched NAPL: duplicates, per seed, over seeds


def one_point(runs: list[tuple[float, float]], rule: str) -> float:
    """(ω, accuracy) runs at one NAPL as one accuracy: the weakest ω's, or the mean."""
    return min(runs)[1] if rule == "weakest" else float(np.mean([a for _, a in runs]))


def reference_match(channel: list[tuple[float, float, float]], napl: float, rule: str = "mean") -> tuple[float, str]:
    """Channel accuracy at ``napl`` from (ω, napl, accuracy) runs, written from the definition: runs at
    the same NAPL are one point (the weakest ω's or their mean); exact point, else interpolation, else the
    nearest point."""
    points: dict[float, list[tuple[float, float]]] = {}
    for w, x, a in channel:
        points.setdefault(x, []).append((w, a))
    xs = sorted(points)
    ys = [one_point(points[x], rule) for x in xs]
    if napl in points:
        return ys[xs.index(napl)], "exact"
    if xs[0] < napl < xs[-1]:
        k = next(i for i, x in enumerate(xs) if x > napl)
        t = (napl - xs[k - 1]) / (xs[k] - xs[k - 1])
        return ys[k - 1] + t * (ys[k] - ys[k - 1]), "interpolated"
    nearest = min(range(len(xs)), key=lambda i: (abs(xs[i] - napl), i))
    return ys[nearest], "nearest"


def test_duplicate_napl_values_are_one_point_each():
    runs = runs_frame([
        (0, "channel", 0.1, 1.0, 0.6), (0, "channel", 0.2, 1.0, 0.8),     # two channel runs at NAPL 1
        (0, "channel", 0.3, 3.0, 0.9),
        (0, "layer", 0.1, 2.0, 0.5), (0, "layer", 0.2, 2.0, 0.7),         # two layer runs at NAPL 2
        (0, "layer", 0.3, 1.0, 0.4), (0, "layer", 0.4, 4.0, 0.95)])
    matched = matched_napl(runs, duplicates="mean")
    assert matched["napl"].tolist() == [1.0, 2.0, 4.0]
    assert matched["how"].tolist() == ["exact", "interpolated", "nearest"]
    # NAPL 1: the mean of 0.6 and 0.8; NAPL 2: halfway between that mean (0.7) and 0.9; NAPL 4: nearest (3 → 0.9)
    assert matched["channel_accuracy"].tolist() == pytest.approx([0.7, 0.8, 0.9])
    assert matched["layer_accuracy"].tolist() == pytest.approx([0.4, 0.6, 0.95])    # layer duplicates: mean
    assert matched["layer_runs"].tolist() == [1, 2, 1] and matched["layer_omega"].tolist() == ["0.3", "0.1, 0.2", "0.4"]
    assert matched["channel_runs"].tolist() == [2, 3, 1]
    assert matched["difference"].tolist() == pytest.approx([0.3, 0.2, -0.05])
    # np.interp over the raw duplicate x values would depend on their order: the table does not
    shuffled = matched_napl(runs.iloc[[6, 2, 1, 4, 0, 5, 3]], duplicates="mean")
    pd.testing.assert_frame_equal(shuffled, matched)
    # the default: the weakest ω at each point (NAPL 1: ω 0.1's 0.6; NAPL 2 layer: ω 0.1's 0.5)
    weakest = matched_napl(runs)
    assert weakest["channel_accuracy"].tolist() == pytest.approx([0.6, 0.75, 0.9])
    assert weakest["layer_accuracy"].tolist() == pytest.approx([0.4, 0.5, 0.95])
    assert weakest["layer_runs"].tolist() == [1, 2, 1] and weakest["layer_omega"].tolist() == ["0.3", "0.1", "0.4"]
    pd.testing.assert_frame_equal(matched_napl(runs.iloc[[6, 2, 1, 4, 0, 5, 3]]), weakest)


napls = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0])
run_rows = st.lists(st.tuples(st.sampled_from([0, 1]), st.sampled_from(["channel", "layer"]), napls,
                              st.floats(0, 1)), min_size=2, max_size=14)


@given(run_rows, st.randoms(), st.sampled_from(["weakest", "mean"]))
@settings(max_examples=80, deadline=None)
def test_matched_napl_follows_the_definition_and_ignores_row_order(rows, rnd, rule):
    omegas = list(range(len(rows)))
    rnd.shuffle(omegas)                               # the weakest ω is not the first row listed
    runs = runs_frame([(s, g, float(omegas[i]), x, a) for i, (s, g, x, a) in enumerate(rows)])
    matched = matched_napl(runs, duplicates=rule)
    order = list(range(len(runs)))
    rnd.shuffle(order)
    pd.testing.assert_frame_equal(matched_napl(runs.iloc[order], duplicates=rule), matched)
    expected = []
    for seed in sorted({r[0] for r in rows}):
        channel = [(float(omegas[i]), x, a) for i, (s, g, x, a) in enumerate(rows) if s == seed and g == "channel"]
        layer: dict[float, list[tuple[float, float]]] = {}
        for i, (s, g, x, a) in enumerate(rows):
            if s == seed and g == "layer":
                layer.setdefault(x, []).append((float(omegas[i]), a))
        if not channel or not layer:
            continue
        for x in sorted(layer):
            acc, how = reference_match(channel, x, rule)
            expected.append((seed, x, one_point(layer[x], rule), acc, how))
    assert len(matched) == len(expected)
    for row, (seed, x, layer_acc, acc, how) in zip(matched.itertuples(), expected, strict=True):
        assert (row.seed, row.napl, row.how) == (seed, x, how)
        assert row.layer_accuracy == pytest.approx(layer_acc, abs=1e-12)
        assert row.channel_accuracy == pytest.approx(acc, abs=1e-12)
        assert row.difference == pytest.approx(acc - layer_acc, abs=1e-12)


def test_matched_over_seeds_and_the_lowest_matched_napl():
    rows = []
    for seed, (c1, c2, l1, l2) in enumerate([(0.8, 0.9, 0.5, 0.85), (0.7, 0.9, 0.6, 0.8), (0.75, 0.95, 0.45, 0.9)]):
        rows += [(seed, "channel", 1.0, 1.0, c1), (seed, "channel", 0.1, 2.0, c2), (seed, "channel", 3.0, 0.0, 0.3),
                 (seed, "layer", 1.0, 1.0, l1), (seed, "layer", 0.1, 2.0, l2), (seed, "layer", 9.0, 0.0, 0.3)]
    rows.append((2, "layer", 0.5, 0.5, 0.2))          # NAPL 0.5 in one seed only
    matched = matched_napl(runs_frame(rows))
    over = matched_over_seeds(matched)
    assert over["napl"].tolist() == [0.0, 0.5, 1.0, 2.0]
    assert over["seeds"].tolist() == [3, 1, 3, 3] and over["matched_seeds"].tolist() == [3, 1, 3, 3]
    at1 = over[over["napl"] == 1.0].iloc[0]
    d = np.array([0.8 - 0.5, 0.7 - 0.6, 0.75 - 0.45])
    assert at1["difference_mean"] == pytest.approx(d.mean())
    assert at1["difference_std"] == pytest.approx(np.sqrt(((d - d.mean()) ** 2).sum() / 2))
    assert (at1["difference_min"], at1["difference_max"]) == pytest.approx((d.min(), d.max()))
    # NAPL 0 (both linear) and 0.5 (one seed) are left out; NAPL 2 is the original's
    assert lowest_matched(over, 3, original_napl=2.0)["napl"] == 1.0
    assert lowest_matched(over, 3, original_napl=1.0) is None
    # a seed whose channel-wise runs never reach a layer-wise NAPL gives a hint, not a match
    hint = matched_napl(runs_frame([(0, "channel", 1.0, 2.0, 0.9), (0, "channel", 2.0, 3.0, 0.95),
                                    (0, "layer", 1.0, 1.0, 0.5)]))
    assert hint["how"].tolist() == ["nearest"]
    assert matched_over_seeds(hint)["matched_seeds"].tolist() == [0]


def test_aggregates_match_numpy():
    runs = pd.DataFrame({"granularity": ["layer", "layer", "channel", "channel", "layer"],
                         "omega": [0.1, 0.1, 0.1, 0.1, 1.0], "seed": [0, 1, 0, 1, 0],
                         "napl": [2.0, 3.0, 1.5, 1.0, 1.0], "accuracy": [0.5, 0.7, 0.8, 0.6, 0.3],
                         "nonlinear_fraction": [0.5, 0.75, 0.4, 0.2, 0.25], "apl": [2.0, 3.0, 1.5, 1.0, 1.0],
                         "frozen_fraction": [0.5, 0.25, 0.6, 0.8, 0.75]})
    agg = aggregate_runs(runs)
    assert agg["run"].tolist() == ["layer ω=0.1", "channel ω=0.1", "layer ω=1"]        # sweep order
    assert agg["seeds"].tolist() == [2, 2, 1]
    assert agg["accuracy_mean"].tolist() == pytest.approx([0.6, 0.7, 0.3])
    assert agg["accuracy_std"].iloc[:2].tolist() == pytest.approx([np.std([0.5, 0.7], ddof=1), np.std([0.8, 0.6], ddof=1)])
    assert np.isnan(agg["accuracy_std"].iloc[2])                                       # one seed: unknown
    dists = pd.DataFrame({"granularity": ["original"] * 2 + ["layer"] * 2, "omega": [np.nan, np.nan, 0.1, 0.1],
                          "seed": [0, 1, 0, 1], "length": [1, 1, 1, 1], "probability": [1.0, 1.0, 0.25, 0.75]})
    mean = mean_over_seeds(dists, ["granularity", "omega", "length"], "probability")
    assert mean["run"].tolist() == ["original", "layer ω=0.1"]
    assert mean["probability_mean"].tolist() == pytest.approx([1.0, 0.5])
    assert mean["probability_std"].tolist() == pytest.approx([0.0, np.std([0.25, 0.75], ddof=1)])


# ---------------------------------------------------------------------------------------------------
# the runner with several seeds


def test_seeds_run_in_one_sweep_and_the_first_equals_a_one_seed_run(tmp_path):
    data = toy()
    two = LinearizeSettings(omega=[0.5], epochs=2, batch_size=20, slope_lr=0.3, train=1, seeds=2, cka=False)
    result = linearize(net, data, two, run_dir=tmp_path / "two", progress=False)
    runs = result.tables["runs"]
    assert runs["seed"].tolist() == [0, 0, 1, 1]
    assert runs["run"].tolist() == ["channel ω=0.5 seed=0", "layer ω=0.5 seed=0", "channel ω=0.5 seed=1",
                                    "layer ω=0.5 seed=1"]
    names = sorted(p.name for p in (tmp_path / "two" / "checkpoints").glob("*.pt"))
    assert names == ["linearize_channel_w0.5_s0.pt", "linearize_channel_w0.5_s1.pt", "linearize_layer_w0.5_s0.pt",
                     "linearize_layer_w0.5_s1.pt", "pretrain_s0.pt", "pretrain_s1.pt"]
    assert result.summary["seeds"] == [0, 1] and result.meta["seed_models"] == "built for each seed"
    accuracies = result.summary["original_accuracies"]
    assert accuracies[0] != accuracies[1]                       # each seed its own network
    assert result.summary["original_accuracy"] == pytest.approx(np.mean(accuracies))
    aggregate = result.tables["aggregate"]
    assert aggregate["seeds"].tolist() == [2, 2]
    assert aggregate["accuracy_mean"].tolist() == pytest.approx(runs.groupby("granularity", sort=False)["accuracy"].mean().tolist())
    assert set(result.tables["layers_mean"]["run"]) == {"channel ω=0.5", "layer ω=0.5"}
    one = linearize(net, data, LinearizeSettings(omega=[0.5], epochs=2, batch_size=20, slope_lr=0.3, train=1, cka=False),
                    progress=False)
    cols = ["napl", "nonlinear_fraction", "accuracy", "final_loss", "steps"]
    pd.testing.assert_frame_equal(one.tables["runs"][cols], runs[runs["seed"] == 0][cols].reset_index(drop=True))
    assert one.tables["runs"]["run"].tolist() == ["channel ω=0.5", "layer ω=0.5"]    # one seed: labels unchanged
    again = linearize(net, data, two, run_dir=tmp_path / "two", resume=True, progress=False)
    pd.testing.assert_frame_equal(again.tables["runs"][cols], runs[cols])


@pytest.mark.filterwarnings("ignore:run .* linearized nothing")
def test_one_module_for_several_seeds_trains_copies_and_says_so():
    model = net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    s = LinearizeSettings(granularity=["layer"], omega=[0.5], epochs=1, batch_size=20, train=1, seeds=2, cka=False)
    result = linearize(model, toy(), s, progress=False)
    assert result.meta["seed_models"].startswith("copies")
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())   # the first seed trained it
    assert "same initial weights" in " ".join(context(result)["cautions"])


def test_factory_that_returns_no_module_is_an_error():
    with pytest.raises(SimkitError, match="`model` returned a str for seed 0, not a torch.nn.Module"):
        linearize(lambda seed: "simkit:cnn1d", toy(), LinearizeSettings(epochs=1), progress=False)
    with pytest.raises(SimkitError, match="`seeds` must be a positive integer"):
        linearize(net(), toy(), LinearizeSettings(epochs=1, seeds=0), progress=False)


def test_a_run_that_linearizes_nothing_is_warned_about_and_reported():
    # 9 Adam steps of lr 1e-3 move α by at most about 0.009: no slope can reach 1
    s = LinearizeSettings(granularity=["layer"], omega=[0.0, 1.0], epochs=3, batch_size=20, slope_lr=1e-3, cka=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = linearize(net(), toy(), s, progress=False)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    runs = result.tables["runs"]
    assert (runs["frozen_fraction"] == 0).all() and (runs["napl"] == result.summary["original_napl"]).all()
    assert messages == [f"run layer ω={w} linearized nothing: no slope reached α = 1, so NAPL stays at the original "
                        "2; raise `omega`, `epochs` or `slope_lr`" for w in ("0", "1")]
    assert result.summary["unchanged_runs"] == ["layer ω=0", "layer ω=1"]
    cautions = context(result)["cautions"]
    assert any(c.startswith("2 of 2 runs linearized nothing") and "layer ω=0, layer ω=1" in c for c in cautions)
    assert any(c.startswith("One seed:") for c in cautions)
    # a run that froze slopes is neither warned about nor listed (the check can fail)
    strong = LinearizeSettings(granularity=["layer"], omega=[50.0], epochs=3, batch_size=20, slope_lr=0.5, cka=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        linearized = linearize(net(), toy(), strong, progress=False)
    assert linearized.tables["runs"]["frozen_fraction"].iloc[0] > 0
    assert linearized.summary["unchanged_runs"] == []
    assert not [w for w in caught if "linearized nothing" in str(w.message)]
    assert not any("linearized nothing" in c for c in context(linearized)["cautions"])


@pytest.mark.filterwarnings("ignore:run .* linearized nothing")
def test_report_leads_with_findings_then_figures_then_tables():
    s = LinearizeSettings(omega=[0.05, 5.0], epochs=2, batch_size=20, slope_lr=0.5, train=2, seeds=2)
    result = linearize(net, toy(80), s, progress=False)
    ctx = context(result)
    assert len(ctx["findings"]) == 3
    assert ctx["findings"][-1].startswith("The original network (every ReLU nonlinear) has NAPL 2")
    html = render_html(result)
    findings, accuracy = html.index('id="findings"'), html.index("<h2>Accuracy against NAPL")
    histograms, tables = html.index("<h2>Path-length distributions"), html.index("<h2>Channel − layer at matched NAPL")
    assert findings < accuracy < histograms < tables < html.index("<h2>Runs: mean ± std over seeds")
    assert "mean ± std over seeds" in html and "Binomial fit" in html
    matched_mean = result.tables["matched_mean"]
    for _, row in matched_mean.iterrows():     # the table shows the stored means, not recomputed ones
        assert f"{row['difference_mean']:.3f}" in html


def synthetic(differences: list[float], original: float = 0.92) -> LinearizeResult:
    """A three-seed result whose channel − layer difference at NAPL 1 is ``differences`` (per seed),
    built from a runs table with the library's own aggregations (no training)."""
    rows = []
    for seed, d in enumerate(differences):
        rows += [(seed, "channel", 1.0, 1.0, 0.5 + d), (seed, "layer", 1.0, 1.0, 0.5),
                 (seed, "channel", 0.1, 2.0, 0.9), (seed, "layer", 0.1, 2.0, 0.9)]
    runs = runs_frame(rows).assign(nonlinear_fraction=lambda f: f["napl"] / 2, apl=lambda f: f["napl"],
                                   frozen_fraction=lambda f: 1 - f["napl"] / 2, bit_exact_at_start=True)
    runs["run"] = [f"{g} ω={w:g} seed={s}" for g, w, s in zip(runs["granularity"], runs["omega"], runs["seed"],
                                                               strict=True)]
    matched = matched_napl(runs)
    over = matched_over_seeds(matched)
    lowest = lowest_matched(over, 3, original_napl=2.0)
    summary = {"original_accuracy": original, "original_accuracies": [original - 0.01, original, original + 0.01],
               "original_napl": 2.0,
               "seeds": [0, 1, 2], "chance_accuracy": 0.1, "unchanged_runs": [], "runs": [],
               "lowest_matched_napl": lowest["napl"], "lowest_matched_difference": lowest["difference_mean"],
               "lowest_matched_difference_std": lowest["difference_std"]}
    return LinearizeResult(summary=summary, tables={"runs": runs, "matched": matched, "matched_mean": over,
                                                    "aggregate": aggregate_runs(runs)}, meta={})


T_975_2 = 4.302652729911275   # Student t quantile 0.975 with 2 degrees of freedom (three seeds)


@pytest.mark.parametrize("differences, noise", [
    ([0.3, 0.25, 0.28], "beyond noise, channel-wise ahead; verdict on channel-wise ahead: reproduced"),
    # mean − std > 0 (the old rule said "beyond the seed spread"), but the t interval includes 0
    ([0.3, 0.1, 0.25], "within noise, the interval includes 0; verdict on channel-wise ahead: direction only"),
    ([0.3, -0.2, 0.1], "within noise, the interval includes 0; verdict on channel-wise ahead: direction only"),
    ([-0.3, -0.25, -0.28], "beyond noise, layer-wise ahead; verdict on channel-wise ahead: not reproduced"),
])
def test_findings_state_the_matched_gain_and_its_verdict(differences, noise):
    result = synthetic(differences)
    findings = context(result)["findings"]
    d = np.array(differences)
    half = T_975_2 * d.std(ddof=1) / np.sqrt(3)      # the paired 95 % t interval, by hand
    low, high = d.mean() - half, d.mean() + half
    row = result.tables["matched_mean"].set_index("napl").loc[1.0]
    assert row["difference_low"] == pytest.approx(low) and row["difference_high"] == pytest.approx(high)
    assert findings[0] == (
        f"At the lowest matched NAPL (1), channel-wise slopes keep test accuracy {0.5 + d.mean():.3f} ± "
        f"{d.std(ddof=1):.3f} against 0.500 ± 0.000 layer-wise (mean ± std over 3 seeds): channel − layer = "
        f"{d.mean():+.3f} (95% CI {low:+.3f} to {high:+.3f}, 3 seeds), {noise}.")
    best = 0.5 + d.mean()
    assert findings[1] == ("No linearized run keeps the original's accuracy to within 0.01; the most accurate is "
                           f"channel ω=1 at {best:.3f} ± {d.std(ddof=1):.3f} (NAPL 1.00 ± 0.00, linearized fraction "
                           "0.50 ± 0.00)" if best > 0.5 else
                           "No linearized run keeps the original's accuracy to within 0.01; the most accurate is "
                           "layer ω=1 at 0.500 ± 0.000 (NAPL 1.00 ± 0.00, linearized fraction 0.50 ± 0.00)") + "."
    assert findings[2] == "The original network (every ReLU nonlinear) has NAPL 2 and test accuracy 0.920 ± 0.010."
    kept = context(synthetic(differences, original=0.5 + d.mean()))["findings"][1]
    assert kept.startswith("The most linear run within 0.01 of the original's accuracy is ")
    assert "NAPL 1.00 ± 0.00 of 2, linearized fraction 0.50 ± 0.00, accuracy" in kept


def test_findings_say_what_the_rows_at_the_original_napl_are():
    """No partly linearized NAPL matched: the findings say so and name the rows the table does show
    (the original's NAPL, fully linear), instead of contradicting it."""
    rows = []
    for seed in range(3):
        rows += [(seed, "channel", 1.0, 0.0, 0.4), (seed, "layer", 1.0, 0.0, 0.4),
                 (seed, "channel", 0.0, 2.0, 0.9), (seed, "layer", 0.0, 2.0, 0.9)]
    runs = runs_frame(rows).assign(nonlinear_fraction=lambda f: f["napl"] / 2, apl=lambda f: f["napl"],
                                   frozen_fraction=lambda f: 1 - f["napl"] / 2, bit_exact_at_start=True)
    runs["run"] = [f"{g} ω={w:g} seed={s}" for g, w, s in zip(runs["granularity"], runs["omega"], runs["seed"],
                                                               strict=True)]
    matched = matched_napl(runs)
    over = matched_over_seeds(matched)
    assert lowest_matched(over, 3, original_napl=2.0) is None
    summary = {"original_accuracy": 0.9, "original_accuracies": [0.9] * 3, "original_napl": 2.0, "seeds": [0, 1, 2],
               "chance_accuracy": 0.1, "unchanged_runs": [], "runs": [], "lowest_matched_napl": None}
    result = LinearizeResult(summary=summary, tables={"runs": runs, "matched": matched, "matched_mean": over,
                                                      "aggregate": aggregate_runs(runs)}, meta={})
    ctx = context(result)
    first = ctx["findings"][0]
    assert "not compared at a matched, partly linearized NAPL" in first
    assert "NAPL 2 is the original's (runs that linearized nothing)" in first
    assert "NAPL 0 is fully linear" in first
    notes = {r["napl"]: r["note"] for r in ctx["matched_mean"]}
    assert notes == {"0": "fully linear: the same network at either granularity",
                     "2": "original NAPL: nothing linearized"}


def test_binomial_fit_is_exact_for_a_residual_network_and_keeps_the_mean():
    from simkit.report.linearize import binomial_fit

    lengths = np.arange(5)
    residual = np.array([0, 1, 3, 3, 1]) / 8                       # stem + 3 residual blocks: 1 + Binomial(3, ½)
    ks, probs = binomial_fit(lengths, residual)
    assert ks.tolist() == [1, 2, 3, 4]
    np.testing.assert_allclose(probs, residual[1:], rtol=1e-12)
    assert binomial_fit(lengths, np.array([0, 0, 1.0, 0, 0])) is None   # one length: nothing to fit


@given(st.lists(st.floats(0, 1), min_size=1, max_size=6))
def test_binomial_fit_of_a_plain_network_has_its_mean_and_no_less_spread(ps):
    """A plain network's path length is a sum of independent Bernoulli(p_l): the fit keeps the mean
    and, on the same support, spreads at least as much."""
    from simkit.report.linearize import binomial_fit

    dist = np.ones(1)
    for p in ps:
        dist = np.convolve(dist, [1 - p, p])
    lengths = np.arange(len(dist))
    # the claim holds on the same support: a length of probability in (0, 1e-12], which the fit leaves out,
    # makes the fit's support shorter than the network's (and its spread smaller)
    assume(not np.any((dist > 0) & (dist <= 1e-12)))
    fit = binomial_fit(lengths, dist)
    if fit is None:
        return
    ks, probs = fit
    assert probs.sum() == pytest.approx(1.0)
    assert ks @ probs == pytest.approx(lengths @ dist, abs=1e-9)
    mean = lengths @ dist
    assert ((ks - mean) ** 2) @ probs >= ((lengths - mean) ** 2) @ dist - 1e-9


def test_a_result_written_before_seeds_still_renders():
    """Run directories of the earlier layout (no seed/run columns, no over-seed tables) keep their report."""
    result = synthetic([0.2, 0.1, 0.15])
    runs = result.tables["runs"]
    old_runs = runs[runs["seed"] == 0].drop(columns=["seed", "run"]).reset_index(drop=True)
    old = LinearizeResult(summary={"original_accuracy": 0.92, "original_napl": 2.0, "runs": []},
                          tables={"runs": old_runs, "matched": pd.DataFrame()}, meta={})
    ctx = context(old)
    assert ctx["findings"][-1] == "The original network (every ReLU nonlinear) has NAPL 2 and test accuracy 0.920."
    assert [r["run"] for r in ctx["aggregate_rows"]] == ["channel ω=1", "layer ω=1", "channel ω=0.1", "layer ω=0.1"]
    assert ctx["accuracy_plot"] is not None
    assert "Accuracy against NAPL" in render_html(old)
