"""`simkit compare` and `simkit capture` end to end, through the CLI, including every bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from tests.helpers import invoke

MLP_A = "simkit:mlp:in_features=40,hidden=16,depth=3"
MLP_B = "simkit:mlp:in_features=40,hidden=12,depth=2"

def test_compare_writes_the_run_directory(tmp_path):
    out = tmp_path / "run"
    result = invoke("compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "64", "--null", "2",
                    "--metric", "linear_cka", "--metric", "unbiased_cka,mutual_knn", "--out", str(out))
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(out / "similarity.csv")
    assert list(frame.columns) == ["layer_a", "layer_b", "metric", "value", "null_mean", "null_p95", "chance",
                                   "beats_chance"]
    assert set(frame["metric"]) == {"linear_cka", "unbiased_cka", "mutual_knn"}
    data = json.loads((out / "result.json").read_text())
    assert data["kind"] == "compare"
    for key in ("model_a", "model_b", "data", "n", "mode", "metrics", "n_layers_a", "n_layers_b"):
        assert key in data["summary"]
    assert data["summary"]["n"] == 64 and data["summary"]["model_a"] == MLP_A
    assert data["meta"]["versions"]["torch"] and data["meta"]["command"]
    layers = pd.read_csv(out / "layers.csv")
    for side in ("a", "b"):
        listed = data["meta"]["layers"][side]
        assert [row["name"] for row in listed] == list(layers.loc[layers["model"] == side, "name"])
        assert all(row["shape"] and row["reduction"] == "flatten" and row["dim"] > 0 for row in listed)
    html = (out / "report.html").read_text()
    assert "<svg" in html and "linear_cka" in html
    assert not list(out.glob(".*.tmp"))


def test_no_report_skips_the_html(tmp_path):
    result = invoke("compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "32", "--no-report", "--out",
                    str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "result.json").is_file() and not (tmp_path / "run" / "report.html").exists()


def test_capture_then_compare_caches_equals_direct(tmp_path):
    common = ["--data", "mnist1d", "--n", "96", "--batch-size", "32"]
    for name, spec, seed in (("a", MLP_A, "0"), ("b", MLP_B, "1")):
        done = invoke("capture", spec, *common, "--seed", seed, "--out", str(tmp_path / name))
        assert done.exit_code == 0, done.output
    assert invoke("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--batch-size", "32", "--no-report",
                  "--out", str(tmp_path / "cached")).exit_code == 0
    assert invoke("compare", MLP_A, MLP_B, *common, "--no-report", "--out", str(tmp_path / "direct")).exit_code == 0
    cached = pd.read_csv(tmp_path / "cached" / "similarity.csv")
    direct = pd.read_csv(tmp_path / "direct" / "similarity.csv")
    np.testing.assert_allclose(cached["value"], direct["value"], atol=1e-12, rtol=0)


@pytest.fixture
def nan_data(tmp_path):
    x = np.random.default_rng(0).normal(size=(16, 1, 40)).astype(np.float32)
    x[3, 0, 5] = np.nan
    np.save(tmp_path / "x.npy", x)
    return f"npy:{tmp_path / 'x.npy'}"


@pytest.mark.parametrize("args, message", [
    (["--metric", "cosine"], "unknown metric 'cosine'"),
    (["--layers-a", "blocks.9"], "simkit layers"),
    (["--n", "3", "--metric", "unbiased_cka"], "at least 4 samples"),
    (["--mode", "fast"], "fast"),
    (["--data", "nosuchdata"], "nosuchdata"),
], ids=["metric", "layer", "few-samples", "mode", "data"])
def test_bad_input_exits_2_with_one_line(tmp_path, args, message):
    base = ["compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "32", "--out", str(tmp_path / "run")]
    result = invoke(*base, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "run" / "result.json").exists()


@pytest.mark.parametrize("command", ["compare", "capture"])
@pytest.mark.parametrize("device, message", [
    pytest.param("gpu", "unknown device 'gpu'; use cpu, cuda or cuda:N", id="gpu"),
    pytest.param("cuda", "--device cuda was asked for but no CUDA device is available; use --device cpu", id="cuda",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is there")),
])
def test_a_device_that_is_not_there_exits_2_with_one_line(tmp_path, command, device, message):
    models = [MLP_A, MLP_B] if command == "compare" else [MLP_A]
    result = invoke(command, *models, "--data", "mnist1d", "--n", "32", "--device", device,
                    "--out", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "run").exists()


def test_unknown_model_spec(tmp_path):
    result = invoke("compare", "torchvision:resnet_18", MLP_B, "--data", "mnist1d", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2 and "resnet18" in result.output


def test_missing_data_for_models(tmp_path):
    result = invoke("compare", MLP_A, MLP_B, "--out", str(tmp_path / "r"))
    assert result.exit_code == 2 and "--data is required" in result.output


def test_non_finite_activations_name_model_and_layer(tmp_path, nan_data):
    result = invoke("compare", MLP_A, MLP_B, "--data", nan_data, "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "non-finite" in result.output and MLP_A in result.output


def test_data_that_does_not_fit_the_model(tmp_path):
    result = invoke("compare", MLP_A, MLP_B, "--data", "digits", "--n", "32", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "failed on inputs of shape (32, 1, 8, 8)" in result.output and "--data" in result.output


def test_knn_k_and_rbf_factor_options(tmp_path):
    base = ["compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "8", "--no-report"]
    default_k = invoke(*base, "--metric", "mutual_knn", "--out", str(tmp_path / "k10"))
    assert default_k.exit_code == 2 and "needs at least 11 samples" in default_k.output
    small_k = invoke(*base, "--metric", "mutual_knn", "--knn-k", "3", "--out", str(tmp_path / "k3"))
    assert small_k.exit_code == 0, small_k.output
    assert json.loads((tmp_path / "k3" / "result.json").read_text())["meta"]["settings"]["knn_k"] == 3
    values = {}
    for factor in ("1", "3"):
        done = invoke(*base, "--metric", "rbf_cka", "--rbf-factor", factor, "--out", str(tmp_path / f"rbf{factor}"))
        assert done.exit_code == 0, done.output
        values[factor] = pd.read_csv(tmp_path / f"rbf{factor}" / "similarity.csv")["value"].to_numpy()
    assert not np.allclose(values["1"], values["3"])
    bad = invoke(*base, "--metric", "rbf_cka", "--rbf-factor", "0", "--out", str(tmp_path / "bad"))
    assert bad.exit_code == 2 and "--rbf-factor must be a number > 0, got 0.0" in bad.output


ALL_MEASURES = "procrustes,procrustes_angle,cca,svcca,pwcca,shape_metric,rsa,ridge_r2,jaccard_knn"


def test_compare_with_every_new_measure_end_to_end(tmp_path):
    out = tmp_path / "measures"
    result = invoke("compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "64", "--null", "2", "--knn-k", "5",
                    "--metric", ALL_MEASURES, "--shape-alpha", "0.25", "--cca-eps", "0.01", "--svcca-keep", "0.9",
                    "--ridge-lambda", "0.1", "--ridge-folds", "4", "--rsa-distance", "euclidean",
                    "--rsa-compare", "kendall_tau_a", "--out", str(out))
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(out / "similarity.csv")
    assert set(frame["metric"]) == set(ALL_MEASURES.split(","))
    assert frame[["value", "null_mean", "null_p95"]].notna().all().all()
    data = json.loads((out / "result.json").read_text())
    settings = data["meta"]["settings"]
    assert (settings["shape_alpha"], settings["cca_eps"], settings["svcca_keep"], settings["ridge_lambda"],
            settings["ridge_folds"], settings["rsa_distance"], settings["rsa_compare"]) == (
        0.25, 0.01, 0.9, 0.1, 4, "euclidean", "kendall_tau_a")
    assert {m: d["path"] for m, d in data["meta"]["method"].items()}["ridge_r2"] == "stored-folds"
    html = (out / "report.html").read_text()
    assert html.count('data-metric="') == len(ALL_MEASURES.split(","))
    assert "ridge_r2 is directional" in html and "not symmetric" in html


# 512 stored samples of these MLPs' 72 features take 147 KB: more than a 120K budget, which holds ridge_r2's
# fold sums (100 KB) and the covariance sums of cca and procrustes
@pytest.mark.parametrize("budget, ridge_path", [([], "stored-folds"), (["--memory-budget", "120K"], "folds")])
def test_new_measures_stream_without_a_null(tmp_path, budget, ridge_path):
    out = tmp_path / "streamed"
    result = invoke("compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "512", "--batch-size", "64",
                    "--metric", "cca,procrustes,ridge_r2", "--null", "0", "--no-report", "--out", str(out), *budget)
    assert result.exit_code == 0, result.output
    method = json.loads((out / "result.json").read_text())["meta"]["method"]
    assert [method[m]["path"] for m in ("cca", "procrustes", "ridge_r2")] == ["features", "features", ridge_path]


@pytest.mark.parametrize("args, message", [
    (["--metric", "shape_metric", "--shape-alpha", "1.5"], "--shape-alpha must be a number in [0, 1]"),
    (["--metric", "cca", "--cca-eps", "-1"], "--cca-eps must be a number >= 0"),
    (["--metric", "svcca", "--svcca-keep", "0"], "--svcca-keep must be a number in (0, 1], got 0.0"),
    (["--metric", "ridge_r2", "--ridge-folds", "1"], "--ridge-folds must be an integer >= 2"),
    (["--metric", "ridge_r2", "--ridge-lambda", "-2"], "--ridge-lambda must be a number >= 0"),
    (["--metric", "ridge_r2", "--ridge-folds", "20"], "--ridge-folds=20 needs at least 40 samples"),
    (["--metric", "rsa", "--rsa-compare", "kendall"], "kendall"),
], ids=["alpha", "eps", "keep", "folds", "lambda", "few-for-folds", "compare"])
def test_bad_measure_settings_exit_2_naming_the_flag(tmp_path, args, message):
    result = invoke("compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "32", "--out", str(tmp_path / "run"), *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "result.json").exists()


def test_help_documents_the_measure_settings_and_their_defaults():
    result = invoke("compare", "--help")
    assert result.exit_code == 0
    text = " ".join(result.output.replace("│", " ").split())
    for flag in ("--shape-alpha", "--cca-eps", "--svcca-keep", "--ridge-lambda", "--ridge-folds", "--rsa-distance",
                 "--rsa-compare"):
        assert flag in text
    for default in ("[default: 0.5]", "[default: 0.0]", "[default: 0.99]", "[default: 0.01]", "[default: 5]",
                    "[default: correlation]", "[default: spearman]"):
        assert default in text


def test_new_measures_from_caches_and_in_a_study(tmp_path):
    common = ["--data", "mnist1d", "--n", "48", "--batch-size", "16"]
    for name, spec, seed in (("a", MLP_A, "0"), ("b", MLP_B, "1"), ("c", MLP_A, "2")):
        done = invoke("capture", spec, *common, "--seed", seed, "--out", str(tmp_path / name))
        assert done.exit_code == 0, done.output
    metrics = ["--metric", "cca,shape_metric,ridge_r2,rsa", "--ridge-folds", "3", "--batch-size", "16", "--no-report"]
    pair = invoke("compare", str(tmp_path / "a"), str(tmp_path / "b"), *metrics, "--out", str(tmp_path / "pair"))
    assert pair.exit_code == 0, pair.output
    many = invoke("compare", *(str(tmp_path / k) for k in "abc"), *metrics, "--out", str(tmp_path / "study"))
    assert many.exit_code == 0, many.output
    study = pd.read_csv(tmp_path / "study" / "study.csv")
    ridge = study[study["metric"] == "ridge_r2"].pivot(index="model_a", columns="model_b", values="value")
    assert np.allclose(np.diag(ridge.to_numpy()), 1.0, atol=0.05)        # a model predicts itself
    assert not np.allclose(ridge.to_numpy(), ridge.to_numpy().T)          # directional
    assert json.loads((tmp_path / "study" / "result.json").read_text())["meta"]["settings"]["ridge_folds"] == 3


@pytest.mark.parametrize("command", ["compare", "capture", "layers", "report", "convert", "stitch", "linearize",
                                     "graft", "napl"])
def test_help_shows_no_type_beside_on_off_flags_and_no_python_type_beside_lists(command):
    result = invoke(command, "--help")
    assert result.exit_code == 0
    assert "<bool>" not in result.output and "BOOLEAN" not in result.output
    options = result.output.split("─ Options ─")[-1]  # a variadic argument (MODELS...) shows typer's own type
    assert "list[" not in options


def test_help_shows_the_defaults_and_choices_that_change_results():
    compare_help = " ".join(invoke("compare", "--help").output.replace("│", " ").split())
    assert "[default: unbiased_cka,linear_cka]" in compare_help.replace("linear_ cka", "linear_cka")
    assert "[default: each measure's default]" in compare_help and "[default: auto]" in compare_help  # as typed
    capture_help = invoke("capture", "--help", env={"COLUMNS": "200"}).output
    assert "auto, flatten, mean, cls or last" in capture_help and "[default: auto]" in capture_help
    bad = invoke("capture", MLP_A, "--data", "mnist1d", "--reduce", "max", "--out", "/tmp/never-written")
    assert bad.exit_code == 2 and bad.output.strip().splitlines() == [
        "error: unknown reduction 'max'; choose one of auto, flatten, mean, cls, last"]


def test_compare_defaults_lead_with_unbiased_cka_and_a_null(tmp_path):
    out = tmp_path / "run"
    result = invoke("compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "128", "--out", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads((out / "result.json").read_text())
    assert data["summary"]["metrics"] == ["unbiased_cka", "linear_cka"] and data["meta"]["settings"]["null"] == {"unbiased_cka": 10, "linear_cka": 10}
    assert data["meta"]["method"]["unbiased_cka"]["hsic"] == "unbiased HSIC_1"
    assert data["meta"]["method"]["linear_cka"]["hsic"] == "biased HSIC"
    html = (out / "report.html").read_text(encoding="utf-8")
    findings = html[html.index('id="findings"'):html.index("</section>", html.index('id="findings"'))]
    assert findings.count("<p>") >= 2 and "unbiased_cka between " + MLP_A + " (random init, seed 0)" in findings
    assert f"{MLP_B} (random init, seed 1)" in findings
    assert data["summary"]["weights_a"] == "random init, seed 0" and data["summary"]["weights_b"] == "random init, seed 1"
    assert "linear_cka in minibatch mode averages biased HSIC over batches of 64 samples" in html
    for metric in ("unbiased_cka", "linear_cka"):  # one sentence per measure against its chance level
        assert f"{metric}: " in findings and "above its 95th percentile of a 10-permutation null" in findings
    assert "pairs beat chance" in findings and "against a chance level of" in findings


def test_cca_refusal_is_one_line_naming_the_flags(tmp_path):
    out = tmp_path / "wide"
    result = invoke("compare", "simkit:mlp:in_features=40,hidden=64,depth=1", MLP_B, "--data", "mnist1d", "--n",
                    "32", "--metric", "cca", "--out", str(out))
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and "--cca-eps" in line and "--reduce" in line and "64 features" in line
    assert not out.exists()
