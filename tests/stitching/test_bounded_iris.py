"""Bounded IRIs (``iri_radius``): every IRI stays in its ball around its seed, IRIs that miss the tolerance
inside it are reported as not reached, the runner's diagnostics and report say which search ran."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from typer.testing import CliRunner

from simkit.cli.main import app
from simkit.errors import SimkitError
from simkit.report.stitch import context
from simkit.settings.stitch import IRISettings, StitchSettings
from simkit.stitching.halves import FrontHalf
from simkit.stitching.iri import cache_key, generate_iris, project_to_ball
from simkit.stitching.runner import stitch
from tests.stitching.test_stitching import tiny_cnn, tiny_data


def _distances(iris: np.ndarray, seeds: np.ndarray, norm: str) -> np.ndarray:
    """‖iris[i] − seeds[i]‖ per row in float64, from the formulas."""
    diff = (iris.astype(np.float64) - seeds.astype(np.float64)).reshape(len(iris), -1)
    return np.abs(diff).max(axis=1) if norm == "linf" else np.sqrt((diff ** 2).sum(axis=1))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), radius=st.floats(1e-4, 3.0), norm=st.sampled_from(["linf", "l2"]),
       scale=st.floats(1e-3, 100.0), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_projection_never_leaves_the_ball_and_keeps_points_inside(seed, radius, norm, scale, dtype):
    g = torch.Generator().manual_seed(seed)
    centre = torch.rand(5, 2, 7, generator=g, dtype=dtype)
    x = centre + scale * torch.randn(5, 2, 7, generator=g, dtype=dtype)
    out = project_to_ball(x, centre, radius, norm)
    assert out.dtype == dtype
    assert (_distances(out.numpy(), centre.numpy(), norm) <= radius).all()
    inside = _distances(x.numpy(), centre.numpy(), norm) <= radius * 0.5
    torch.testing.assert_close(out[inside], x[inside], rtol=0, atol=0)


@settings(max_examples=8, deadline=None)
@given(radius=st.floats(0.01, 0.4), norm=st.sampled_from(["linf", "l2"]), optimizer=st.sampled_from(["adam", "sgd"]),
       seed=st.integers(0, 1000))
def test_a_bounded_iri_never_leaves_its_ball(radius, norm, optimizer, seed):
    front = FrontHalf(tiny_cnn(0), "1")
    x = tiny_data(24).inputs
    s = IRISettings(steps=12, tol=0.0, optimizer=optimizer, batch_size=8, restarts=1, radius=radius, norm=norm,
                    radius_step=0.5)
    iris, _ = generate_iris(front, x, s, value_range=(0.0, 1.0), seed=seed, progress=False)
    seeds = x[iris.seed_index].numpy()
    assert (iris.seed_index != torch.arange(len(x))).all()
    distance = _distances(iris.iris.numpy(), seeds, norm)
    assert (distance <= radius).all(), distance.max()
    np.testing.assert_allclose(iris.distance.numpy(), distance, rtol=0, atol=0)
    assert iris.iris.min() >= 0.0 and iris.iris.max() <= 1.0
    assert not torch.equal(iris.iris, x[iris.seed_index])  # it moved, inside the ball


def test_iris_that_miss_the_tolerance_inside_the_ball_are_reported_not_reached():
    front = FrontHalf(tiny_cnn(0), "1")
    x = tiny_data(30).inputs
    tight = IRISettings(steps=20, tol=0.05, batch_size=10, restarts=0, radius=0.01)
    iris, _ = generate_iris(front, x, tight, value_range=(0.0, 1.0), progress=False)
    reached = iris.rel_error <= 0.05
    assert not bool(reached.all())  # a ball of 0.01 around another input cannot match most of them
    assert torch.equal(iris.reached, reached)
    summary = iris.summary()
    assert summary["reached_fraction"] == pytest.approx(float(reached.double().mean()))
    assert summary["reached_inside_radius_fraction"] == pytest.approx(float(reached.double().mean()))
    assert summary["radius"] == 0.01 and iris.search == "linf ≤ 0.01"
    assert summary["distance_median"] == pytest.approx(float(np.median(iris.distance.numpy())))
    assert (iris.distance <= 0.01).all()
    wide = IRISettings(steps=200, tol=0.05, batch_size=10, restarts=0, radius=1.0)
    wide_iris, _ = generate_iris(front, x, wide, value_range=(0.0, 1.0), progress=False)
    assert float(wide_iris.reached.double().mean()) > float(reached.double().mean())


def test_unbounded_search_keeps_its_cache_key_and_a_ball_changes_it():
    s = IRISettings()
    legacy = {k: v for k, v in asdict(s).items() if k not in ("radius", "norm", "radius_step")}
    blob = json.dumps({"model": "m", "layer": "l", "data": "d", "seed": 0, "algorithm": 2, "range": [0.0, 1.0],
                       "settings": legacy}, sort_keys=True)
    assert cache_key("m", "l", "d", s, 0, (0.0, 1.0)) == hashlib.sha256(blob.encode()).hexdigest()[:32]
    keys = {cache_key("m", "l", "d", IRISettings(radius=r, norm=n), 0, (0.0, 1.0))
            for r in (0.1, 0.2) for n in ("linf", "l2")}
    assert len(keys) == 4 and cache_key("m", "l", "d", s, 0, (0.0, 1.0)) not in keys


def test_a_ball_needs_seeds_from_the_data():
    with pytest.raises(SimkitError, match="`radius` bounds IRIs around the training input"):
        IRISettings(radius=0.1, seed="noise").validate()
    with pytest.raises(SimkitError, match="`iri_radius` bounds IRIs .* use `iri_seed` data"):
        StitchSettings(layer_a="1", layer_b="1", iri_radius=0.1, iri_seed="noise").validate()
    with pytest.raises(SimkitError, match="`iri_radius` must be"):
        StitchSettings(layer_a="1", layer_b="1", iri_radius=0.0).validate()
    with pytest.raises(SimkitError, match="`iri_norm` must be"):
        StitchSettings(layer_a="1", layer_b="1", iri_norm="l1").validate()


def _run(tmp_path, **iri):
    data = tiny_data()
    a, b = tiny_cnn(0), tiny_cnn(1)
    result = stitch(a, b, data, StitchSettings(layer_a="1", layer_b="1", objective="dm", steps=1, batch_size=16,
                                               iri=True, iri_steps=15, iri_restarts=1, **iri),
                    progress=False, cache_dir=tmp_path)
    saved = load_file(str(next(tmp_path.glob("iri-*.safetensors"))))
    return data, b, result, saved


def test_runner_reports_the_ball_and_its_diagnostics_against_a_direct_computation(tmp_path):
    data, b, result, saved = _run(tmp_path, iri_radius=0.15, iri_norm="l2")
    seeds = saved["seed_index"].numpy()
    distance = _distances(saved["iris"].numpy(), data.inputs.numpy()[seeds], "l2")
    assert (distance <= 0.15).all()
    row = result.tables["iris"].iloc[0]
    assert row.radius == 0.15 and row.norm == "l2"
    assert row.distance_median == pytest.approx(float(np.median(distance)))
    assert row.seed_l2_median == pytest.approx(float(np.median(distance)))
    reached = saved["rel_error"].numpy() <= row.tol
    assert row.reached_inside_radius_fraction == pytest.approx(float((reached & (distance <= 0.15)).mean()))
    with torch.no_grad():
        predicted = b(saved["iris"]).argmax(1).numpy()
    labels = data.labels.numpy()
    assert row.b_seed_class_fraction == pytest.approx(float((predicted == labels[seeds]).mean()))
    assert row.b_target_class_fraction == pytest.approx(float((predicted == labels).mean()))
    assert result.meta["iri"]["radius"] == 0.15 and result.meta["iri"]["norm"] == "l2"
    ctx = context(result)
    assert "L2 ball of radius 0.15" in " ".join(ctx["findings"])
    assert ("IRI search", "inside an L2 ball of radius 0.15 around their seeds") in ctx["settings_rows"]


def test_unbounded_runs_are_labelled_and_keep_their_iri_columns(tmp_path):
    _, _, result, _ = _run(tmp_path)
    iris = result.tables["iris"]
    assert not {"radius", "norm", "reached_inside_radius_fraction", "distance_median"} & set(iris.columns)
    ctx = context(result)
    assert "IRIs (unbounded search)" in " ".join(ctx["findings"])
    assert ("IRI search", "unbounded search") in ctx["settings_rows"]


def test_cli_iri_radius_end_to_end(tmp_path, data_spec):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "stitch", "simkit:cnn2d:channels=4,layers=2", "simkit:cnn2d:channels=4,layers=2", "--data", data_spec,
        "--n", "80", "--steps", "2", "--iri-steps", "10", "--batch-size", "32", "--layer-a", "blocks.0",
        "--layer-b", "blocks.0", "--objective", "dm", "--iri", "--iri-radius", "0.1", "--iri-norm", "linf",
        "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--no-report"])
    assert result.exit_code == 0, result.output
    options = json.loads((out / "inputs.json").read_text())["options"]
    assert options["iri_radius"] == 0.1 and options["iri_norm"] == "linf"
    table = pd.read_csv(out / "iris.csv")
    assert (table.radius == 0.1).all() and (table.seed_linf_median <= 0.1).all()
