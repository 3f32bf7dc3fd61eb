"""Stitching, issues #13/#14: an evaluation set of its own (`test_data`), training A and B first
(`train`), IRI restarts and `iri_converged_fraction`, warnings for models at chance and IRIs that
missed the tolerance, and the report's findings, cautions and standard-vs-IRI figure."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from simkit.data import Dataset
from simkit.errors import SimkitError
from simkit.settings.stitch import IRISettings, StitchSettings
from simkit.stitching.checks import IRI_CONVERGED_TARGET, at_chance, chance_accuracy, run_warnings
from simkit.stitching.halves import FrontHalf
from simkit.stitching.iri import generate_iris
from simkit.stitching.runner import StitchResult, stitch

INFO = {"num_classes": 2, "input_shape": (1, 6, 6), "value_range": (0.0, 1.0)}


def tiny_cnn(seed: int) -> nn.Sequential:
    """(b, 1, 6, 6) → logits (b, 2); names 0 conv, 1 relu, 2 conv, 3 relu, 4 flatten, 5 linear."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 36, 2)).eval()


def separable(n: int, seed: int, flip: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (n, 1, 6, 6) whose label is which half is brighter (``flip``: the other half)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = 0.3 * torch.rand(n, 1, 6, 6, generator=g)
    top = (y if not flip else 1 - y).bool()
    x[top, :, :3] += 0.6
    x[~top, :, 3:] += 0.6
    return x.clamp(0, 1), y


def dataset(n: int = 80, seed: int = 0, test: Dataset | None = None) -> Dataset:
    x, y = separable(n, seed)
    return Dataset(x, y, f"separable{seed}", test=test, info=INFO)


def run(a, b, data, **options) -> StitchResult:
    test_data = options.pop("test_data", None)
    run_dir = options.pop("run_dir", None)
    return stitch(a, b, data, StitchSettings(**{"layer_a": "1", "layer_b": "1", "objective": "dm", **options}),
                  test_data=test_data, run_dir=run_dir, cache_dir=None, progress=False)


def numpy_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(x).double().numpy()
    return float((logits.argmax(1) == y.numpy()).mean())


# ---------------------------------------------------------------------------------------------- checks


def test_chance_accuracy_and_at_chance_against_hand_counts():
    labels = torch.tensor([0, 0, 0, 1, 2, 2, 0, 1])
    assert chance_accuracy(labels) == pytest.approx(4 / 8)
    n = 1000
    balanced = torch.arange(n) % 10
    bound = 0.1 + 3 * math.sqrt(0.1 * 0.9 / n)
    assert at_chance(0.1, balanced) and at_chance(bound - 1e-6, balanced)
    assert not at_chance(bound + 1e-6, balanced) and not at_chance(0.9, balanced)
    assert not at_chance(float("nan"), balanced)


def test_run_warnings_name_each_problem_once():
    labels = torch.arange(400) % 4
    found = run_warnings({"model A": 0.26, "model B": 0.97}, labels, {"l1": 0.99, "l2": 0.40},
                         {"l1": 0.02, "l2": 0.31}, 0.05)
    assert len(found) == 2
    assert found[0].startswith("model A is at chance (0.260 against 0.250")
    assert "IRIs at A.l2 reached the tolerance 0.05 on only 40.0% of inputs (median relative error 0.31)" in found[1]
    assert run_warnings({"model A": 0.9}, labels, {"l1": IRI_CONVERGED_TARGET}, {"l1": 0.04}, 0.05) == []
    assert run_warnings({"model A": 0.0}, None, {}, {}, 0.05) == []  # no labels: no accuracy to judge


# ------------------------------------------------------------------------------------------- restarts


def test_restarts_only_improve_and_record_the_seed_they_came_from():
    front = FrontHalf(tiny_cnn(0), "3")
    x = dataset(48).inputs
    base = IRISettings(steps=15, tol=0.02, lr=0.05, batch_size=16, restarts=0)
    once, _ = generate_iris(front, x, base, value_range=(0.0, 1.0), seed=3, progress=False)
    again, _ = generate_iris(front, x, base.updated(restarts=3), value_range=(0.0, 1.0),
                             seed=3, progress=False)
    assert bool((once.reached == False).any())  # noqa: E712  (some miss the tolerance in one attempt)
    assert (again.rel_error <= once.rel_error + 1e-12).all()
    assert float(again.reached.double().mean()) > float(once.reached.double().mean())
    moved = again.rel_error < once.rel_error
    assert bool(moved.any())
    assert bool((again.seed_index != torch.arange(len(x))).all())  # never seeded from the input itself
    assert (again.steps[moved] >= base.steps).all()  # the earlier attempt's updates are counted
    kept = ~moved
    assert torch.equal(again.seed_index[kept], once.seed_index[kept])
    with torch.no_grad():  # every returned error is the IRI's true error (float64 numpy)
        a_iri = front(again.iris).double().flatten(1).numpy()
        a_x = front(x).double().flatten(1).numpy()
    ref = np.linalg.norm(a_iri - a_x, axis=1) / np.linalg.norm(a_x, axis=1)
    np.testing.assert_allclose(again.rel_error.numpy(), ref, rtol=1e-4, atol=1e-6)
    with pytest.raises(SimkitError, match="`restarts` must be 0 or a positive integer"):
        IRISettings(restarts=-1).validate()


def test_summary_has_iri_converged_fraction_per_layer_and_its_minimum():
    data = dataset(60, test=dataset(30, seed=1))
    result = run(tiny_cnn(0), tiny_cnn(1), data, layer_a="1,3", layer_b="1,3", iri=True, steps=2, iri_steps=30,
                 iri_tol=0.01, iri_restarts=0)
    iris = result.tables["iris"]
    assert list(iris.layer_a) == ["1", "3"]
    assert iris.iri_converged_fraction.tolist() == iris.reached_fraction.tolist()
    assert result.summary["iri_converged_fraction"] == pytest.approx(iris.iri_converged_fraction.min())
    missed = iris[iris.iri_converged_fraction < IRI_CONVERGED_TARGET]
    assert len(missed)  # a 1 % tolerance in 30 steps: missed somewhere, and said so
    for layer in missed.layer_a:
        assert any(f"IRIs at A.{layer} reached the tolerance 0.01" in w for w in result.summary["warnings"])


# ------------------------------------------------------------------------------------------ test_data


def test_test_data_is_the_evaluation_set_and_all_of_data_trains():
    train = dataset(70, seed=0, test=dataset(20, seed=5))  # its own test split is not used
    x_eval, y_eval = separable(40, seed=2, flip=True)      # labels flipped: B is wrong on it
    evaluation = Dataset(x_eval, y_eval, "flipped", info=INFO)
    a, b = tiny_cnn(0), tiny_cnn(1)
    result = run(a, b, train, test_data=evaluation, train=30.0, steps=3)
    meta = result.meta
    assert meta["n_train"] == 70 and meta["n_test"] == 40 and meta["test_data"] == "flipped"
    # B's accuracy is that of the trained copy on the evaluation set: recompute it from the same
    # training (a second run trains identically) through a float64 argmax
    again = run(a, b, train, test_data=evaluation, train=30.0, steps=3)
    assert again.summary["b_accuracy"] == result.summary["b_accuracy"]
    table = result.tables["stitching"]
    assert table.b_accuracy.iloc[0] == result.summary["b_accuracy"]
    assert result.summary["b_accuracy"] < 0.5  # trained on the true rule, scored on the flipped one
    with_split = Dataset(x_eval[:10], y_eval[:10], "outer", test=Dataset(x_eval[10:], y_eval[10:], "inner", info=INFO),
                         info=INFO)
    assert run(a, b, train, test_data=with_split, steps=0).meta["n_test"] == 30  # its native test split


def test_test_data_evaluates_exactly_what_b_scores_there():
    train = dataset(60)
    x_eval, y_eval = separable(50, seed=9)
    a, b = tiny_cnn(0), tiny_cnn(1)
    result = run(a, b, train, test_data=Dataset(x_eval, y_eval, "eval", info=INFO), steps=0)
    assert result.summary["b_accuracy"] == pytest.approx(numpy_accuracy(b, x_eval, y_eval))
    assert result.summary["a_accuracy"] == pytest.approx(numpy_accuracy(a, x_eval, y_eval))


@pytest.mark.parametrize(("test_data", "message"), [
    (Dataset(torch.rand(10, 1, 5, 5), torch.zeros(10, dtype=torch.long), "small", info=INFO),
     r"`test_data` samples have shape \(1, 5, 5\) but the stitching data's have \(1, 6, 6\)"),
    (Dataset(torch.rand(10, 1, 6, 6), None, "unlabelled", info=INFO), "`test_data` 'unlabelled' has no labels"),
    (Dataset(torch.full((10, 1, 6, 6), float("nan")), torch.zeros(10, dtype=torch.long), "nan", info=INFO), "NaN"),
    ("digits", "`test_data` must be a simkit Dataset"),
])
def test_bad_test_data_is_refused_before_anything_is_written(tmp_path, test_data, message):
    with pytest.raises(SimkitError, match=message):
        run(tiny_cnn(0), tiny_cnn(1), dataset(40), test_data=test_data, run_dir=tmp_path / "r", steps=0)
    assert not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------------------------- train


def test_train_trains_copies_with_checkpoints_and_clears_the_chance_warning(tmp_path):
    data = dataset(120, test=dataset(60, seed=1))
    a, b = tiny_cnn(0), tiny_cnn(1)
    before = {k: v.clone() for k, v in a.state_dict().items()}
    untrained = run(a, b, data, steps=0)
    labels = data.test.labels
    assert untrained.summary["chance_accuracy"] == pytest.approx(chance_accuracy(labels))
    trained = run(a, b, data, steps=0, train=20.0, run_dir=tmp_path / "r")
    assert all(torch.equal(before[k], v) for k, v in a.state_dict().items())  # the caller's model untouched
    assert trained.summary["a_accuracy"] > 0.9 and trained.summary["b_accuracy"] > 0.9
    assert not any("at chance" in w for w in trained.summary["warnings"])
    assert (tmp_path / "r" / "checkpoints" / "train_a.pt").is_file()
    assert (tmp_path / "r" / "checkpoints" / "train_b.pt").is_file()
    for name, accuracy in (("model A", untrained.summary["a_accuracy"]), ("model B", untrained.summary["b_accuracy"])):
        assert (f"{name} is at chance" in " ".join(untrained.summary["warnings"])) == at_chance(accuracy, labels)
    with pytest.raises(SimkitError, match="`train` must be a number >= 0"):
        StitchSettings(layer_a="1", layer_b="1", train=-1.0).validate()
    with pytest.raises(SimkitError, match="`train` trains A and B with cross-entropy but data 'nolabels'"):
        run(a, b, Dataset(data.inputs, None, "nolabels", test=data.test, info=INFO), train=1.0)


# ---------------------------------------------------------------------------------------------- report


def _combined(iri_gap: float, spread: float) -> StitchResult:
    """A hand-made combined result: pairs A->A2 and A->S, 3 seeds, one layer, objectives dm and hlm."""
    rows = []
    for seed in range(3):
        noise = spread * (seed - 1)
        for models, gap in (("A->A2", 0.0), ("A->S", iri_gap)):
            for objective in ("dm", "hlm"):
                for setting in ("standard", "iri"):
                    penalty = 0.02 + noise + (gap if setting == "iri" and objective == "dm" else 0.0)
                    rows.append({"layer_a": "fc", "layer_b": "fc", "objective": objective, "setting": setting,
                                 "stitched_accuracy": 0.95 - penalty, "b_accuracy": 0.95, "penalty": penalty,
                                 "models": models, "seed": seed})
    return StitchResult(summary={"iri_converged_fraction": 0.97, "warnings": ["model <S> is at chance"]},
                        tables={"stitching": pd.DataFrame(rows)}, meta={"model_a": "A, S", "model_b": "A2, S"},
                        extra={})


def test_report_findings_say_which_pairs_are_separated_and_show_the_figure_first():
    from simkit.report import render_html
    from simkit.report.stitch import context, mean_penalty_and_spread, separation

    result = _combined(iri_gap=0.30, spread=0.01)
    ctx = context(result)
    assert ctx["findings"][0].startswith("Invariance-aware stitching separates A->S at 1 of 2 layer × objective "
                                         "cells (fc → fc dm) from A->A2")
    assert ctx["cautions"] == ["model <S> is at chance"]
    agg = mean_penalty_and_spread(result.tables["stitching"].assign(pair="fc → fc"))
    row = agg[(agg.models == "A->S") & (agg.setting == "iri") & (agg.objective == "dm")].iloc[0]
    assert row.penalty == pytest.approx(0.32) and row.penalty_spread == pytest.approx(0.01)  # std over 3 seeds
    html = render_html(result)
    assert "model &lt;S&gt; is at chance" in html and "model <S>" not in html
    assert html.index('id="findings"') < html.index("standard and invariance-aware penalties side by side")
    assert html.index("side by side") < html.index("mean ± spread over seeds")
    # a gap below 10 points, or within twice the seed spread, separates nothing
    assert separation(mean_penalty_and_spread(_combined(0.08, 0.001).tables["stitching"].assign(pair="p")))[1] == {"A->S": []}
    assert separation(mean_penalty_and_spread(_combined(0.12, 0.08).tables["stitching"].assign(pair="p")))[1] == {"A->S": []}
    assert "separates none of the model pairs" in context(_combined(0.08, 0.0))["findings"][0]


def test_single_run_report_leads_with_penalties_and_iri_quality():
    from simkit.report.stitch import context

    data = dataset(60, test=dataset(30, seed=1))
    result = run(tiny_cnn(0), tiny_cnn(1), data, iri=True, steps=2, iri_steps=40, objective="dm,fula")
    findings = context(result)["findings"]
    assert findings[0].startswith("Mean penalty_min over layers and objectives")
    assert "standard" in findings[0] and "invariance-aware" in findings[0] and "binomial SE" in findings[0]
    assert findings[1].startswith("Invariance-aware minus standard penalty, paired by seed")
    assert "one seed: binomial SE" in findings[1] and "beyond noise" not in findings[1]
    assert "IRIs (unbounded search) reached their tolerance" in findings[2] and "median L∞" in findings[2]
    assert context(result)["cautions"] == result.summary["warnings"]
