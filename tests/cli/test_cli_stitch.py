"""`simkit stitch` end to end through typer's CliRunner: files, contract columns and keys, resume, errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from simkit.cli.main import app

MODEL = "simkit:cnn2d:channels=4,layers=2"


@pytest.fixture(scope="module")
def common(data_spec):
    return ["--data", data_spec, "--n", "120", "--steps", "4", "--iri-steps", "15", "--batch-size", "32"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, common):
    out = tmp_path_factory.mktemp("stitch")
    result = CliRunner().invoke(app, [
        "stitch", MODEL, MODEL, *common, "--layer-a", "blocks.0,blocks.1", "--layer-b", "blocks.0,blocks.1",
        "--objective", "hlm,fula", "--iri", "--seed", "1", "--out", str(out / "run"),
        "--cache-dir", str(out / "cache")])
    assert result.exit_code == 0, result.output
    return out


def test_cli_writes_the_contract(run_dir):
    run = run_dir / "run"
    table = pd.read_csv(run / "stitching.csv")
    assert list(table.columns) == ["layer_a", "layer_b", "objective", "setting", "stitched_accuracy",
                                   "b_accuracy", "penalty", "seed", "a_accuracy", "penalty_min", "chosen_step"]
    assert set(table.seed) == {1} and (table.chosen_step == 4).all()  # no validation: all --steps
    assert len(table) == 2 * 2 * 2 and set(table.setting) == {"standard", "iri"}
    data = json.loads((run / "result.json").read_text())
    assert data["kind"] == "stitch"
    summary = data["summary"]
    for key in ("a_accuracy", "b_accuracy", "iri_relative_error_median", "mean_penalty_hlm_standard",
                "mean_penalty_hlm_iri", "mean_penalty_fula_standard", "mean_penalty_fula_iri"):
        assert key in summary and summary[key] is not None, key
    html = (run / "report.html").read_text()
    assert "Stitching penalty, iri stitching" in html and "IRI relative error" in html
    assert "http://" not in html and "https://" not in html
    assert len(list((run_dir / "cache").glob("iri-*.safetensors"))) == 2  # one per layer of A


def test_cli_resume_reuses_checkpoints_and_iri_cache(run_dir, common):
    run = run_dir / "run"
    before = pd.read_csv(run / "stitching.csv")
    result = CliRunner().invoke(app, [
        "stitch", MODEL, MODEL, *common, "--layer-a", "blocks.0,blocks.1", "--layer-b", "blocks.0,blocks.1",
        "--objective", "hlm,fula", "--iri", "--seed", "1", "--out", str(run), "--resume", "--no-report",
        "--cache-dir", str(run_dir / "cache")])
    assert result.exit_code == 0, result.output
    pd.testing.assert_frame_equal(pd.read_csv(run / "stitching.csv"), before)
    meta = json.loads((run / "result.json").read_text())["meta"]
    assert {c["cache"] for c in meta["iri_cache"].values()} == {"hit"}


@pytest.mark.parametrize(("args", "message"), [
    (["--layer-a", "blocks.9", "--layer-b", "blocks.0"], "unknown layer of model A 'blocks.9'"),
    (["--layer-a", "blocks.0", "--layer-b", "flatten"], "no stitch bridges A's map2d activations"),
    (["--layer-a", "blocks.0", "--layer-b", "blocks.0", "--objective", "hlm,xent"], "unknown objective 'xent'"),
    (["--layers", "deep"], "'--layers': 'deep' is not one of 'auto'"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, common, args, message):
    result = CliRunner().invoke(app, ["stitch", MODEL, MODEL, *common, *args, "--out", str(tmp_path / "r"),
                                      "--no-report", "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "r" / "result.json").exists()


def test_cli_layers_auto(tmp_path, common):
    result = CliRunner().invoke(app, ["stitch", MODEL, MODEL, *common, "--layers", "auto", "--steps", "0",
                                      "--objective", "dm", "--out", str(tmp_path / "r"), "--no-report"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "r" / "stitching.csv")
    assert list(zip(table.layer_a, table.layer_b, strict=True)) == [("blocks.0", "blocks.0"),
                                                                    ("blocks.1", "blocks.1")]


@pytest.fixture(scope="module")
def eval_spec(tmp_path_factory):
    """A separate labelled evaluation set of 40 images (same rule as ``data_spec``)."""
    folder = tmp_path_factory.mktemp("eval")
    rng = np.random.default_rng(7)
    x = rng.random((40, 1, 8, 8)).astype(np.float32)
    y = (x[:, 0, :4].sum((1, 2)) > x[:, 0, 4:].sum((1, 2))).astype(np.int64)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    return f"npy:{folder / 'x.npy'},labels={folder / 'y.npy'}", torch.from_numpy(y)


def test_cli_test_data_train_and_warnings(tmp_path, common, eval_spec):
    from simkit.stitching.checks import at_chance

    eval_spec, labels = eval_spec
    args = ["stitch", MODEL, MODEL, *common, "--layer-a", "blocks.1", "--layer-b", "blocks.1", "--objective", "dm",
            "--test-data", eval_spec, "--no-report"]
    untrained = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "u")])
    trained = CliRunner().invoke(app, [*args, "--train", "40", "--out", str(tmp_path / "t")])
    for result, out in ((untrained, "u"), (trained, "t")):
        assert result.exit_code == 0, result.output
        data = json.loads((tmp_path / out / "result.json").read_text())
        summary, meta = data["summary"], data["meta"]
        assert meta["test_data"] == eval_spec and meta["n_test"] == 40 and meta["n_train"] == 120
        assert summary["iri_converged_fraction"] is None and summary["chance_accuracy"] is not None
        for name, key in (("model A", "a_accuracy"), ("model B", "b_accuracy")):
            said = f"warning: {name} is at chance" in result.output
            assert said == at_chance(summary[key], labels) == any(name in w for w in summary["warnings"])
    inputs = json.loads((tmp_path / "t" / "inputs.json").read_text())
    assert inputs["options"]["test_data"] == eval_spec and inputs["options"]["train"] == 40.0
    assert (tmp_path / "t" / "checkpoints" / "train_a.pt").is_file()
    before = json.loads((tmp_path / "u" / "result.json").read_text())["summary"]["a_accuracy"]
    after = json.loads((tmp_path / "t" / "result.json").read_text())["summary"]["a_accuracy"]
    assert after > before


def test_cli_test_data_of_another_shape_exits_2(tmp_path, common):
    result = CliRunner().invoke(app, ["stitch", MODEL, MODEL, *common, "--layer-a", "blocks.1", "--layer-b",
                                      "blocks.1", "--test-data", "mnist1d", "--out", str(tmp_path / "r"),
                                      "--no-report"])
    assert result.exit_code == 2, result.output
    assert "--test-data samples have shape (1, 40)" in result.output
    assert not (tmp_path / "r" / "result.json").exists()


def test_cli_weights_load_a_and_b_for_every_seed_and_are_recorded(tmp_path, monkeypatch, common):
    import hashlib

    from simkit.errors import SimkitError
    from simkit.models import load_model, save_model

    saved = {}
    for side, shift in (("a", 0.25), ("b", -0.25)):
        model = load_model(MODEL, seed=7)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(shift)  # weights no seed initialises
        saved[side] = (model.eval(), save_model(model, tmp_path / side, MODEL))
    seen = {}

    def stop(build_a, build_b, data, settings, *, run_dir, **kwargs):
        seen.update(build_a=build_a, build_b=build_b, run_dir=run_dir)
        raise SimkitError("stopped before stitching")

    monkeypatch.setattr("simkit.stitching.runner.stitch", stop)
    result = CliRunner().invoke(app, ["stitch", MODEL, MODEL, *common, "--layer-a", "blocks.0", "--layer-b",
                                      "blocks.0", "--seeds", "2", "--weights-a", str(saved["a"][1]),
                                      "--weights-b", str(saved["b"][1]), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "stopped before stitching" in result.output
    x = torch.rand(5, 1, 8, 8)
    with torch.no_grad():
        for side in ("a", "b"):
            for seed in (0, 1):
                assert torch.equal(seen[f"build_{side}"](seed)(x), saved[side][0](x)), (side, seed)
        assert not torch.equal(seen["build_a"](0)(x), load_model(MODEL, seed=0)(x))  # not the random init
    record = seen["run_dir"].record
    for side in ("a", "b"):
        path = saved[side][1]
        assert record["options"][f"weights_{side}"] == str(path)
        assert record["files"][f"weights_{side}"] == {str(path): hashlib.sha256(path.read_bytes()).hexdigest()}
