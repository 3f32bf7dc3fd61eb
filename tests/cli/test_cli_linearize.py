"""`simkit linearize` and `simkit napl` end to end through typer's CliRunner."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.helpers import invoke


def test_napl_json_plain_and_residual():
    plain = invoke("napl", "simkit:cnn1d:channels=4,layers=3", "--json")
    assert plain.exit_code == 0, plain.output
    data = json.loads(plain.stdout)
    assert data["napl"] == pytest.approx(3.0)
    assert data["distribution"] == pytest.approx([0, 0, 0, 1])
    residual = invoke("napl", "simkit:cnn2d:channels=4,layers=3,residual=True", "--json", "--data", "digits")
    assert residual.exit_code == 0, residual.output
    data = json.loads(residual.stdout)
    assert data["napl"] == pytest.approx(2.0)                    # 1 + ½ + ½
    assert data["distribution"] == pytest.approx([0, 0.25, 0.5, 0.25])


def test_napl_table():
    result = invoke("napl", "simkit:cnn1d:channels=4,layers=2")
    assert result.exit_code == 0, result.output
    assert "NAPL 2" in result.stdout and "length" in result.stdout


def test_linearize_end_to_end_and_resume(tmp_path):
    out = tmp_path / "run"
    args = ["linearize", "simkit:cnn2d:channels=4,layers=2", "--data", "digits", "--n", "200", "--train", "1",
            "--epochs", "1", "--omega", "1e-2,1", "--granularity", "channel,layer", "--batch-size", "64",
            "--fold", "--device", "cpu", "--out", out]
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs.columns[:5]) == ["granularity", "omega", "napl", "nonlinear_fraction", "accuracy"]
    assert sorted(zip(runs["granularity"], runs["omega"], strict=True)) == [
        ("channel", 0.01), ("channel", 1.0), ("layer", 0.01), ("layer", 1.0)]
    assert runs["napl"].between(0, 2).all()
    summary = json.loads((out / "result.json").read_text())["summary"]
    assert {"original_accuracy", "original_napl", "runs"} <= set(summary)
    assert summary["original_napl"] == pytest.approx(2.0)
    assert json.loads((out / "result.json").read_text())["meta"]["device"] == "cpu"
    html = (out / "report.html").read_text()
    assert "Accuracy against NAPL" in html and "<script src" not in html
    again = invoke(*args, "--resume", "--no-report")
    assert again.exit_code == 0, again.output
    rerun = pd.read_csv(out / "runs.csv")
    cols = ["napl", "nonlinear_fraction", "accuracy", "steps"]
    pd.testing.assert_frame_equal(rerun[cols], runs[cols])


def test_linearize_data_without_labels_exits_2(tmp_path):
    result = invoke("linearize", "simkit:cnn1d:channels=4,layers=2", "--data", "synthetic:1x40", "--n", "16",
                    "--epochs", "1", "--out", tmp_path / "x")
    assert result.exit_code == 2
    assert "has no labels" in result.output


@pytest.mark.parametrize("device, message", [
    ("cuda", "error: --device cuda was asked for but no CUDA device is available; use --device cpu"),
    ("gpu", "error: unknown device 'gpu'; use cpu, cuda or cuda:N"),
])
def test_linearize_unavailable_device_exits_2_before_writing(tmp_path, device, message):
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("a CUDA device is available here")
    result = invoke("linearize", "simkit:cnn2d:channels=4,layers=2", "--data", "digits", "--n", "40", "--epochs", "1",
                    "--device", device, "--out", tmp_path / "x")
    assert result.exit_code == 2
    assert result.output.strip() == message
    assert not (tmp_path / "x").exists()


def test_linearize_bad_omega_exits_2(tmp_path):
    result = invoke("linearize", "simkit:cnn1d:channels=4,layers=2", "--omega", "big", "--out", tmp_path / "x")
    assert result.exit_code == 2
    assert "--omega must be a non-empty list of values, each a number >= 0, got 'big'" in result.output


def test_napl_json_is_strict_json():
    result = invoke("napl", "simkit:cnn1d:channels=4,layers=2", "--json")
    assert result.exit_code == 0, result.output

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    data = json.loads(result.stdout, parse_constant=refuse)
    assert data["nonlinear_fraction"] is None       # channel counts are unknown without --data


@pytest.mark.parametrize("command", [
    ["napl", "simkit:cnn1d:channels=4,layers=2", "--data", "digits"],
    ["linearize", "simkit:cnn1d:channels=4,layers=2", "--data", "digits", "--n", "16", "--epochs", "1"],
], ids=["napl", "linearize"])
def test_data_that_does_not_fit_the_model_exits_2(tmp_path, command):
    extra = ["--out", tmp_path / "x"] if command[0] == "linearize" else []
    result = invoke(*command, *extra)
    assert result.exit_code == 2, result.output
    assert "failed on inputs of shape (2, 1, 8, 8)" in result.output and "--data" in result.output
    assert not (tmp_path / "x" / "result.json").exists()


def test_linearize_seeds_end_to_end(tmp_path):
    out = tmp_path / "run"
    result = invoke("linearize", "simkit:cnn2d:channels=4,layers=2", "--data", "digits", "--n", "200", "--train", "1",
                    "--epochs", "1", "--omega", "1", "--seeds", "2", "--seed", "3", "--batch-size", "64", "--no-cka",
                    "--out", out)
    assert result.exit_code == 0, result.output
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(zip(runs["granularity"], runs["seed"], strict=True)) == [
        ("channel", 3), ("channel", 4), ("layer", 3), ("layer", 4)]
    aggregate = pd.read_csv(out / "aggregate.csv")
    assert aggregate["seeds"].tolist() == [2, 2]
    assert aggregate["accuracy_mean"].tolist() == pytest.approx(runs.groupby("granularity")["accuracy"].mean().tolist())
    assert (out / "matched.csv").is_file() and (out / "matched_mean.csv").is_file()
    saved = json.loads((out / "result.json").read_text())
    assert saved["summary"]["seeds"] == [3, 4] and saved["meta"]["settings"]["seeds"] == 2
    assert json.loads((out / "inputs.json").read_text())["options"]["seeds"] == 2
    html = (out / "report.html").read_text()
    assert "mean ± std over seeds" in html and "Every granularity × ω ran for seeds 3, 4" in html


def test_linearize_seeds_zero_exits_2(tmp_path):
    result = invoke("linearize", "simkit:cnn1d:channels=4,layers=2", "--seeds", "0", "--out", tmp_path / "x")
    assert result.exit_code == 2
    assert "--seeds must be a positive integer, got 0" in result.output
    assert not (tmp_path / "x").exists()
