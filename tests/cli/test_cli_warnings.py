"""One warning channel for every command (simkit.cli.common.WarningChannel): library warnings reach the
terminal once each, as ``warning: <one line>`` with no file path or source line, name the command's flags
instead of library argument names, and land in the run's ``summary["warnings"]``."""

from __future__ import annotations

import json
import re
import warnings

import pytest
from typer.testing import CliRunner

import simkit.cli.main  # noqa: F401  (registers the commands)
import simkit.engine
from simkit.cli.common import app, cli_message, finish, one_line, warning_channel
from tests.report.test_report import make_compare

MLP_A = "simkit:mlp:in_features=40,hidden=16,depth=3"
MLP_B = "simkit:mlp:in_features=40,hidden=12,depth=2"
CNN = "simkit:cnn2d:channels=4,layers=2"
SOURCE_LINE = re.compile(r"\.py:\d+|Warning:|warnings\.warn")   # what Python's own printing adds


def warning_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("warning: ")]


def test_channel_keeps_each_warning_once_on_one_line_with_flags_and_stores_them(tmp_path, capsys):
    flags = {"batch_size": "--batch-size", "iri_steps": "--iri-steps"}
    result = make_compare(2, 3)
    result.summary["warnings"] = ["IRIs missed: raise `iri_steps`", "a run note"]
    with warning_channel(flags) as channel:
        for _ in range(3):   # raised three times, from two places
            warnings.warn("layer x is constant;\n   lower `batch_size`", RuntimeWarning, stacklevel=1)
        warnings.warn("IRIs missed: raise `iri_steps`", UserWarning, stacklevel=1)  # also in the summary
        finish(result, tmp_path / "run", no_report=True)
        warnings.warn("after saving: `batch_size`", RuntimeWarning, stacklevel=1)
    channel.print()
    err = capsys.readouterr().err
    expected = ["IRIs missed: raise --iri-steps", "a run note", "layer x is constant; lower --batch-size",
                "after saving: --batch-size"]
    assert warning_lines(err) == [f"warning: {line}" for line in expected]
    assert not SOURCE_LINE.search(err)
    stored = json.loads((tmp_path / "run" / "result.json").read_text())["summary"]["warnings"]
    assert stored == expected[:3]   # everything raised before the run was saved
    assert err.index("warning: a run note") < err.index("wrote ")   # its warnings, then where it went


def test_channel_outside_a_command_leaves_the_summary_alone(tmp_path):
    result = make_compare(2, 2)
    finish(result, tmp_path / "run", no_report=True)
    assert "warnings" not in json.loads((tmp_path / "run" / "result.json").read_text())["summary"]


def test_one_line_and_flag_mapping_are_the_errors_own():
    assert one_line("a\n  b \n\n c") == "a b c"
    assert cli_message("raise `slope_lr` or `train`; see `simkit linearize`", {"slope_lr": "--slope-lr",
                                                                               "train": "--train"}) \
        == "raise --slope-lr or --train; see `simkit linearize`"
    assert cli_message("load more samples: raise `n` (--n)", {"n": "--n"}) == "load more samples: raise --n"


def test_compare_prints_a_library_warning_once_with_its_flag_and_stores_it(tmp_path, monkeypatch):
    real = simkit.engine.compare

    def noisy(*args, **kwargs):
        for _ in range(2):
            warnings.warn("the last batch is short: pick another `batch_size`", RuntimeWarning, stacklevel=2)
        return real(*args, **kwargs)

    monkeypatch.setattr(simkit.engine, "compare", noisy)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "48", "--null", "0",
                                      "--metric", "linear_cka", "--out", str(out), "--no-report"])
    assert result.exit_code == 0, result.output
    line = "the last batch is short: pick another --batch-size"
    assert warning_lines(result.stderr) == [f"warning: {line}"]
    assert not SOURCE_LINE.search(result.output)
    assert json.loads((out / "result.json").read_text())["summary"]["warnings"] == [line]


def test_a_failing_command_prints_only_its_error_line(tmp_path, monkeypatch):
    from simkit.errors import SimkitError

    def failing(*args, **kwargs):
        warnings.warn("something odd", RuntimeWarning, stacklevel=2)
        raise SimkitError("`batch_size` is too large")

    monkeypatch.setattr(simkit.engine, "compare", failing)
    result = CliRunner().invoke(app, ["compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "48", "--out",
                                      str(tmp_path / "run")])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == ["error: --batch-size is too large"]


@pytest.mark.slow
def test_stitch_names_each_warning_once_with_the_flags(tmp_path, data_spec):
    """The IRI warning is both raised and in the summary: printed once; `iri_steps` → --iri-steps,
    `train` → --train."""
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "stitch", CNN, CNN, "--data", data_spec, "--n", "120", "--steps", "2", "--iri", "--iri-steps", "1",
        "--iri-restarts", "0", "--batch-size", "32", "--layer-a", "blocks.1", "--layer-b", "blocks.1",
        "--objective", "dm", "--out", str(out), "--no-report", "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    lines = warning_lines(result.stderr)
    assert len(lines) == len(set(lines))
    iri = [line for line in lines if "IRIs at A.blocks.1" in line]
    assert len(iri) == 1 and "--iri-steps" in iri[0] and "--iri-restarts" in iri[0] and "`" not in iri[0]
    assert all("`train`" not in line for line in lines)
    assert not SOURCE_LINE.search(result.output)
    summary = json.loads((out / "result.json").read_text())["summary"]
    assert [f"warning: {w}" for w in summary["warnings"]] == lines


@pytest.mark.slow
def test_linearize_sweep_prints_one_line_per_warning_and_no_file_paths(tmp_path):
    """ω far too small for one epoch: every run linearizes nothing, a warning each, with flags."""
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "linearize", CNN, "--data", "digits", "--n", "200", "--epochs", "1", "--omega", "1e-9,2e-9",
        "--granularity", "layer", "--batch-size", "64", "--no-cka", "--out", str(out), "--no-report"])
    assert result.exit_code == 0, result.output
    lines = warning_lines(result.stderr)
    nothing = [line for line in lines if "linearized nothing" in line]
    assert len(nothing) == 2 and len(lines) == len(set(lines))
    assert all("--omega, --epochs or --slope-lr" in line for line in nothing)
    assert not SOURCE_LINE.search(result.output)
    assert "/cli/" not in result.output and "linearize.py" not in result.output
    summary = json.loads((out / "result.json").read_text())["summary"]
    assert [f"warning: {w}" for w in summary["warnings"]] == lines
