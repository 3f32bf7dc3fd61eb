"""``--data-seed`` apart from ``--seed``: changing only the model seed keeps the data (issue #26)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from simkit.data import load_data
from simkit.engine.loading import load_pair
from simkit.errors import SimkitError
from tests.helpers import ROOT, invoke

MLP = "simkit:mlp:in_features=12,hidden=8,depth=2"
DATA = ["--data", "synthetic:12", "--n", "40", "--batch-size", "16"]


def _capture(out, *args: str):
    result = invoke("capture", MLP, *DATA, "--out", str(out), *args)
    assert result.exit_code == 0, result.output
    return json.loads((out / "manifest.json").read_text())


def test_captures_of_several_model_seeds_hold_the_same_samples_and_a_study_takes_them(tmp_path):
    manifests = [_capture(tmp_path / f"s{seed}", "--seed", str(seed)) for seed in range(3)]
    assert len({m["samples_sha256"] for m in manifests}) == 1  # the same data for every model seed
    assert [m["seed"] for m in manifests] == [0, 1, 2] and {m["data_seed"] for m in manifests} == {0}
    out = tmp_path / "study"
    result = invoke("compare", *(str(tmp_path / f"s{seed}") for seed in range(3)), "--metric", "linear_cka",
                    "--out", str(out), "--no-report")
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "result.json").read_text())
    assert saved["kind"] == "study" and saved["summary"]["models"] == ["s0", "s1", "s2"]


def test_another_data_seed_stores_other_samples_and_the_refusal_names_the_flag(tmp_path):
    first = _capture(tmp_path / "a")
    other = _capture(tmp_path / "b", "--data-seed", "1")
    assert first["samples_sha256"] != other["samples_sha256"] and other["data_seed"] == 1
    result = invoke("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "run"))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "(data seeds 0 and 1)" in result.output and "the same --data-seed" in result.output
    assert "model's --seed" in result.output and not (tmp_path / "run").exists()


def test_load_pair_keeps_the_data_when_only_the_model_seed_changes():
    one = load_pair(MLP, MLP, "synthetic:12", seed=0, n=8)
    two = load_pair(MLP, MLP, "synthetic:12", seed=5, n=8)
    assert torch.equal(one.data.inputs, two.data.inputs)
    assert not torch.equal(_first_weight(one.model_a), _first_weight(two.model_a))
    assert one.seeds == {"model_a": 0, "model_b": 1, "data": 0} and two.seeds["data"] == 0
    moved = load_pair(MLP, MLP, "synthetic:12", seed=0, data_seed=3, n=8)
    assert not torch.equal(moved.data.inputs, one.data.inputs) and moved.seeds["data"] == 3
    assert torch.equal(_first_weight(moved.model_a), _first_weight(one.model_a))


def _first_weight(model: torch.nn.Module) -> torch.Tensor:
    return next(model.parameters()).detach()


@pytest.fixture
def labelled(tmp_path):
    """``npy:`` data with labels and no native test split: 50 samples of 12 features, 3 classes."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.standard_normal((50, 12)).astype(np.float32))
    np.save(tmp_path / "y.npy", np.arange(50) % 3)
    return f"npy:{tmp_path / 'x.npy'},labels={tmp_path / 'y.npy'}"


def test_with_test_split_is_the_seeded_split_and_keeps_a_native_one(labelled):
    data = load_data(labelled)
    split = data.with_test_split(4)
    train, test = data.train_test(seed=4)
    assert torch.equal(split.inputs, train.inputs) and split.test is not None
    assert torch.equal(split.test.inputs, test.inputs) and split.test.test is None
    assert not torch.equal(data.with_test_split(5).test.inputs, split.test.inputs)
    native = load_data("digits", n=30)
    assert native.with_test_split(4) is native
    with pytest.raises(SimkitError, match="too few"):
        load_data(labelled, n=2).with_test_split(0)


class Stop(SimkitError):
    """Raised by the stand-in runners once they have seen their data."""


def _seen_split(monkeypatch, command: str, target: str, spec: str, *args: str) -> torch.Tensor:
    """The held-out inputs the runner of ``command`` receives (the runner replaced by a stand-in)."""
    seen: list = []

    def stand_in(*positional, **keywords):
        seen.extend(a for a in positional if hasattr(a, "with_test_split"))
        raise Stop("stopped")

    module, _, name = target.rpartition(".")
    monkeypatch.setattr(f"{module}.{name}", stand_in)
    models = {"stitch": [MLP, MLP, "--layers", "auto"], "linearize": [MLP], "convert": [MLP]}[command]
    result = invoke(command, *models, "--data", spec, "--out", "/tmp/never-written-26", *args)
    assert result.exit_code == 2 and "stopped" in result.output, result.output
    assert seen and seen[0].test is not None
    return seen[0].test.inputs


@pytest.mark.parametrize("command,target", [("stitch", "simkit.stitching.runner.stitch"),
                                            ("linearize", "simkit.linearization.linearize"),
                                            ("convert", "simkit.conversion.convert")])
def test_the_held_out_split_follows_the_data_seed_not_the_model_seed(monkeypatch, labelled, command, target):
    base = _seen_split(monkeypatch, command, target, labelled)
    assert torch.equal(base, _seen_split(monkeypatch, command, target, labelled, "--seed", "4"))
    assert not torch.equal(base, _seen_split(monkeypatch, command, target, labelled, "--data-seed", "4"))
    assert torch.equal(base, load_data(labelled).train_test(seed=0)[1].inputs)  # a single-seed run: as before


def test_the_seed_study_example_runs_and_studies_every_seed(tmp_path):
    root = ROOT
    env = {**os.environ, "SIMKIT": f"{sys.executable} -m simkit.cli.main", "DATA": "synthetic:1x40"}
    done = subprocess.run(["bash", str(root / "examples" / "seed_study.sh"), str(tmp_path / "study"), "3", "48"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads((tmp_path / "study" / "study" / "result.json").read_text())
    assert saved["kind"] == "study" and saved["summary"]["models"] == ["seed0", "seed1", "seed2"]
    manifests = [json.loads((tmp_path / "study" / f"cache-s{s}" / "manifest.json").read_text()) for s in range(3)]
    assert len({m["samples_sha256"] for m in manifests}) == 1 and [m["seed"] for m in manifests] == [0, 1, 2]


def test_compare_records_both_seeds(tmp_path):
    out = tmp_path / "run"
    result = invoke("compare", MLP, MLP, *DATA, "--metric", "linear_cka", "--seed", "3", "--data-seed", "2",
                    "--out", str(out), "--no-report")
    assert result.exit_code == 0, result.output
    seeds = json.loads((out / "result.json").read_text())["meta"]["seeds"]
    assert seeds["model_a"] == 3 and seeds["model_b"] == 4 and seeds["data"] == 2
