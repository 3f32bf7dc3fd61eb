"""A user's own measure (``simkit.register_measure``, the entry-point group ``simkit.measures``) runs
through every path: compare in both modes with its chance level and interval, a cache, the study, the
report and the CLI. The plug-in is a throwaway package installed with pip (``--no-deps
--no-build-isolation --target``, about 1.5 s) into a temporary folder put on ``sys.path``; its measure is
the RV coefficient, which is biased linear CKA, so every value has a built-in twin to equal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import simkit
from simkit.catalog import MEASURES, METRICS, load_entry_points, unregister_measure
from simkit.errors import SimkitError
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming import make_accumulator
from tests.helpers import ROOT

PLUGIN = "toy_rv"
SOURCE = '''
import simkit


def rv_coefficient(x, y):
    """Biased linear CKA (the RV coefficient) of two float64 tensors (n, p), (n, q)."""
    x, y = x - x.mean(0), y - y.mean(0)
    return (x.T @ y).square().sum() / ((x.T @ x).square().sum() * (y.T @ y).square().sum()).sqrt()


def register():
    simkit.register_measure("toy_rv", rv_coefficient, range=(0.0, 1.0),
                            invariances=("rotation", "isotropic_scale", "shift", "permutation"))
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The throwaway package, pip-installed into a folder of its own: that folder."""
    root = tmp_path_factory.mktemp("toy_plugin")
    package = root / "src" / "toy_simkit_measure"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(SOURCE)
    (root / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "toy-simkit-measure"
        version = "0.0.1"
        [project.entry-points."simkit.measures"]
        {PLUGIN} = "toy_simkit_measure:register"
        """))
    target = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(root)], check=True, capture_output=True)
    return target


@pytest.fixture
def plugin(installed, monkeypatch):
    """The plug-in loaded through its entry point, in this process; removed again afterwards."""
    monkeypatch.syspath_prepend(str(installed))
    assert PLUGIN not in METRICS
    try:
        assert PLUGIN in load_entry_points()
        yield MEASURES[PLUGIN]
    finally:
        if PLUGIN in MEASURES:
            unregister_measure(PLUGIN)
        sys.modules.pop("toy_simkit_measure", None)


def nets() -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5))
    b = nn.Sequential(nn.Linear(6, 7), nn.ReLU(), nn.Linear(7, 4))
    return a, b, torch.randn(48, 6)


def frame_of(result, metric):
    frame = result.to_frame()
    return frame[frame["metric"] == metric].reset_index(drop=True)


def test_an_installed_plugin_runs_through_every_path(plugin, tmp_path):
    assert plugin.function is not None and plugin.stored_family == "plugin" and PLUGIN in METRICS
    a, b, x = nets()
    layers = {"layers_a": ["0", "2"], "layers_b": ["0", "2"], "progress": False}
    exact = simkit.compare(a, b, x, metrics=[PLUGIN, "linear_cka"], mode="exact", batch_size=16, **layers)
    toy, twin = frame_of(exact, PLUGIN), frame_of(exact, "linear_cka")
    np.testing.assert_allclose(toy["value"], twin["value"], atol=1e-12)      # the RV coefficient is linear CKA
    assert toy["chance"].notna().all() and exact.meta["method"][PLUGIN]["path"] == "stored-plugin"
    assert exact.meta["settings"]["null"][PLUGIN] == 5                      # sampled: permutations of B
    minibatch = simkit.compare(a, b, x, metrics=[PLUGIN], mode="minibatch", ci=0.9, ci_resamples=10, **layers)
    got = frame_of(minibatch, PLUGIN)
    np.testing.assert_allclose(got["value"], toy["value"], atol=1e-12)      # full data in either mode
    assert (got["ci_low"] <= got["value"]).all() and (got["value"] <= got["ci_high"]).all()
    caches = [simkit.capture(net, x, tmp_path / name, layers=["0", "2"], batch_size=16, progress=False,
                             data_name="rand") for name, net in (("a", a), ("b", b), ("c", a))]
    cached = simkit.compare_caches(caches[0], caches[1], metrics=[PLUGIN], mode="exact", progress=False,
                                   layers_a=["0", "2"], layers_b=["0", "2"])
    np.testing.assert_allclose(frame_of(cached, PLUGIN)["value"], toy["value"], atol=1e-12)
    study = simkit.study(caches, metrics=[PLUGIN], mode="exact", progress=False)
    assert study.matrix(PLUGIN).shape == (3, 3)
    simkit.save_run(exact, tmp_path / "run")
    assert PLUGIN in (tmp_path / "run" / "report.html").read_text()


def test_the_cli_loads_the_plugin_on_its_first_read_of_the_catalogue(installed, tmp_path):
    """A fresh process with the package on its path: ``--metric`` accepts it, ``--help`` lists it."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(40, 6))
    np.save(tmp_path / "a.npy", base)
    np.save(tmp_path / "b.npy", np.tanh(base @ rng.normal(size=(6, 3))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), str(ROOT)]), "COLUMNS": "300"}
    cli = [sys.executable, "-m", "simkit.cli.main"]
    shown = subprocess.run([*cli, "compare", "--help"], capture_output=True, text=True, env=env, check=True)
    assert PLUGIN in shown.stdout
    out = tmp_path / "run"
    ran = subprocess.run([*cli, "compare", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--out", str(out),
                          "--metric", f"{PLUGIN},linear_cka", "--mode", "exact"], capture_output=True, text=True,
                         env=env)
    assert ran.returncode == 0, ran.stderr
    table = pd.read_csv(out / "similarity.csv")
    toy, twin = (table[table["metric"] == m].reset_index(drop=True) for m in (PLUGIN, "linear_cka"))
    assert len(toy) == 1 and toy["chance"].notna().all()
    np.testing.assert_allclose(toy["value"], twin["value"], atol=1e-12)
    assert PLUGIN in json.loads((out / "result.json").read_text())["meta"]["settings"]["metrics"]


def run_toy(fn, x=None) -> None:
    """Register ``fn`` as ``bad_toy`` and compute it on a small stored accumulator."""
    simkit.register_measure("bad_toy", fn)
    try:
        x = torch.randn(12, 3) if x is None else x
        acc = make_accumulator(CompareSettings(metrics=["bad_toy"], mode="exact", null=0), [3], [3])
        acc.update([x], [x * 2])
        acc.compute()
    finally:
        unregister_measure("bad_toy")


def test_bad_plugins_are_one_line_errors_naming_the_measure():
    with pytest.raises(SimkitError, match="measure 'linear_cka' is a built-in measure of simkit"):
        simkit.register_measure("linear_cka", lambda x, y: 0.0)
    with pytest.raises(SimkitError, match="measure name 'Bad-Name' is not a lower-case identifier"):
        simkit.register_measure("Bad-Name", lambda x, y: 0.0)
    with pytest.raises(SimkitError, match="measure 'bad_toy': unknown invariances"):
        simkit.register_measure("bad_toy", lambda x, y: 0.0, invariances=("affine",))
    with pytest.raises(SimkitError, match=r"measure 'bad_toy' returned a Tensor of shape \(3,\), not a scalar"):
        run_toy(lambda x, y: x.mean(0))
    with pytest.raises(SimkitError, match="measure 'bad_toy' returned nan"):
        run_toy(lambda x, y: float("nan"))
    with pytest.raises(SimkitError, match="measure 'bad_toy' raised ZeroDivisionError: division by zero; fix") as e:
        run_toy(lambda x, y: 1 / 0)
    assert "\n" not in str(e.value)
    with pytest.raises(SimkitError, match="unknown metric 'bad_toy'"):
        CompareSettings(metrics=["bad_toy"]).validate()                     # removed again


def test_a_broken_entry_point_is_skipped_with_a_warning(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "broken_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "broken_plugin-0.1.dist-info" / "METADATA").write_text("Name: broken-plugin\nVersion: 0.1\n")
    (site / "broken_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[simkit.measures]\nbroken = no_such_module_here:register\n")
    monkeypatch.syspath_prepend(str(site))
    with pytest.warns(RuntimeWarning, match="plug-in measure 'broken' .* was not loaded: No module named"):
        assert "broken" not in load_entry_points()
