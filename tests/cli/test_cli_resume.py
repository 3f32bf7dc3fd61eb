"""`--resume` is tied to the inputs that made a run directory (`inputs.json`): every resumable command
(convert, stitch, linearize, graft) resumes with the same inputs and refuses, with one line and exit
code 2, to resume with another input, leaving the run directory as it was. Tiny settings of the
commands' own test files; graft's F3 (a killed worker process, independent of --resume) is stubbed."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer

from simkit.cli.inputs import RESULT_FREE
from simkit.cli.main import app
from tests.helpers import invoke, without_timings

pytestmark = pytest.mark.usefixtures("one_thread")

CNN = "simkit:cnn2d:channels=4,layers=2"
ARGS = {
    "convert": ["convert", CNN, "--data", "digits", "--n", "300", "--rank", "8", "--steps-per-stage", "3",
                "--finetune-epochs", "1", "--batch-size", "64", "--baselines", "none"],
    "stitch": ["stitch", CNN, CNN, "--data", "digits", "--n", "120", "--steps", "4", "--batch-size", "32",
               "--layer-a", "blocks.0", "--layer-b", "blocks.0", "--objective", "fula"],
    "linearize": ["linearize", CNN, "--data", "digits", "--n", "200", "--epochs", "1", "--omega", "1e-2",
                  "--granularity", "layer", "--batch-size", "64", "--no-cka"],
    "graft": ["graft", "simkit:llama:d=16,blocks=2", "--steps", "6", "--n", "16", "--batch-size", "8"],
}
# resuming may spell out defaults and change options that do not change results
SAME = {
    "convert": ["--recipe", "conv-to-mlp", "--metric", "cka", "--schedule", "progressive", "--no-report"],
    "stitch": ["--init", "lstsq", "--device", "cpu", "--trust"],  # and a report this time
    "linearize": ["--lr", "1e-3", "--slope-lr", "1e-2", "--no-report"],
    "graft": ["--gate", "shadow", "--no-report"],
}
# one changed input per command, and the difference the refusal must name
CHANGED = {
    "convert": (["--n", "250"], "n: 300 → 250"),
    "stitch": (["--seed", "2"], "seed: 0 → 2"),
    "linearize": (["--omega", "1e-1"], "omega: [0.01] → [0.01, 0.1]"),  # --omega adds to the list
    "graft": (["--seed", "3"], "seed: 0 → 3"),
}


def snapshot(folder):
    """{relative path: sha256 and mtime} of every file under ``folder``."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def f3_stub(task, s, out, timeout=1800.0):
    return pd.DataFrame({"step": [1], "loss_uninterrupted": [0.0], "loss_killed_resumed": [0.0]}), {
        "f3_resume_bit_identical": True, "f3_without_moments_diverges_at_step": None}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """command → a finished run directory of that command (made lazily, once per module)."""
    made = {}

    def get(name):
        if name not in made:
            out = tmp_path_factory.mktemp(name) / "run"
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr("simkit.grafting.experiments.run_f3", f3_stub)
                result = invoke(*ARGS[name], "--no-report", "--out", out)
            assert result.exit_code == 0, result.output
            made[name] = out
        return made[name]

    return get


@pytest.mark.parametrize("name", list(ARGS))
def test_resume_with_the_same_inputs_continues(runs, name):
    out = runs(name)
    inputs = json.loads((out / "inputs.json").read_text())
    params = {p.name for p in typer.main.get_command(app).commands[name].params}
    assert inputs["command"] == name
    assert params - RESULT_FREE <= set(inputs["options"]), "every option that changes results is recorded"
    assert not RESULT_FREE & set(inputs["options"])
    before = without_timings(json.loads((out / "result.json").read_text())["summary"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("simkit.grafting.experiments.run_f3", f3_stub)
        result = invoke(*ARGS[name], *SAME[name], "--resume", "--out", out)
    assert result.exit_code == 0, result.output
    assert without_timings(json.loads((out / "result.json").read_text())["summary"]) == before
    assert json.loads((out / "inputs.json").read_text()) == inputs


@pytest.mark.parametrize("name", list(ARGS))
def test_resume_with_a_changed_input_exits_2_and_leaves_the_run(runs, name):
    out = runs(name)
    before = snapshot(out)
    change, difference = CHANGED[name]
    result = invoke(*ARGS[name], *change, "--no-report", "--resume", "--out", out)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and difference in lines[0], result.output
    assert "resume with the same inputs or start over in a new --out" in lines[0]
    assert snapshot(out) == before


def test_resume_after_a_data_file_changed_exits_2(tmp_path):
    x = np.random.default_rng(0).random((150, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", (x[:, 0, :4].sum((1, 2)) > x[:, 0, 4:].sum((1, 2))).astype(np.int64))
    args = [*ARGS["stitch"], "--data", f"npy:{tmp_path / 'x.npy'},labels={tmp_path / 'y.npy'}", "--no-report",
            "--out", tmp_path / "run"]
    assert invoke(*args).exit_code == 0
    before = snapshot(tmp_path / "run")
    x[0] += 1  # same spec, same shape, other content
    np.save(tmp_path / "x.npy", x)
    result = invoke(*args, "--resume")
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert f'data file "{tmp_path / "x.npy"}": sha256 ' in result.output and "y.npy" not in result.output
    assert snapshot(tmp_path / "run") == before


def test_resume_without_inputs_json_exits_2(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "result.json").write_text("{}")
    result = invoke(*ARGS["stitch"], "--no-report", "--resume", "--out", tmp_path / "old")
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "has no inputs.json, so it was not made by `simkit stitch` (or was made by an older simkit); " \
           "start over without --resume" in result.output
    result = invoke(*ARGS["stitch"], "--no-report", "--resume", "--out", tmp_path / "missing")
    assert result.exit_code == 2 and "does not exist" in result.output


def interrupted(*args, **kwargs):
    """``stitch`` stand-in: Ctrl-C before the run directory was started."""
    raise KeyboardInterrupt


def started_then_interrupted(*args, run_dir, **kwargs):
    """``stitch`` stand-in: Ctrl-C after the run directory was started, before the first checkpoint."""
    run_dir.start()
    raise KeyboardInterrupt


@pytest.mark.parametrize("name", list(ARGS))
def test_a_fresh_run_that_fails_on_bad_input_leaves_nothing_behind(tmp_path, monkeypatch, name):
    import simkit.io

    written, write_json = [], simkit.io.write_json
    monkeypatch.setattr("simkit.io.write_json", lambda path, obj: written.append(Path(path)) or write_json(path, obj))
    result = invoke(*ARGS[name], "--data", "nosuchdata", "--no-report", "--out", tmp_path / "new" / "run")
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and "unknown data kind 'nosuchdata'" in result.output
    assert tmp_path / "new" / "run" / "inputs.json" not in written  # the data is checked before any write
    assert not list(tmp_path.iterdir()), "no folder is made for a run that fails its checks"


def test_an_interrupted_fresh_run_keeps_its_directory_once_it_holds_more_than_inputs_json(tmp_path, monkeypatch):
    def checkpointed_then_interrupted(*args, run_dir, **kwargs):
        run_dir.start()
        run_dir.checkpoints.mkdir()
        (run_dir.checkpoints / "stitch.pt").write_bytes(b"state")
        raise KeyboardInterrupt

    (tmp_path / "mine").mkdir()
    monkeypatch.setattr("simkit.stitching.runner.stitch", started_then_interrupted)
    for out in (tmp_path / "early", tmp_path / "mine"):
        result = invoke(*ARGS["stitch"], "--no-report", "--out", out)
        assert result.exit_code == 130 and "interrupted" in result.output
    assert not (tmp_path / "early").exists()
    assert (tmp_path / "mine").is_dir(), "a directory this run did not create stays"
    monkeypatch.setattr("simkit.stitching.runner.stitch", checkpointed_then_interrupted)
    assert invoke(*ARGS["stitch"], "--no-report", "--out", tmp_path / "late").exit_code == 130
    assert sorted(snapshot(tmp_path / "late")) == ["checkpoints/stitch.pt", "inputs.json"]


def test_a_fresh_run_in_a_run_directory_starts_over(runs, tmp_path, monkeypatch):
    """Without --resume an earlier run's checkpoints go at once (and nothing else), so a fresh run that
    is interrupted before its first checkpoint resumes under its own inputs, never from the earlier run."""
    out, log = tmp_path / "run", "stitch_blocks.0__blocks.0__fula__standard.log.csv"
    shutil.copytree(runs("stitch"), out)
    before = snapshot(out)
    assert any(name.startswith("checkpoints/") for name in before)
    changed = [*ARGS["stitch"], "--n", "100", "--no-report"]
    with monkeypatch.context() as patch:
        patch.setattr("simkit.stitching.runner.stitch", started_then_interrupted)
        assert invoke(*changed, "--out", out).exit_code == 130
    assert not (out / "checkpoints").exists()
    assert json.loads((out / "inputs.json").read_text())["options"]["n"] == 100
    assert {k: v for k, v in snapshot(out).items() if k != "inputs.json"} == {
        k: v for k, v in before.items() if k != "inputs.json" and not k.startswith("checkpoints/")}
    result = invoke(*changed, "--resume", "--out", out)
    assert result.exit_code == 0, result.output
    assert invoke(*changed, "--out", tmp_path / "fresh").exit_code == 0
    for file in ("training.csv", log):
        assert (out / file).read_text() == (tmp_path / "fresh" / file).read_text(), file
    assert (runs("stitch") / log).read_text() != (out / log).read_text()


@pytest.mark.parametrize("record", [None, ("inputs.json", {"command": "convert"}), ("result.json", {"kind": "compare"})],
                         ids=["no-record", "other-command", "other-result"])
def test_a_fresh_run_refuses_checkpoints_of_unknown_origin(tmp_path, record):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "train.pt").write_bytes(b"someone's state")
    if record:
        (out / record[0]).write_text(json.dumps(record[1]))
    before = snapshot(out)
    result = invoke(*ARGS["stitch"], "--no-report", "--out", out)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "holds checkpoints/ but no inputs.json or result.json of `simkit stitch`" in lines[0]
    assert "choose another --out" in lines[0]
    assert snapshot(out) == before


def test_stitch_cache_default_is_the_library_constant():
    from simkit.stitching.runner import DEFAULT_CACHE

    result = invoke("stitch", "--help")
    assert result.exit_code == 0 and str(DEFAULT_CACHE) in result.output


def test_local_paths_name_every_file_a_spec_reads(tmp_path, monkeypatch):
    from pathlib import Path

    from simkit.data import local_paths as data_paths
    from simkit.models.loading import local_paths as model_paths

    assert model_paths("file:m.safetensors") == [Path("m.safetensors"), Path("m.safetensors.json")]
    assert model_paths("file:sd.pt,arch=hf:tiny") == [Path("sd.pt"), Path("tiny")]
    assert model_paths("hf:tiny") == [Path("tiny")]
    assert model_paths("simkit:cnn1d:channels=4") == model_paths("torchvision:resnet18") == []
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mymodels.py").write_text("")
    assert model_paths("python:mymodels:build") == [Path("mymodels.py")]
    assert model_paths("python:simkit.models.small:MLP") == []   # installed code is not the user's file
    assert data_paths("npy:x.npy,labels=y.npy") == [Path("x.npy"), Path("y.npy")]
    assert data_paths("text:t.txt,tokenizer=hf:tok,max_length=8") == [Path("t.txt"), Path("tok")]
    assert data_paths("text:t.txt,tokenizer=bytes") == [Path("t.txt")]
    assert data_paths("mnist1d") == data_paths("synthetic:3x8x8") == []
