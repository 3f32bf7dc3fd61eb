"""``stitch`` over seeds (issue #24): seeds through the CLI, the aggregate and paired differences against
hand computations, ``penalty_min``, the validation-chosen stitch budget, IRI diagnostics against a direct
computation, the seed rule of the CLI and resuming a 2-seed run."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from scipy import stats as scipy_stats
from torch import nn
from typer.testing import CliRunner

from simkit.cli.main import app
from simkit.data import Dataset
from simkit.errors import SimkitError
from simkit.settings.stitch import IRISettings, StitchSettings
from simkit.stitching import runner as runner_mod
from simkit.stitching.iri import generate_iris, seed_distances
from simkit.stitching.runner import stitch
from simkit.training import evaluate_accuracy

MODEL = "simkit:cnn2d:channels=4,layers=2"


def tiny_cnn(seed: int, width: int = 4) -> nn.Sequential:
    """(b, 1, 6, 6) → logits (b, 3)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(width * 36, 3)).eval()


def tiny_data(n: int = 90) -> Dataset:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n + 30, 1, 6, 6, generator=g)
    y = (x[:, 0, :3].sum((1, 2)) > x[:, 0, 3:].sum((1, 2))).long() + (x[:, 0, 0, 0] > 0.7).long()
    info = {"num_classes": 3, "input_shape": (1, 6, 6), "value_range": (0.0, 1.0)}
    return Dataset(x[:n], y[:n], "tiny", test=Dataset(x[n:], y[n:], "tiny", info=info), info=info)


def t_reference(values: np.ndarray) -> tuple[float, float, float, float]:
    """mean, std (ddof 1), and the 95 % t interval, written from the formula."""
    k = len(values)
    mean = float(np.sum(values) / k)
    std = float(math.sqrt(np.sum((values - mean) ** 2) / (k - 1)))
    half = float(scipy_stats.t.ppf(0.975, k - 1)) * std / math.sqrt(k)
    return mean, std, mean - half, mean + half


# ----------------------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory, data_spec):
    out = tmp_path_factory.mktemp("seeds")
    args = ["stitch", MODEL, MODEL, "--data", data_spec, "--n", "120", "--steps", "5", "--iri-steps", "10",
            "--iri-restarts", "0", "--batch-size", "32", "--layer-a", "blocks.0,blocks.1", "--layer-b",
            "blocks.0,blocks.1", "--objective", "dm,fula", "--iri", "--seed", "3", "--seeds", "2",
            "--val-every", "2", "--val-fraction", "0.2", "--train", "1",
            "--out", str(out / "run"), "--cache-dir", str(out / "cache")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, args


def test_two_seeds_through_the_cli_aggregate_and_paired_differences_by_hand(two_seeds):
    out, _ = two_seeds
    run = out / "run"
    table = pd.read_csv(run / "stitching.csv")
    assert sorted(set(table.seed)) == [3, 4] and len(table) == 2 * 2 * 2 * 2
    for column in ("penalty_min", "chosen_step", "a_accuracy"):
        assert column in table.columns
    # per seed: checkpoints of both trained models and of every stitch
    names = {p.name for p in (run / "checkpoints").glob("*.pt")}
    assert {"train_a_s3.pt", "train_b_s3.pt", "train_a_s4.pt", "train_b_s4.pt"} <= names
    assert "stitch_blocks.1__blocks.1__fula__iri_s4.pt" in names
    means = pd.read_csv(run / "stitching_mean.csv")
    assert len(means) == 2 * 2 * 2 and set(means.seeds) == {2}
    for _, row in means.iterrows():
        part = table[(table.layer_a == row.layer_a) & (table.objective == row.objective)
                     & (table.setting == row.setting)]
        for measure in ("penalty", "penalty_min", "stitched_accuracy"):
            mean, std, low, high = t_reference(part[measure].to_numpy(float))
            got = [row[f"{measure}_{s}"] for s in ("mean", "std", "low", "high")]
            np.testing.assert_allclose(got, [mean, std, low, high], atol=1e-12, equal_nan=True)
    diffs = pd.read_csv(run / "iri_differences.csv")
    assert len(diffs) == 2 * 2
    for _, row in diffs.iterrows():
        part = table[(table.layer_a == row.layer_a) & (table.objective == row.objective)]
        iri = part[part.setting == "iri"].sort_values("seed").penalty.to_numpy(float)
        std_arm = part[part.setting == "standard"].sort_values("seed").penalty.to_numpy(float)
        mean, std, low, high = t_reference(iri - std_arm)
        np.testing.assert_allclose([row["mean"], row["std"], row["low"], row["high"]], [mean, std, low, high],
                                   atol=1e-12, equal_nan=True)
        assert bool(row.beyond_noise) == (std > 0 and (low > 0 or high < 0))
    data = json.loads((run / "result.json").read_text())
    summary, meta = data["summary"], data["meta"]
    assert summary["seeds"] == [3, 4] and len(summary["a_accuracies"]) == 2
    assert summary["a_accuracy"] == pytest.approx(np.mean(summary["a_accuracies"]))
    for objective in ("dm", "fula"):
        per_seed = table[table.objective == objective].pivot_table(index="seed", columns="setting",
                                                                   values="penalty", aggfunc="mean")
        mean, std, low, high = t_reference((per_seed["iri"] - per_seed["standard"]).to_numpy(float))
        got = summary["iri_minus_standard"][objective]
        np.testing.assert_allclose([got["mean"], got["std"], got["low"], got["high"]], [mean, std, low, high],
                                   atol=1e-12)
        assert got["n"] == 2
    assert meta["seeds"] == [3, 4] and meta["n_val"] == 19 and meta["n_train"] == 77 and meta["n_test"] == 24
    iris = pd.read_csv(run / "iris.csv")
    assert sorted(set(iris.seed)) == [3, 4] and {"seed_linf_median", "b_target_class_fraction"} <= set(iris.columns)
    html = (run / "report.html").read_text()
    assert "95 % t interval over seeds" in html and "penalty_min" in html and "(points)" in html
    from simkit import load
    from simkit.report.stitch import context

    findings = context(load(run))["findings"]
    assert findings[0].startswith("Mean penalty_min over layers and objectives") and "95% CI" in findings[0]
    assert findings[1].startswith("Invariance-aware minus standard penalty") and "95% CI" in findings[1]
    for objective, interval in summary["iri_minus_standard"].items():
        tag = "beyond noise" if interval["low"] > 0 or interval["high"] < 0 else "within noise"
        assert f"{objective} {100 * interval['mean']:+.1f} points" in findings[1]
        assert findings[1].split(f"{objective} ")[1].split(";")[0].rstrip(".").endswith(tag)


def test_chosen_step_lies_within_the_budget_on_the_validation_grid(two_seeds):
    out, _ = two_seeds
    table = pd.read_csv(out / "run" / "stitching.csv")
    assert set(table.chosen_step) <= {0, 2, 4, 5}  # step 0 (the init), every 2 steps, and the last (5)
    training = pd.read_csv(out / "run" / "training.csv")
    assert (training.steps == 5).all() and (training.chosen_step <= training.steps).all()
    assert training.val_score.between(0, 1).all()  # validation accuracy


def test_resume_of_a_two_seed_run_trains_nothing_and_gives_the_same_tables(two_seeds, monkeypatch):
    out, args = two_seeds
    run = out / "run"
    before = {name: pd.read_csv(run / name) for name in ("stitching.csv", "stitching_mean.csv", "iris.csv")}

    def no_training(*args, **kwargs):
        raise AssertionError("a resumed finished run must not train")

    monkeypatch.setattr("simkit.training.loop._one_step", no_training)
    result = CliRunner().invoke(app, [*args, "--resume", "--no-report"])
    assert result.exit_code == 0, result.output
    for name, frame in before.items():
        after = pd.read_csv(run / name)
        if name == "iris.csv":
            frame, after = frame.drop(columns="cache"), after.drop(columns="cache")
        pd.testing.assert_frame_equal(after, frame)


def test_resume_of_an_interrupted_two_seed_run_matches_an_uninterrupted_one(tmp_path, monkeypatch):
    data = tiny_data()
    settings = StitchSettings(layer_a="1", layer_b="1", objective="dm", steps=6, batch_size=16, seeds=2, train=1)
    whole = stitch(tiny_cnn, tiny_cnn, data, settings, run_dir=tmp_path / "whole", progress=False, cache_dir=None)
    real_fit = runner_mod._fit
    calls = {"n": 0}

    def stop_in_seed_two(*args):
        calls["n"] += 1
        if args[5].endswith("_s1"):
            raise KeyboardInterrupt
        return real_fit(*args)

    monkeypatch.setattr(runner_mod, "_fit", stop_in_seed_two)
    with pytest.raises(KeyboardInterrupt):
        stitch(tiny_cnn, tiny_cnn, data, settings, run_dir=tmp_path / "cut", progress=False, cache_dir=None)
    assert calls["n"] == 2  # seed 0's stitch, then seed 1's
    monkeypatch.setattr(runner_mod, "_fit", real_fit)
    resumed = stitch(tiny_cnn, tiny_cnn, data, settings, run_dir=tmp_path / "cut", resume=True, progress=False,
                     cache_dir=None)
    pd.testing.assert_frame_equal(resumed.tables["stitching"], whole.tables["stitching"])
    pd.testing.assert_frame_equal(resumed.tables["training"], whole.tables["training"])


def test_the_cli_builds_a_with_the_seed_and_b_with_the_seed_plus_one(tmp_path, data_spec, monkeypatch):
    from simkit.models import load_model

    seen = {}

    def capture(model_a, model_b, data, settings, **kwargs):
        seen.update(a=[model_a(s) for s in settings.seed_list()], b=[model_b(s) for s in settings.seed_list()])
        raise KeyboardInterrupt

    monkeypatch.setattr("simkit.stitching.runner.stitch", capture)
    result = CliRunner().invoke(app, ["stitch", MODEL, MODEL, "--data", data_spec, "--layer-a", "blocks.0",
                                      "--layer-b", "blocks.0", "--seed", "5", "--seeds", "2", "--no-report",
                                      "--out", str(tmp_path / "r")])
    assert result.exit_code == 130
    for i, seed in enumerate((5, 6)):
        for which, offset in (("a", 0), ("b", 1)):
            want = load_model(MODEL, seed=seed + offset).state_dict()
            got = seen[which][i].state_dict()
            assert all(torch.equal(got[k], want[k]) for k in want), (which, seed)
    a, b = seen["a"][0].state_dict(), seen["b"][0].state_dict()
    assert not all(torch.equal(a[k], b[k]) for k in a if a[k].is_floating_point())  # two networks, not one


# ------------------------------------------------------------------------------------- the library


def test_penalty_min_uses_the_weaker_of_the_front_and_b():
    data = tiny_data()
    weak, strong = tiny_cnn(0), tiny_cnn(1)
    result = stitch(weak, strong, data, StitchSettings(layer_a="1", layer_b="1", objective="dm", steps=3,
                                                       batch_size=16, train=0), progress=False, cache_dir=None)
    table = result.tables["stitching"]
    x_test, y_test = data.test.inputs, data.test.labels
    a_acc, b_acc = evaluate_accuracy(weak, x_test, y_test), evaluate_accuracy(strong, x_test, y_test)
    assert table.a_accuracy.iloc[0] == pytest.approx(a_acc) and table.b_accuracy.iloc[0] == pytest.approx(b_acc)
    np.testing.assert_allclose(table.penalty_min, min(a_acc, b_acc) - table.stitched_accuracy)
    np.testing.assert_allclose(table.penalty, b_acc - table.stitched_accuracy)
    assert (table.penalty_min <= table.penalty + 1e-12).all()
    assert result.summary["mean_penalty_min_dm_standard"] == pytest.approx(float(table.penalty_min.mean()))


def test_penalty_min_removes_the_floor_of_a_perfect_stitch_from_a_weaker_front():
    """A stitch that reproduces the weak front's network exactly pays A's gap under ``penalty`` but 0
    under ``penalty_min``: A and B identical but B's head made better by hand."""
    data = tiny_data()
    a = tiny_cnn(0)
    result = stitch(a, a, data, StitchSettings(layer_a="1", layer_b="1", objective="dm", steps=0, batch_size=16),
                    progress=False, cache_dir=None)
    row = result.tables["stitching"].iloc[0]
    assert row.penalty_min == pytest.approx(0.0, abs=1e-12) and row.penalty == pytest.approx(0.0, abs=1e-12)
    assert row.stitched_accuracy == pytest.approx(row.a_accuracy)


def test_validation_split_is_carved_from_the_stitching_data_and_the_best_step_kept(monkeypatch):
    data = tiny_data()
    scores: dict[str, list] = {}
    real_fit = runner_mod._fit

    def spy(*args):
        history = real_fit(*args)
        monitor = args[-1]
        scores[args[5]] = list(monitor.scores)
        return history

    monkeypatch.setattr(runner_mod, "_fit", spy)
    settings = StitchSettings(layer_a="1", layer_b="1", objective="dm,hlm", steps=7, batch_size=16, val_every=3,
                              val_fraction=0.2, lr=0.05)
    result = stitch(tiny_cnn(0), tiny_cnn(1), data, settings, progress=False, cache_dir=None)
    table, training = result.tables["stitching"], result.tables["training"]
    assert result.meta["n_val"] == 18 and result.meta["n_train"] == 72 and result.meta["n_test"] == 30
    for _, row in training.iterrows():
        steps = [s for s, _ in scores[f"stitch_1__1__{row.objective}__standard"]]
        assert steps == [0, 3, 6, 7]
        values = dict(scores[f"stitch_1__1__{row.objective}__standard"])
        best = max(values.values())
        assert row.chosen_step == min(s for s, v in values.items() if v == best)  # the first best step
        assert row.val_score == pytest.approx(best)
    assert set(table.chosen_step) <= {0, 3, 6, 7}
    # the validation split is drawn from the stitching data, never from the evaluation set
    from simkit.stitching.prepare import validation_split

    fit_part, val = validation_split(data, 0.2, 0)
    assert len(fit_part) + len(val) == len(data) and data.test is not None
    rows = data.inputs.flatten(1)
    for part in (fit_part, val):
        assert (part.inputs.flatten(1)[:, None] == rows[None]).all(-1).any(1).all()
    assert not (val.inputs.flatten(1)[:, None] == fit_part.inputs.flatten(1)[None]).all(-1).any()


def test_validation_settings_are_checked():
    with pytest.raises(SimkitError, match=r"`val_fraction` must be a number in \(0, 1\), got 1.0"):
        StitchSettings(layer_a="1", layer_b="1", val_fraction=1.0).validate()
    with pytest.raises(SimkitError, match="`val_every` must be 0 or a positive integer"):
        StitchSettings(layer_a="1", layer_b="1", val_every=-1).validate()
    with pytest.raises(SimkitError, match="`seeds` must be a positive integer"):
        StitchSettings(layer_a="1", layer_b="1", seeds=0).validate()
    with pytest.raises(SimkitError, match="leaves 1 to train"):
        stitch(tiny_cnn(0), tiny_cnn(1), tiny_data(4), StitchSettings(layer_a="1", layer_b="1", val_every=1,
                                                                      val_fraction=0.7), progress=False)


def test_iri_distances_and_b_labels_against_a_direct_computation(tmp_path):
    data = tiny_data()
    a, b = tiny_cnn(0), tiny_cnn(1)
    result = stitch(a, b, data, StitchSettings(layer_a="1", layer_b="1", objective="dm", steps=1, batch_size=16,
                                               iri=True, iri_steps=20, iri_restarts=1),
                    progress=False, cache_dir=tmp_path)
    saved = load_file(str(next(tmp_path.glob("iri-*.safetensors"))))
    iris, seeds = saved["iris"].double().numpy(), saved["seed_index"].numpy()
    x = data.inputs.double().numpy()
    diff = (iris - x[seeds]).reshape(len(x), -1)
    linf, l2 = np.abs(diff).max(axis=1), np.sqrt((diff ** 2).sum(axis=1))
    row = result.tables["iris"].iloc[0]
    assert row.seed_linf_median == pytest.approx(float(np.median(linf)))
    assert row.seed_l2_mean == pytest.approx(float(l2.mean()))
    with torch.no_grad():
        predicted = b(saved["iris"]).argmax(1).numpy()
    labels = data.labels.numpy()
    assert row.b_target_class_fraction == pytest.approx(float((predicted == labels).mean()))
    assert row.b_seed_class_fraction == pytest.approx(float((predicted == labels[seeds]).mean()))


def test_seed_distances_are_nan_for_noise_seeds():
    x = torch.rand(6, 1, 4)
    front = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    iris, _ = generate_iris(front, x, IRISettings(steps=3, seed="noise", restarts=0), value_range=(0.0, 1.0),
                            progress=False)
    linf, l2 = seed_distances(iris, x)
    assert torch.isnan(linf).all() and torch.isnan(l2).all()
