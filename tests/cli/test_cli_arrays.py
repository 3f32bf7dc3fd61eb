"""`simkit compare FILE FILE`, studies of files and `simkit capture --from FILE` from the command line: a
thingsvision-style directory of per-layer .npy files and an HDF5 file end to end with a report, a
three-source study, IDs from files and CSV columns, and models loaded in another dtype (`--dtype`)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from tests.helpers import invoke

pytestmark = pytest.mark.usefixtures("one_thread")

N = 80
FILES = [f"images/img_{i:03d}.jpg" for i in range(N)]


@pytest.fixture(scope="module")
def stimuli(tmp_path_factory):
    """The same 80 stimuli seen by three "models": a thingsvision-style folder (one .npy per layer plus
    file_names.txt), an HDF5 file with the rows in another order and its IDs, and an .npz."""
    import h5py

    folder = tmp_path_factory.mktemp("stimuli")
    rng = np.random.default_rng(0)
    base = rng.normal(size=(N, 12)).astype(np.float32)
    things = folder / "thingsvision"
    things.mkdir()
    np.save(things / "features.conv1.npy", rng.normal(size=(N, 4, 3, 3)).astype(np.float32))
    np.save(things / "features.fc2.npy", np.tanh(base @ rng.normal(size=(12, 6)).astype(np.float32)))
    (things / "file_names.txt").write_text("\n".join(FILES) + "\n")
    order = rng.permutation(N)
    with h5py.File(folder / "brain.h5", "w") as handle:
        handle.create_dataset("ids", data=np.array(FILES, dtype="S")[order])
        handle.create_dataset("areas/IT", data=(base @ rng.normal(size=(12, 9)).astype(np.float32))[order])
        handle.create_dataset("areas/V4", data=rng.normal(size=(N, 5)).astype(np.float32)[order])
    np.savez(folder / "other.npz", last=(base[:, :8] * 3).astype(np.float32), ids=np.array(FILES))
    return {"things": things, "h5": folder / "brain.h5", "npz": folder / "other.npz", "base": base, "order": order}


def test_a_thingsvision_folder_against_an_hdf5_file_with_a_report(stimuli, tmp_path):
    out = tmp_path / "run"
    result = invoke("compare", stimuli["things"], stimuli["h5"], "--out", out, "--mode", "exact",
                    "--metric", "linear_cka,cca", "--null", "20")
    assert result.exit_code == 0, result.output
    assert "finding:" in result.stdout
    summary = json.loads((out / "result.json").read_text())["summary"]
    assert summary["samples"] == {"aligned_by": "ids", "matched": N, "rows_a": N, "rows_b": N, "dropped_a": 0,
                                  "dropped_b": 0}
    assert summary["model_b"] == str(stimuli["h5"]) and "hdf5" in summary["weights_b"]
    layers = pd.read_csv(out / "layers.csv")
    assert list(layers["name"]) == ["features.conv1", "features.fc2", "areas.IT", "areas.V4"]
    assert list(layers["shape"]) == ["4x3x3", "6", "9", "5"]
    similarity = pd.read_csv(out / "similarity.csv")
    it = similarity[(similarity.layer_a == "features.fc2") & (similarity.layer_b == "areas.IT")]
    assert (it["value"] > it["chance"]).all()  # matched by ID: the shared signal shows
    html = (out / "report.html").read_text()
    assert "Samples matched by ID: 80 present on every side" in html


def test_without_ids_the_report_says_aligned_by_position(stimuli, tmp_path):
    np.save(tmp_path / "a.npy", stimuli["base"])
    np.save(tmp_path / "b.npy", stimuli["base"] ** 2)
    out = tmp_path / "run"
    result = invoke("compare", tmp_path / "a.npy", tmp_path / "b.npy", "--out", out, "--metric", "linear_cka")
    assert result.exit_code == 0, result.output
    assert "aligned by position" in (out / "report.html").read_text()
    assert json.loads((out / "result.json").read_text())["summary"]["samples"]["aligned_by"] == "position"


def test_a_study_of_three_sources(stimuli, tmp_path):
    out = tmp_path / "study"
    result = invoke("compare", stimuli["things"], stimuli["h5"], stimuli["npz"], "--out", out, "--mode", "exact",
                    "--metric", "linear_cka", "--pairing", "features.fc2=areas.IT=last")
    assert result.exit_code == 0, result.output
    models = pd.read_csv(out / "models.csv")
    assert list(models["layer"]) == ["features.fc2", "areas.IT", "last"]
    summary = json.loads((out / "result.json").read_text())["summary"]
    assert summary["samples"]["aligned_by"] == "ids" and summary["samples"]["matched"] == N
    assert "Samples matched by ID" in (out / "report.html").read_text()


def test_capture_from_a_file_then_compare_the_cache(stimuli, tmp_path):
    result = invoke("capture", "--from", stimuli["h5"], "--out", tmp_path / "cache", "--layers", "areas.*")
    assert result.exit_code == 0, result.output
    assert "stored 80 samples × 2 layers" in result.stdout
    via_cache = invoke("compare", tmp_path / "cache", stimuli["things"], "--out", tmp_path / "a", "--mode", "exact",
                       "--metric", "linear_cka", "--no-report")
    via_file = invoke("compare", stimuli["h5"], stimuli["things"], "--out", tmp_path / "b", "--mode", "exact",
                      "--metric", "linear_cka", "--no-report", "--layers-a", "areas.*")
    assert via_cache.exit_code == 0 and via_file.exit_code == 0, via_cache.output + via_file.output
    np.testing.assert_allclose(pd.read_csv(tmp_path / "a" / "similarity.csv")["value"],
                               pd.read_csv(tmp_path / "b" / "similarity.csv")["value"], rtol=0, atol=1e-10)


def test_ids_from_csv_columns(stimuli, tmp_path):
    base, order = stimuli["base"], stimuli["order"]
    np.save(tmp_path / "a.npy", base)
    np.save(tmp_path / "b.npy", base[order])
    pd.DataFrame({"n": range(N), "stimulus": FILES}).to_csv(tmp_path / "a.csv", index=False)
    pd.DataFrame({"stimulus": np.array(FILES)[order]}).to_csv(tmp_path / "b.csv", index=False)
    out = tmp_path / "run"
    result = invoke("compare", tmp_path / "a.npy", tmp_path / "b.npy", "--out", out, "--mode", "exact",
                    "--metric", "linear_cka", "--ids-a", tmp_path / "a.csv", "--ids-b", tmp_path / "b.csv",
                    "--ids-column", "stimulus", "--no-report")
    assert result.exit_code == 0, result.output
    assert pd.read_csv(out / "similarity.csv")["value"].iloc[0] == pytest.approx(1.0)
    unmatched = invoke("compare", tmp_path / "a.npy", tmp_path / "b.npy", "--out", tmp_path / "run2", "--mode",
                       "exact", "--metric", "linear_cka", "--no-report")
    assert unmatched.exit_code == 0
    assert pd.read_csv(tmp_path / "run2" / "similarity.csv")["value"].iloc[0] < 0.5  # by position: shuffled


# ------------------------------------------------------------------------------------------ --dtype

MLP = "simkit:mlp:in_features=64,hidden=32,depth=3,num_classes=10"
#: how far a CKA value of a model loaded in bfloat16 may lie from float32 (stated in the README)
BFLOAT16_TOLERANCE = 0.01


def test_bfloat16_stays_within_the_stated_tolerance(tmp_path):
    runs = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        result = invoke("compare", MLP, MLP, "--data", "digits", "--n", "300", "--mode", "exact", "--metric",
                        "linear_cka,unbiased_cka", "--dtype", dtype, "--out", out)
        assert result.exit_code == 0, result.output
        runs[dtype] = pd.read_csv(out / "similarity.csv")["value"].to_numpy()
        summary = json.loads((out / "result.json").read_text())["summary"]
        assert summary["dtype"] == dtype
        assert f"The models ran in {dtype}" in (out / "report.html").read_text()
    difference = np.abs(runs["bfloat16"] - runs["float32"]).max()
    assert 0 < difference < BFLOAT16_TOLERANCE  # it did run in bfloat16, and stayed close


def test_dtype_is_a_keyword_of_load_model():
    from simkit.models import load_model

    model = load_model(MLP, dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and model.simkit_dtype == "bfloat16"
    assert not hasattr(load_model(MLP), "simkit_dtype")
    result = invoke("compare", MLP, MLP, "--data", "digits", "--dtype", "float64", "--out", "x")
    assert result.exit_code == 2 and "float64" in result.output


OVERFLOWING = '''
import torch
from torch import nn


class Loud(nn.Module):
    """Activations of about 1e6: fine in float32 and bfloat16, inf in float16."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(64, 8)
        self.loud = nn.Linear(8, 8)
        with torch.no_grad():
            self.loud.weight.fill_(1e5)

    def forward(self, x):
        return self.loud(self.first(x.flatten(1)))


def build():
    return Loud()
'''


def test_float16_overflow_names_the_layer(tmp_path, monkeypatch):
    (tmp_path / "loud_model.py").write_text(OVERFLOWING)
    monkeypatch.chdir(tmp_path)
    spec = "python:loud_model:build"
    result = invoke("compare", spec, spec, "--data", "digits", "--n", "64", "--dtype", "float16", "--out", "run")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1, result.output
    assert "layer 'loud'" in result.output and "--dtype bfloat16 or float32" in result.output
    assert not (tmp_path / "run").exists()
    ok = invoke("compare", spec, spec, "--data", "digits", "--n", "64", "--dtype", "bfloat16", "--out", "run",
                "--no-report")
    assert ok.exit_code == 0, ok.output
