"""Recovery after post-training (``--recover EPOCHS``), the linearized fraction and mean |1 − α| per run,
and the linearize command's warnings (issue #24, linearization half)."""

from __future__ import annotations

import json
import os
import signal

import pandas as pd
import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from simkit.data import Dataset
from simkit.errors import SimkitError
from simkit.linearization import LinearizeSettings, linearize, swap_relus
from simkit.linearization.slope import slope_modules
from simkit.linearization.units import unit_statistics
from simkit.training.state import load_checkpoint
from tests.helpers import invoke

CNN = "simkit:cnn2d:channels=4,layers=2"


def net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv1d(1, 3, 3, padding=1), nn.BatchNorm1d(3), nn.ReLU(), nn.Conv1d(3, 3, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(24, 4)).eval()


def toy(n: int = 80) -> Dataset:
    gen = torch.Generator().manual_seed(0)
    return Dataset(torch.randn(n, 1, 8, generator=gen), torch.randint(0, 4, (n,), generator=gen), "toy")


def alphas(state: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if k.endswith(".alpha") or k.endswith(".frozen")}


def test_recover_through_the_cli_reports_accuracy_after_and_keeps_every_slope(tmp_path):
    out = tmp_path / "run"
    args = ["linearize", CNN, "--data", "digits", "--n", "200", "--train", "1", "--epochs", "1", "--omega", "1e-2,1",
            "--granularity", "channel,layer", "--batch-size", "64", "--slope-lr", "0.5", "--no-cka", "--recover", "1",
            "--out", out]
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs.columns[:5]) == ["granularity", "omega", "napl", "nonlinear_fraction", "accuracy"]
    assert runs["accuracy_recovered"].between(0, 1).all() and (runs["steps_recovered"] > 0).all()
    result = json.loads((out / "result.json").read_text())
    assert result["meta"]["settings"]["recover"] == 1.0
    assert all("accuracy_recovered" in r for r in result["summary"]["runs"])
    aggregate = pd.read_csv(out / "aggregate.csv")
    assert {"accuracy_recovered_mean", "recovery_gain_mean", "recovery_gain_low", "linearized_fraction_mean",
            "mean_abs_one_minus_alpha_mean"} <= set(aggregate.columns)
    checkpoints = out / "checkpoints"
    for stage in ("linearize_channel_w0.01", "linearize_channel_w1", "linearize_layer_w0.01", "linearize_layer_w1"):
        before = load_checkpoint(checkpoints / f"{stage}.pt")["model"]
        after = load_checkpoint(checkpoints / f"{stage}_recover.pt")["model"]
        slopes = alphas(before)
        assert slopes and slopes.keys() == alphas(after).keys()
        for key, value in slopes.items():          # the slope pattern is untouched by recovery, bit for bit
            assert torch.equal(value, after[key]), key
        assert any(not torch.equal(before[k], after[k]) for k in before if k not in slopes)   # the weights moved
    html = (out / "report.html").read_text()
    assert "recovered accuracy" in html and "recovery gain" in html
    again = invoke(*args, "--resume", "--no-report")
    assert again.exit_code == 0, again.output
    pd.testing.assert_frame_equal(pd.read_csv(out / "runs.csv").drop(columns="time_s"), runs.drop(columns="time_s"))


def test_recover_zero_is_todays_run_and_recovery_leaves_the_before_values():
    data = toy()
    base = LinearizeSettings(omega=[0.05, 5.0], epochs=2, batch_size=20, slope_lr=0.5, cka=False)
    plain = linearize(net(), data, base, progress=False)
    assert base.recover == 0 and not {"accuracy_recovered", "steps_recovered"} & set(plain.tables["runs"].columns)
    assert "recovery_gain_mean" not in plain.tables["aggregate"].columns
    recovered = linearize(net(), data, LinearizeSettings(**{**base.to_dict(), "recover": 2.0}), progress=False)
    cols = ["napl", "nonlinear_fraction", "accuracy", "linearized_fraction", "mean_abs_one_minus_alpha", "final_loss"]
    pd.testing.assert_frame_equal(recovered.tables["runs"][cols], plain.tables["runs"][cols])
    assert recovered.tables["runs"]["accuracy_recovered"].notna().all()


def test_an_interrupted_recovery_resumes_bit_identically(tmp_path):
    data = toy()
    s = LinearizeSettings(granularity=["channel"], omega=[0.05], epochs=2, batch_size=20, slope_lr=0.5, cka=False,
                          recover=2.0)
    whole = linearize(net(), data, s, run_dir=tmp_path / "whole", progress=False)
    steps = {"n": 0}

    def interrupt(optimizer, args, kwargs):   # recovery's optimizer is the one with a single param group
        if len(optimizer.param_groups) == 1:
            steps["n"] += 1
            if steps["n"] == 3:
                os.kill(os.getpid(), signal.SIGINT)   # the loop checkpoints this step, then interrupts

    handle = register_optimizer_step_post_hook(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            linearize(net(), data, s, run_dir=tmp_path / "cut", progress=False)
    finally:
        handle.remove()
    assert load_checkpoint(tmp_path / "cut" / "checkpoints" / "linearize_channel_w0.05_recover.pt")["step"] == 3
    resumed = linearize(net(), data, s, run_dir=tmp_path / "cut", resume=True, progress=False)
    cols = ["napl", "accuracy", "accuracy_recovered", "final_loss_recovered", "steps_recovered"]
    pd.testing.assert_frame_equal(resumed.tables["runs"][cols], whole.tables["runs"][cols])


def test_recover_must_be_a_number_at_least_zero(tmp_path):
    with pytest.raises(SimkitError, match="`recover` must be a number >= 0, got -1"):
        LinearizeSettings(recover=-1).validate()
    result = invoke("linearize", CNN, "--data", "digits", "--n", "40", "--recover", "-1", "--out", tmp_path / "x")
    assert result.exit_code == 2
    assert result.output.strip() == "error: --recover must be a number >= 0, got -1.0"


def test_linearized_fraction_and_mean_abs_one_minus_alpha_against_a_direct_count():
    model = nn.Sequential(nn.Conv1d(1, 2, 3, padding=1), nn.ReLU(), nn.Conv1d(2, 4, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(32, 3)).eval()
    example = torch.randn(2, 1, 8)
    channel, sites = swap_relus(model, "channel", example)
    units = {site.name: site.channels for site in sites}
    assert sorted(units.values()) == [2, 4]
    first, second = (m for _, m in slope_modules(channel))
    with torch.no_grad():
        first.alpha.copy_(torch.tensor([1.0, 0.25]))       # one linear unit, one at 0.25
        second.alpha.copy_(torch.tensor([0.5, -0.5, 0.0, 0.9]))
        second.frozen[2] = True                            # frozen: α reads 1 whatever is stored
    stats = unit_statistics(list(slope_modules(channel)), units)
    assert stats["linearized_fraction"] == pytest.approx(2 / 6)
    assert stats["mean_abs_one_minus_alpha"] == pytest.approx((0 + 0.75 + 0.5 + 1.5 + 0 + 0.1) / 6)
    # layer-wise: one slope covers all the site's channels, so it counts once per channel
    layer, _ = swap_relus(model, "layer", example)
    a, b = (m for _, m in slope_modules(layer))
    with torch.no_grad():
        a.alpha.fill_(1.0)
        b.alpha.fill_(0.3)
    stats = unit_statistics(list(slope_modules(layer)), units)
    assert stats["linearized_fraction"] == pytest.approx(2 / 6)
    assert stats["mean_abs_one_minus_alpha"] == pytest.approx(4 * 0.7 / 6)


def test_runs_report_the_linearized_fraction_and_mean_abs_one_minus_alpha():
    s = LinearizeSettings(omega=[0.05, 5.0], epochs=2, batch_size=20, slope_lr=0.5, seeds=2, cka=False)
    result = linearize(net, toy(), s, progress=False)
    runs = result.tables["runs"]
    # units here are the 3 + 3 channels of the two sites: the fraction linearized is 1 − the fraction nonlinear
    assert (runs["linearized_fraction"] + runs["nonlinear_fraction"]).to_numpy() == pytest.approx(1.0)
    assert runs["mean_abs_one_minus_alpha"].between(0, 1).all()
    aggregate = result.tables["aggregate"].set_index("run")
    for label, group in runs.groupby(runs["run"].str.replace(r" seed=\d+", "", regex=True)):
        for name in ("linearized_fraction", "mean_abs_one_minus_alpha"):
            assert aggregate.loc[label, f"{name}_mean"] == pytest.approx(group[name].mean())
            assert aggregate.loc[label, f"{name}_std"] == pytest.approx(group[name].std(ddof=1), nan_ok=True)
    fraction = result.tables["matched_fraction_mean"]
    assert {"linearized_fraction", "difference_low", "difference_high", "verdict"} <= set(fraction.columns)


def test_linearize_warnings_reach_the_terminal_once_each_as_one_line(tmp_path):
    # a slope learning rate this small moves no α to 1: every run linearizes nothing and is warned about
    result = invoke("linearize", CNN, "--data", "digits", "--n", "120", "--epochs", "1", "--omega", "0,1",
                    "--granularity", "layer", "--batch-size", "64", "--slope-lr", "1e-4", "--no-cka", "--no-report",
                    "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "linearized nothing" in line]
    assert lines == [f"warning: run layer ω={w} linearized nothing: no slope reached α = 1, so NAPL stays at the "
                     "original 2; raise --omega, --epochs or --slope-lr" for w in ("0", "1")]
    assert "RuntimeWarning" not in result.output and "linearize.py:" not in result.output
    # the run through the command line stores what the terminal shows: CLI flags, not library names
    assert not [line for line in result.output.splitlines() if line.strip().startswith("warnings.warn")]
    summary = json.loads((tmp_path / "run" / "result.json").read_text())["summary"]
    assert summary["warnings"] == [f"run layer ω={w} linearized nothing: no slope reached α = 1, so NAPL stays at "
                                   "the original 2; raise --omega, --epochs or --slope-lr" for w in ("0", "1")]
