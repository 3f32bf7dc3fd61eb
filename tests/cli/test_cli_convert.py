"""`simkit convert` end to end on a tiny run (digits, a 2-block CNN), through typer's CliRunner."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from simkit.cli.main import app
from simkit.report import render_report

GUIDE = "simkit:cnn2d:channels=4,layers=2"
TINY = ["--data", "digits", "--n", "300", "--rank", "8", "--steps-per-stage", "3", "--finetune-epochs", "1",
        "--batch-size", "64", "--train-guide", "1", "--baseline-epochs", "2"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("convert")
    result = CliRunner().invoke(app, ["convert", GUIDE, "--recipe", "conv-to-mlp", *TINY,
                                      "--schedule", "progressive,joint", "--metric", "cka",
                                      "--baselines", "scratch,kd", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_cli_writes_the_contract_files(run_dir):
    data = json.loads((run_dir / "result.json").read_text())
    assert data["kind"] == "convert"
    summary = data["summary"]
    for key in ("guide_accuracy", "converted_accuracy", "scratch_accuracy", "kd_accuracy"):
        assert 0.0 <= summary[key] <= 1.0
    assert (summary["schedule"], summary["metric"], summary["recipe"]) == ("progressive", "linear_cka", "conv-to-mlp")  # cka: alias
    assert data["meta"]["settings"]["device"] == "cpu"
    runs = pd.read_csv(run_dir / "runs.csv")
    assert runs["schedule"].tolist() == ["progressive", "joint"]
    stages = pd.read_csv(run_dir / "stages.csv")
    assert {"stage", "layer", "alignment_metric", "value"} <= set(stages.columns)
    progressive = stages[stages["schedule"] == "progressive"]
    assert set(progressive["stage"]) == {"stage1", "stage2", "finetuned"}
    assert set(progressive["layer"]) == {"blocks.0.conv", "blocks.1.conv"}
    assert (run_dir / "checkpoints" / "trained-progressive-linear_cka-stage2.pt").is_file()


def test_cli_report_has_heatmaps_and_table(run_dir):
    html = (run_dir / "report.html").read_text()
    assert "CKA vs guide after each stage" in html
    assert "converted target × guide" in html
    assert html.count("<svg") >= 3  # two stage heatmaps and the layer heatmap
    assert "logit distillation" in html and "http://" not in html.replace("http://www.w3.org", "")


def test_cli_resume_reproduces_the_run(run_dir, tmp_path):
    before = json.loads((run_dir / "result.json").read_text())["summary"]
    result = CliRunner().invoke(app, ["convert", GUIDE, *TINY, "--schedule", "progressive,joint",
                                      "--baselines", "scratch,kd", "--out", str(run_dir), "--resume",
                                      "--no-report"])
    assert result.exit_code == 0, result.output
    after = json.loads((run_dir / "result.json").read_text())["summary"]
    assert after == before


def test_cli_bad_input_exits_2(tmp_path):
    result = CliRunner().invoke(app, ["convert", GUIDE, *TINY, "--recipe", "conv-to-kan", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "'conv-to-kan' is not one of 'conv-to-mlp'" in result.output  # a choice: typer refuses it
    result = CliRunner().invoke(app, ["convert", GUIDE, *TINY, "--metric", "cka,l2", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "unknown alignment loss 'l2'" in result.output
    result = CliRunner().invoke(app, ["convert", GUIDE, *TINY, "--resume", "--out", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_report_rerenders_from_the_run_directory(run_dir, tmp_path):
    from simkit.results import load

    loaded = load(run_dir)
    assert type(loaded).__name__ == "ConvertResult"
    html = render_report(loaded, tmp_path / "again.html").read_text()
    assert "CKA vs guide after each stage" in html and "<script" not in html
    loaded.extra["plan"] = "<script>alert(1)</script>"  # user text (a plan file's description) is escaped
    loaded.tables["stages"].loc[0, "layer"] = "<b>x</b>"
    html = render_report(loaded, tmp_path / "escaped.html").read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)" in html and "<b>x</b>" not in html


@pytest.mark.parametrize("device, message", [
    ("cuda", "error: --device cuda was asked for but no CUDA device is available; use --device cpu"),
    ("gpu", "error: unknown device 'gpu'; use cpu, cuda or cuda:N"),
])
def test_cli_unavailable_device_exits_2_before_writing(tmp_path, device, message):
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("a CUDA device is available here")
    result = CliRunner().invoke(app, ["convert", GUIDE, *TINY, "--device", device, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert result.output.strip() == message
    assert not (tmp_path / "x").exists()


def test_help_shows_every_stopping_rule_and_its_default():
    result = CliRunner().invoke(app, ["convert", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for flag, default in (("--steps-per-stage", "auto"), ("--max-stage-steps", "1000"), ("--stop-loss", "auto"),
                          ("--plateau-window", "100"), ("--plateau-factor", "0.5"), ("--val-fraction", "0.1"),
                          ("--baseline-patience", "10"), ("--baseline-epochs", "60.0"),
                          ("--baseline-max-epochs", "200.0"), ("--guide-lr", "0.01")):
        assert re.search(re.escape(flag) + r".*?\[default: " + re.escape(default) + r"\]", text), flag


@pytest.mark.parametrize("args, message", [
    (["--steps-per-stage", "many"], "--steps-per-stage must be 'auto' or a positive integer"),
    (["--stop-loss", "low"], "--stop-loss must be 'auto' or a finite number or none, got 'low'"),
    (["--rank", "8,x"], "--rank must be a non-empty list of values, each a positive integer"),
    (["--val-fraction", "0.95"], "--val-fraction"),
    (["--max-stage-steps", "0"], "--max-stage-steps"),
    (["--baseline-patience", "0"], "--baseline-patience"),
    (["--seeds", "0"], "--seeds must be a positive integer"),
    (["--kd-alpha", "1.5"], "--kd-alpha must be a number in [0, 1], got 1.5"),
    (["--align-val", "--val-fraction", "0"], "--align-val adds the validation inputs"),
])
def test_cli_bad_stopping_options_exit_2_with_one_line(tmp_path, args, message):
    result = CliRunner().invoke(app, ["convert", GUIDE, *TINY, *args, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_cli_auto_stages_and_a_rank_sweep(tmp_path):
    args = [a for a in TINY if a not in ("--steps-per-stage", "3", "--rank", "8")]
    result = CliRunner().invoke(app, ["convert", GUIDE, *args, "--steps-per-stage", "auto", "--max-stage-steps", "4",
                                      "--stop-loss", "none", "--rank", "4,8", "--baselines", "scratch",
                                      "--baseline-max-epochs", "3", "--baseline-budget", "steps", "--out",
                                      str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "gain over scratch" in result.output
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert runs["rank"].tolist() == [4, 8]
    assert (runs["scratch_steps"] >= runs["steps"].max()).all()
    stages = pd.read_csv(tmp_path / "stage_summary.csv")
    assert stages["steps"].tolist() == [4, 4, 4, 4] and set(stages["rule"]) == {"step cap 4"}
    summary = json.loads((tmp_path / "result.json").read_text())["summary"]
    assert summary["gain_over_scratch"] == pytest.approx(summary["converted_accuracy"] - summary["scratch_accuracy"])
    settings = json.loads((tmp_path / "inputs.json").read_text())
    assert "rank" in json.dumps(settings) and "max_stage_steps" in json.dumps(settings)
    html = (tmp_path / "report.html").read_text()
    assert html.index('id="findings"') < html.index("<img") and "Rank sweep" in html


def test_meta_records_the_settings_as_given_and_as_resolved(run_dir):
    meta = json.loads((run_dir / "result.json").read_text())["meta"]
    options = json.loads((run_dir / "inputs.json").read_text())["options"]
    given, resolved = meta["settings_given"], meta["settings"]
    assert given == {k: v for k, v in options.items() if k not in ("guide", "data", "weights", "data_seed")}
    assert (given["stop_loss"], given["steps_per_stage"]) == ("auto", 3)
    assert resolved["stop_loss"] is None and resolved["stage_steps"] == 3  # "auto" is off with a fixed number


def test_cli_weights_load_the_guide_and_are_recorded(tmp_path, monkeypatch):
    import hashlib

    import torch

    from simkit.errors import SimkitError
    from simkit.models import load_model, save_model

    saved = load_model(GUIDE, seed=7)
    with torch.no_grad():
        for p in saved.parameters():
            p.add_(0.25)  # weights no seed initialises
    path = save_model(saved, tmp_path / "guide", GUIDE)
    seen = {}

    def stop(guide, data, settings, *, run_dir, **kwargs):
        seen.update(guide=guide, run_dir=run_dir)
        raise SimkitError("stopped before converting")

    monkeypatch.setattr("simkit.conversion.convert", stop)
    result = CliRunner().invoke(app, ["convert", GUIDE, *TINY, "--weights", str(path), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "stopped before converting" in result.output
    x = torch.rand(5, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(seen["guide"](x), saved.eval()(x))
        assert not torch.equal(seen["guide"](x), load_model(GUIDE, seed=0)(x))  # not the random init
    record = seen["run_dir"].record
    assert record["options"]["weights"] == str(path)
    assert record["files"]["weights"] == {str(path): hashlib.sha256(path.read_bytes()).hexdigest()}


def test_cli_seeds_write_per_seed_rows_the_aggregate_and_the_paired_headline_and_resume(tmp_path):
    from torch.optim.optimizer import register_optimizer_step_post_hook

    out = tmp_path / "seeds"
    args = ["convert", GUIDE, *TINY, "--metric", "linear_cka", "--baselines", "scratch", "--seeds", "2",
            "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "seed 1 progressive linear_cka trained" in result.output
    assert "gain over scratch" in result.output and "95% CI" in result.output
    runs = pd.read_csv(out / "runs.csv")
    assert runs["seed"].tolist() == [0, 1]
    assert {"labelled_epochs", "steps", "scratch_labelled_epochs", "scratch_steps", "still_improving",
            "scratch_still_improving", "best_step"} <= set(runs.columns)
    aggregate = pd.read_csv(out / "aggregate.csv").set_index("role")
    converted = aggregate.loc["converted"]
    assert converted["seeds"] == 2 and converted["accuracy_mean"] == pytest.approx(runs["converted_accuracy"].mean())
    assert converted["accuracy_low"] <= converted["accuracy_mean"] <= converted["accuracy_high"]
    data = json.loads((out / "result.json").read_text())
    summary, meta = data["summary"], data["meta"]
    assert summary["seeds"] == [0, 1] and meta["seed_models"] == "built for each seed"
    gains = runs["converted_accuracy"] - runs["scratch_accuracy"]
    assert summary["gain_over_scratch"] == pytest.approx(gains.mean())
    assert summary["gain_over_scratch_low"] < gains.mean() < summary["gain_over_scratch_high"]
    assert summary["gain_beyond_noise"] == (summary["gain_over_scratch_low"] > 0 or summary["gain_over_scratch_high"] < 0)
    html = (out / "report.html").read_text()
    first = re.search(r'<section class="findings".*?<p>(.*?)</p>', html, re.S).group(1)
    assert "paired by seed" in first and "95% CI" in first and "2 seeds" in first
    assert ("— beyond noise" in first) == summary["gain_beyond_noise"]
    assert ("not beyond noise" in first) == (not summary["gain_beyond_noise"])
    assert "Budgets of every arm" in html and "Every seed, the mean and its interval" in html
    for name in ("guide_s0", "guide_s1", "trained-progressive-linear_cka-stage2_s1", "scratch_s1"):
        assert (out / "checkpoints" / f"{name}.pt").is_file(), name

    steps = {"n": 0}
    handle = register_optimizer_step_post_hook(lambda optimizer, a, k: steps.update(n=steps["n"] + 1))
    try:
        again = CliRunner().invoke(app, [*args, "--resume", "--no-report"])
    finally:
        handle.remove()
    assert again.exit_code == 0, again.output
    assert steps["n"] == 0  # nothing recomputed: every phase of both seeds restored
    resumed = json.loads((out / "result.json").read_text())["summary"]
    assert resumed == summary


def test_cli_align_data_and_align_val_add_unlabeled_alignment_inputs(tmp_path):
    out = tmp_path / "align"
    result = CliRunner().invoke(app, ["convert", GUIDE, *TINY, "--baselines", "none", "--align-val",
                                      "--align-data", "digits", "--no-report", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "result.json").read_text())
    meta, summary = data["meta"], data["summary"]
    from simkit.data import load_data

    extra = len(load_data("digits").inputs)
    assert summary["align_samples"] == meta["n_align"] == meta["n_train"] + meta["n_val"] + extra
    options = json.loads((out / "inputs.json").read_text())["options"]
    assert options["align_data"] == "digits" and options["align_val"] is True
