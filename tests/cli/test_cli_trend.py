"""`simkit trend` over a folder of checkpoints: the report, figures and tables; the references; a run killed
in the middle resumes to the same result; bad inputs are one line with exit code 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.helpers import invoke

pytestmark = pytest.mark.usefixtures("one_thread")

ARCH = "simkit:cnn1d:channels=8"
STEPS = (0, 5, 10, 15, 20, 25, 30)
LAUNCHER = '''
import os, sys, time
import simkit.monitor.series as series

delay = float(os.environ.get("SIMKIT_TEST_TREND_DELAY", "0"))
measure = series.measure_step
series.measure_step = lambda *args, **kwargs: (time.sleep(delay), measure(*args, **kwargs))[1]
from simkit.cli.main import main

sys.argv = ["simkit", *sys.argv[1:]]
main()
'''


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    """State dicts of a small CNN saved every 5 of 30 training steps (step_0000.pt ... step_0030.pt)."""
    from simkit.data import load_data
    from simkit.models import load_model

    folder = tmp_path_factory.mktemp("ckpt")
    model, data = load_model(ARCH, seed=0).train(), load_data("mnist1d", n=256)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for step in range(STEPS[-1] + 1):
        if step in STEPS:
            torch.save(model.state_dict(), folder / f"step_{step:04d}.pt")
        index = torch.randint(0, len(data), (32,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(data.inputs[index]), data.labels[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    (folder / "notes.txt").write_text("not a checkpoint")
    return folder


def args(checkpoints: Path, *extra: object) -> list[object]:
    return ["trend", checkpoints, "--arch", ARCH, "--data", "mnist1d", "--n", "128", *extra]


def test_trend_writes_the_report_figures_and_tables(checkpoints, tmp_path):
    out = tmp_path / "run"
    result = invoke(*args(checkpoints, "--metric", "unbiased_cka,linear_cka", "--out", out))
    assert result.exit_code == 0, result.output
    steps = pd.read_csv(out / "steps.csv")
    assert sorted(set(steps["step"])) == list(STEPS)
    assert np.allclose(steps.loc[steps["step"] == STEPS[-1], "value"], 1.0)      # reference final: itself
    assert {"chance", "null_p95", "beats_chance"} <= set(steps.columns)
    convergence = pd.read_csv(out / "convergence.csv")
    assert len(convergence) == 2 * 3 and convergence["stable_step"].between(0, STEPS[-1]).all()
    summary = json.loads((out / "result.json").read_text())["summary"]
    assert summary["reference"] == "final" and summary["steps"] == len(STEPS)
    assert set(summary["stable_steps"]) == {"blocks.0", "blocks.1", "blocks.2"}
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "Layers converge" in html and "unbiased_cka over training" in html
    names = sorted(p.name for p in (out / "figures").iterdir())
    assert "unbiased_cka-over-training.png" in names and "stable-step-by-depth.svg" in names


def test_trend_against_the_first_checkpoint_and_a_model_spec(checkpoints, tmp_path):
    first = invoke(*args(checkpoints, "--reference", "first", "--no-report", "--out", tmp_path / "first"))
    assert first.exit_code == 0, first.output
    steps = pd.read_csv(tmp_path / "first" / "steps.csv")
    assert np.allclose(steps.loc[steps["step"] == 0, "value"], 1.0)
    spec = invoke(*args(checkpoints, "--reference", "simkit:cnn1d:channels=16", "--pairs", "all", "--no-report",
                        "--out", tmp_path / "spec"))
    assert spec.exit_code == 0, spec.output
    steps = pd.read_csv(tmp_path / "spec" / "steps.csv")
    assert len(steps) == len(STEPS) * 3 * 3 and (steps["value"] < 0.999).all()


@pytest.mark.parametrize(("extra", "message"), [
    (["--reference", "simkit:nope"], "unknown zoo model 'nope'"),
    (["--n", "2"], "--n must be an integer >= 4, got 2"),
    (["--metric", "ridge_r2"], "unknown metric 'ridge_r2'"),
])
def test_bad_inputs_are_one_line_exit_2(checkpoints, tmp_path, extra, message):
    result = invoke(*args(checkpoints, *extra, "--out", tmp_path / "run"))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_a_folder_without_checkpoints_is_one_line_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    result = invoke("trend", tmp_path / "empty", "--arch", ARCH, "--out", tmp_path / "run")
    assert result.exit_code == 2 and "no checkpoint file in" in result.output


def launch(launcher: Path, argv: list[object], delay: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "SIMKIT_TEST_TREND_DELAY": delay}
    return subprocess.Popen([sys.executable, str(launcher), *map(str, argv)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def measured(out: Path) -> list[Path]:
    folder = out / "checkpoints"
    return sorted(folder.glob("trend-step-*.pt")) if folder.is_dir() else []


def outcome(out: Path) -> dict[str, object]:
    summary = json.loads((out / "result.json").read_text())["summary"]
    return {"summary": summary, **{name: (out / name).read_text() for name in ("steps.csv", "convergence.csv")}}


def test_a_killed_trend_resumes_to_the_same_result(checkpoints, tmp_path):
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    whole, out = tmp_path / "whole", tmp_path / "killed"
    done = launch(launcher, args(checkpoints, "--no-report", "--out", whole), "0")
    assert done.wait(timeout=600) == 0, done.stderr.read()
    proc = launch(launcher, args(checkpoints, "--no-report", "--out", out), "0.4")
    deadline = time.monotonic() + 600
    while len(measured(out)) < 3:
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not (out / "result.json").exists()
    kept = {p.name: p.stat().st_mtime_ns for p in measured(out)}
    assert 3 <= len(kept) < len(STEPS) and (out / "checkpoints" / "trend-reference.pt").is_file()

    refused = invoke(*args(checkpoints, "--n", "64", "--no-report", "--resume", "--out", out))
    assert refused.exit_code == 2 and "n: 128 → 64" in refused.output

    resumed = invoke(*args(checkpoints, "--no-report", "--resume", "--out", out))
    assert resumed.exit_code == 0, resumed.output
    assert {p.name: p.stat().st_mtime_ns for p in measured(out) if p.name in kept} == kept   # read back, not redone
    assert outcome(out) == outcome(whole)
