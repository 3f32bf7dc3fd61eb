"""Network of Theseus, issue 16: validation split, fair (converged) baselines and their budgets, the
stage stopping rules, guide training, the rank sweep and the report's findings."""

from __future__ import annotations

import math
import re

import pytest
import torch

from simkit.conversion import ConvertSettings
from simkit.conversion.runner import split_validation
from simkit.errors import SimkitError
from simkit.report import render_report
from simkit.training import evaluate_accuracy
from tests.conversion.test_conversion import QUICK, run, tiny_data, tiny_guide

N_TRAIN = 192 - round(192 * 0.1)  # tiny_data: 192 training rows, 10 % held out for validation
PER_EPOCH = math.ceil(N_TRAIN / 64)  # QUICK's fine-tuning batch


def _rows(x: torch.Tensor) -> set[tuple[float, ...]]:
    return {tuple(r) for r in x.reshape(len(x), -1).tolist()}


def test_validation_split_is_carved_from_training_only_and_seeded():
    data = tiny_data()
    train_all, test = data.train_test()
    train, val = split_validation(train_all, 0.25, seed=3)
    assert (len(train), len(val)) == (144, 48)
    assert _rows(train.inputs).isdisjoint(_rows(val.inputs))
    assert _rows(train.inputs) | _rows(val.inputs) == _rows(train_all.inputs)
    assert _rows(val.inputs).isdisjoint(_rows(test.inputs))
    again, val2 = split_validation(train_all, 0.25, seed=3)
    assert torch.equal(val.inputs, val2.inputs) and torch.equal(val.labels, val2.labels)
    _, other = split_validation(train_all, 0.25, seed=4)
    assert not torch.equal(val.inputs, other.inputs)
    assert split_validation(train_all, 0.0, seed=3) == (train_all, None)
    with pytest.raises(SimkitError, match="`val_fraction`"):
        split_validation(train_all.take(slice(0, 5)), 0.5, seed=0)


def _ema(losses, window):
    """The loop's documented smoothing: ema ← β·ema + (1 − β)·loss, β = 1 − 1/window, from the first loss."""
    out, e, beta = [], None, 1.0 - 1.0 / window
    for v in losses:
        e = v if e is None else beta * e + (1 - beta) * v
        out.append(e)
    return out


def test_fixed_steps_run_every_step_and_auto_stages_stop_at_the_threshold_or_the_cap():
    data, common = tiny_data(), dict(QUICK, plateau_window=100)
    fixed = run(tiny_guide(), data, steps_per_stage=20, **common)
    summary = fixed.tables["stage_summary"]
    assert summary["steps"].tolist() == [20, 20] and set(summary["rule"]) == {"fixed 20 steps"}
    assert summary["stop_loss"].isna().all()  # "auto" is off with a fixed number: no hidden rule

    # the threshold: stage 1's smoothed loss at step 8 (a hair above), so it must stop by step 8
    curve = fixed.tables["curves"]
    stage1 = curve[curve["phase"] == "stage1"].sort_values("step")["loss"].tolist()
    ema = _ema(stage1, 100)
    threshold = ema[7] * (1 + 1e-9)
    expected = next(i for i, e in enumerate(ema) if e < threshold) + 1
    auto = run(tiny_guide(), data, steps_per_stage="auto", max_stage_steps=20, stop_loss=threshold, **common)
    first = auto.tables["stage_summary"].iloc[0]
    assert (first["steps"], first["stopped"]) == (expected, "stop_loss")
    assert first["rule"] == f"loss EMA < {threshold:g}" and first["max_steps"] == 20
    # stages.csv carries why each stage stopped on every layer row of that stage
    rows = auto.tables["stages"]
    stage_rows = rows[rows["stage"] == "stage1"]
    assert (stage_rows["steps"] == expected).all() and (stage_rows["stopped"] == "stop_loss").all()
    assert stage_rows["final_loss"].notna().all() and stage_rows["loss"].notna().all()

    capped = run(tiny_guide(), data, steps_per_stage="auto", max_stage_steps=7, stop_loss=None, **common)
    summary = capped.tables["stage_summary"]
    assert summary["steps"].tolist() == [7, 7] and set(summary["rule"]) == {"step cap 7"}
    joint = run(tiny_guide(), data, schedule=["joint"], steps_per_stage="auto", max_stage_steps=3, stop_loss=None,
                **common).tables["stage_summary"]
    assert joint["steps"].tolist() == [6] and joint["rule"].tolist() == ["step cap 6"]  # 2 modules × 3
    assert ConvertSettings().effective_stop_loss == 0.002
    assert ConvertSettings(steps_per_stage=300).effective_stop_loss is None
    assert ConvertSettings(steps_per_stage=300, stop_loss=0.01).effective_stop_loss == 0.01


@pytest.mark.parametrize("epochs, expected", [(5, 4 * 2 + 5 * PER_EPOCH), (1, 4 * 2 + 2 * PER_EPOCH)])
def test_baselines_train_at_least_the_conversion_steps_and_the_gain_is_reported(epochs, expected):
    """Budget = max(the conversion's optimizer steps, baseline_epochs); the best validation epoch kept.
    baseline_epochs 5 > head + fine-tuning (2): the fine-tuning is extended to 4 epochs (labelled epochs
    equal), and the baselines then train for the conversion's steps."""
    options = dict(QUICK, baselines=["scratch", "kd"], steps_per_stage=4, baseline_epochs=epochs,
                   baseline_patience=2, baseline_budget="steps")  # the earlier rule (the plateau rule: test_conversion_budget)
    result = run(tiny_guide(), tiny_data(), **options)
    row = result.tables["runs"].iloc[0]
    assert row["align_steps"] == 4 * 2
    assert row["head_steps"] == PER_EPOCH and row["finetune_steps"] == max(1, epochs - 1) * PER_EPOCH
    assert row["labelled_epochs"] == max(2, epochs)
    assert row["steps"] == row["align_steps"] + row["head_steps"] + row["finetune_steps"]
    base = result.tables["baselines"].set_index("baseline")
    validation = result.tables["validation"]
    for kind in ("scratch", "kd"):
        b = base.loc[kind]
        assert b["min_steps"] == row["steps"] and b["steps"] == max(row["steps"], expected)
        assert b["stopped"] == "steps"
        phase = "scratch" if kind == "scratch" else "kd-trained"
        scores = validation[validation["phase"] == phase]
        # once per epoch and at the last step
        expected_steps = sorted(set(range(PER_EPOCH, b["steps"] + 1, PER_EPOCH)) | {b["steps"]})
        assert scores["step"].tolist() == expected_steps
        # the kept weights are those of the best validation epoch (ties to the earlier one)
        best = scores.loc[scores["val_accuracy"].idxmax()]
        assert b["best_step"] == best["step"] and b["val_accuracy"] == best["val_accuracy"]
        assert b["still_improving"] == (b["best_step"] > b["steps"] - 2 * PER_EPOCH)
    s = result.summary
    assert s["scratch_steps"] == base.loc["scratch", "steps"] and s["kd_steps"] == base.loc["kd", "steps"]
    assert s["converted_steps"] == row["steps"] and s["align_steps"] == 8
    assert s["gain_over_scratch"] == pytest.approx(s["converted_accuracy"] - s["scratch_accuracy"])
    assert row["gain_over_scratch"] == pytest.approx(s["gain_over_scratch"])
    assert s["val_samples"] == 192 - N_TRAIN


def test_guide_training_keeps_the_best_validation_epoch_and_reports_it():
    data = tiny_data()
    guide = tiny_guide()
    result = run(guide, data, **dict(QUICK, steps_per_stage=2, train_guide=3))
    _, val = split_validation(data.train_test()[0], 0.1, seed=0)
    # the guide is trained in place: its validation accuracy recomputed independently
    assert result.summary["guide_val_accuracy"] == evaluate_accuracy(guide, val.inputs, val.labels)
    assert result.summary["guide_steps"] == 3 * PER_EPOCH
    scores = result.tables["validation"]
    scores = scores[scores["phase"] == "guide"]
    assert len(scores) == 3 and scores["val_accuracy"].max() == result.summary["guide_val_accuracy"]
    assert result.summary["guide_accuracy"] == evaluate_accuracy(guide, data.test.inputs, data.test.labels)


def test_rank_sweep_gives_one_row_per_rank_and_its_figure(tmp_path):
    result = run(tiny_guide(), tiny_data(), **dict(QUICK, rank=[4, 8], steps_per_stage=2),
                 run_dir=tmp_path / "run")
    runs = result.tables["runs"]
    assert runs["rank"].tolist() == [4, 8] and result.summary["rank"] == 4
    assert set(result.tables["stages"]["rank"]) == {4, 8}
    assert (tmp_path / "run/checkpoints/trained-progressive-linear_cka-rank8-stage2.pt").is_file()
    html = render_report(result, tmp_path / "report.html").read_text()
    assert "Rank sweep" in html and "rank sweep" in html
    with pytest.raises(SimkitError, match="rank sweep"):
        from simkit.conversion.recipes import conv_to_mlp
        run(tiny_guide(), tiny_data(), plan_object=conv_to_mlp(tiny_guide(), 4), **dict(QUICK, rank=[4, 8],
                                                                                             recipe=None))
    with pytest.raises(SimkitError, match="`rank`"):
        ConvertSettings(rank=[4, 0]).validate()


def test_report_leads_with_the_headline_and_times_each_phase_once(tmp_path):
    options = dict(QUICK, baselines=["scratch", "kd"], steps_per_stage=2, train_guide=1, baseline_epochs=2)
    result = run(tiny_guide(), tiny_data(), **options)
    html = render_report(result, tmp_path / "report.html").read_text()
    findings = re.search(r'<section class="findings".*?</section>', html, re.S)
    assert findings is not None and findings.start() < html.index("<img")
    s = result.summary
    text = findings.group(0)
    assert f"{s['converted_accuracy']:.4g} vs {s['scratch_accuracy']:.4g}" in text
    assert f"{100 * s['gain_over_scratch']:+.1f} points" in text
    assert f"scratch {s['scratch_steps']}" in text
    for heading in ("Alignment: which layers are hardest", "hybrid accuracy after each stage", "Baselines",
                    "held-out linear_cka loss per layer", "validation accuracy per epoch"):
        assert heading in html, heading
    timings = result.meta["timings"]
    assert "guide" in timings and "train_guide" not in timings
    assert "kd-trained" in timings and "kd_trained" not in timings and "scratch" in timings


def test_a_run_without_baselines_or_validation_saves_and_loads(tmp_path):
    from simkit.results import load

    result = run(tiny_guide(), tiny_data(), **dict(QUICK, steps_per_stage=2, val_fraction=0.0))
    assert "baselines" not in result.tables and "validation" not in result.tables
    assert result.summary["guide_val_accuracy"] is None and result.summary["val_samples"] == 0
    assert result.summary["gain_over_scratch"] is None
    result.save(tmp_path)
    loaded = load(tmp_path)
    assert loaded.summary == result.summary
    assert "Final table" in render_report(loaded, tmp_path / "r.html").read_text()
