"""Model names on the command line (`--name-a`, `--name-b`, `--names`), the usage line and the defaults in
`--help`. (`--n` beyond the data and `npy:` errors: tests/data/test_data_limits_and_npy_errors.py.)"""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import invoke

MLP_A = "simkit:mlp:in_features=12,hidden=8,depth=2"
MLP_B = "simkit:mlp:in_features=12,hidden=6,depth=2"
DATA = ["--data", "synthetic:12", "--n", "32", "--batch-size", "16", "--metric", "linear_cka"]
COMMANDS = ["compare", "capture", "layers", "report", "convert", "stitch", "linearize", "graft", "napl"]


def invoke_wide(*args: str):
    """``invoke`` on a terminal 200 columns wide (help text wraps by the width)."""
    return invoke(*args, env={"COLUMNS": "200"})


# --------------------------------------------------------------------------------------------- names

def test_name_a_and_name_b_replace_the_specs_in_summary_and_report(tmp_path):
    out = tmp_path / "run"
    result = invoke_wide("compare", MLP_A, MLP_B, *DATA, "--name-a", "wide", "--name-b", "narrow", "--out", str(out))
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "result.json").read_text())
    assert saved["summary"]["model_a"] == "wide" and saved["summary"]["model_b"] == "narrow"
    assert saved["meta"]["specs"] == {"model_a": MLP_A, "model_b": MLP_B}  # the specs stay on record
    html = (out / "report.html").read_text()
    assert "wide" in html and "narrow" in html


def test_one_name_keeps_the_other_spec(tmp_path):
    out = tmp_path / "run"
    result = invoke_wide("compare", MLP_A, MLP_B, *DATA, "--name-b", "narrow", "--out", str(out), "--no-report")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "result.json").read_text())["summary"]
    assert summary["model_a"] == MLP_A and summary["model_b"] == "narrow"


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("caches")
    paths = []
    for seed in range(3):
        path = root / f"cache{seed}"
        done = invoke_wide("capture", MLP_A, "--data", "synthetic:12", "--n", "32", "--seed", str(seed), "--out", str(path))
        assert done.exit_code == 0, done.output
        paths.append(str(path))
    return paths


def test_two_caches_take_names_and_a_study_takes_a_names_list(caches, tmp_path):
    pair = tmp_path / "pair"
    result = invoke_wide("compare", *caches[:2], "--metric", "linear_cka", "--name-a", "s0", "--out", str(pair),
                    "--no-report")
    assert result.exit_code == 0, result.output
    saved = json.loads((pair / "result.json").read_text())
    assert saved["summary"]["model_a"] == "s0" and saved["summary"]["model_b"] == MLP_A
    study = tmp_path / "study"
    result = invoke_wide("compare", *caches, "--metric", "linear_cka", "--names", "r0,r1", "--names", "r2",
                    "--out", str(study), "--no-report")
    assert result.exit_code == 0, result.output
    saved = json.loads((study / "result.json").read_text())
    assert saved["summary"]["models"] == ["r0", "r1", "r2"]
    models = (study / "models.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in models[1:]] == ["r0", "r1", "r2"]  # the specs stay beside them
    assert all(MLP_A in line for line in models[1:])


@pytest.mark.parametrize("args,words", [
    (["--names", "a,b"], "`names` gives 2 names (a, b) for 3 models"),
    (["--names", "a,a,b"], "give one distinct, non-empty name per model"),
    (["--name-a", "x"], "name the caches of a study with --names"),
])
def test_bad_study_names_are_one_line(caches, tmp_path, args, words):
    out = tmp_path / "run"
    result = invoke_wide("compare", *caches, *args, "--out", str(out))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert words.replace("`names`", "--names") in result.output and not out.exists()


def test_names_on_a_pair_is_one_line(tmp_path):
    result = invoke_wide("compare", MLP_A, MLP_B, *DATA, "--names", "a,b", "--out", str(tmp_path / "run"))
    assert result.exit_code == 2 and "name the two models of a comparison with --name-a and --name-b" in result.output


# ------------------------------------------------------------------------------------------- help

@pytest.mark.parametrize("command,usage", [
    ("compare", "simkit compare [OPTIONS] MODELS..."), ("stitch", "simkit stitch [OPTIONS] MODEL_A MODEL_B"),
    ("graft", "simkit graft [OPTIONS] [MODEL]"), ("capture", "simkit capture [OPTIONS] [MODEL]"),  # MODEL or --from FILE
])
def test_usage_line_names_arguments_as_typed(command, usage):
    result = invoke_wide(command, "--help")
    assert result.exit_code == 0 and f"Usage: {usage}" in result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_no_braces_and_no_tuple_defaults(command):
    result = invoke_wide(command, "--help")
    usage = next(line for line in result.output.splitlines() if "Usage:" in line)
    assert "{" not in usage
    assert not re.search(r"\[default: \(", " ".join(result.output.replace("│", " ").split()))


def test_list_defaults_print_as_the_user_types_them():
    compare_help = " ".join(invoke_wide("compare", "--help").output.replace("│", " ").split())
    assert "[default: unbiased_cka,linear_cka]" in compare_help and "[default: each measure's default]" in compare_help
    linearize_help = " ".join(invoke_wide("linearize", "--help").output.replace("│", " ").split())
    assert "[default: channel,layer]" in linearize_help and "[default: 0.0001,0.001,0.01,0.1]" in linearize_help
    assert "--data-seed" in compare_help and "--name-a" in compare_help and "--names" in compare_help
