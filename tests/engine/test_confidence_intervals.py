"""Confidence intervals (``ci=``, ``--ci``): coverage where the true value is known, agreement of the
paths that compute them, and the CLI."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import simkit
from simkit.cli.main import app
from simkit.errors import SimkitError
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming import make_accumulator

TRUE_CKA = 0.5  # population linear CKA of x ~ N(0, I_p), y = x + e, e ~ N(0, I_p): a² / (a² + σ²)


def _draw(seed: int, n: int, p: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, p, generator=g, dtype=torch.float64)
    return x, x + torch.randn(n, p, generator=g, dtype=torch.float64)


def _interval(seed: int, mode: str, n: int, batch: int, resamples: int) -> tuple[float, float]:
    x, y = _draw(seed, n)
    settings = CompareSettings(metrics=["unbiased_cka"], mode=mode, null=0, ci=0.95, ci_resamples=resamples,
                               seed=seed)
    acc = make_accumulator(settings, [x.shape[1]], [y.shape[1]])
    for start in range(0, n, batch):
        acc.update([x[start:start + batch]], [y[start:start + batch]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = acc.compute()["unbiased_cka"]
    return float(out["ci_low"][0, 0]), float(out["ci_high"][0, 0])


def test_minibatch_interval_covers_the_true_value_at_its_confidence():
    """200 simulations, 20 batches of 64: measured 94.5 % (a percentile interval gave 91.5 %)."""
    hits = [lo <= TRUE_CKA <= hi for lo, hi in (_interval(s, "minibatch", 1280, 64, 200) for s in range(200))]
    assert 0.90 <= np.mean(hits) <= 0.99


def test_exact_interval_covers_the_true_value_near_its_confidence():
    """60 simulations at n = 200: measured 91 % over 100 (duplicated samples make the bootstrap a little
    narrow; README "Intervals")."""
    hits = [lo <= TRUE_CKA <= hi for lo, hi in (_interval(s, "exact", 200, 50, 60) for s in range(60))]
    assert 0.80 <= np.mean(hits) <= 1.0


@pytest.mark.parametrize("mode", ["minibatch", "exact"])
def test_two_halves_merged_give_the_interval_of_one_process(mode):
    """What two ranks do: each sees half the batches (with their global index), then the sums merge."""
    x, y = _draw(3, 256)
    settings = CompareSettings(metrics=["unbiased_cka", "linear_cka"], mode=mode, null=0, ci=0.9, ci_resamples=30)

    def fed(batches):
        acc = make_accumulator(settings, [4], [4])
        for k in batches:
            acc.update([x[32 * k:32 * k + 32]], [y[32 * k:32 * k + 32]], batch_index=k, row_offset=32 * k)
        return acc

    one = fed(range(8)).compute()
    merged = fed([0, 2, 4, 6]).merge(fed([1, 3, 5, 7]))
    if mode == "exact":  # stored samples come back in global batch order, as load_stored does for ranks
        merged.load_stored([merged.stored_payload()])
    two = merged.compute()
    for m in one:
        for column in ("value", "ci_low", "ci_high"):
            np.testing.assert_allclose(two[m][column], one[m][column], rtol=1e-10, atol=1e-12, err_msg=f"{m} {column}")


def test_compare_reports_the_interval_in_both_modes_and_it_holds_the_value():
    torch.manual_seed(0)
    a, b = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5)), nn.Sequential(nn.Linear(6, 7), nn.Tanh())
    x = torch.randn(160, 6)
    for mode in ("minibatch", "exact"):
        frame = simkit.compare(a, b, x, metrics=["unbiased_cka", "procrustes"], mode=mode, ci=0.95,
                               ci_resamples=40, batch_size=32, progress=False).to_frame()
        assert {"ci_low", "ci_high"} <= set(frame.columns)
        finite = frame.dropna(subset=["value"])
        assert ((finite["ci_low"] <= finite["value"]) & (finite["value"] <= finite["ci_high"])).all(), mode
    with pytest.raises(SimkitError, match=r"`ci` must be a number in \(0, 1\) or None, got 95; a confidence level, e.g. 0.95"):
        simkit.compare(a, b, x, ci=95, progress=False)


def test_cli_ci_writes_the_interval_columns_and_records_the_setting(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["compare", "simkit:mlp:in_features=40,hidden=8,depth=2",
                                      "simkit:mlp:in_features=40,hidden=6,depth=1", "--data", "mnist1d", "--n", "128",
                                      "--ci", "0.9", "--ci-resamples", "20", "--out", str(out)])
    assert result.exit_code == 0, result.output
    import pandas as pd

    frame = pd.read_csv(out / "similarity.csv")
    assert frame[["ci_low", "ci_high"]].notna().all().all()
    meta = json.loads((out / "result.json").read_text())["meta"]
    assert meta["settings"]["ci"] == 0.9 and meta["settings"]["ci_resamples"] == 20
    assert "Poisson bootstrap over batches" in meta["method"]["unbiased_cka"]["ci"]
    bad = CliRunner().invoke(app, ["compare", "simkit:mlp", "simkit:mlp", "--data", "mnist1d", "--ci", "2",
                                   "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "--ci must be a number in (0, 1) or None, got 2.0; a confidence level, e.g. 0.95" in bad.output
