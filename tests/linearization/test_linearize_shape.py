"""Linearization compared by shape (issue #39): the shape reset before recovery (every α exactly 0 or 1),
recovery's best validation epoch, NAPL counting only |1 − α| above a threshold, and mean |1 − α| beside
every matched point."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from simkit.data import Dataset
from simkit.errors import SimkitError
from simkit.linearization import LinearizeSettings, linearize, matched_napl, matched_over_seeds, path_lengths
from simkit.linearization.prelu import swap_relus
from simkit.linearization.recover import recover, recover_best, reset_shape
from simkit.linearization.slope import SlopeReLU, slope_modules
from simkit.training import evaluate_accuracy
from simkit.training.state import load_checkpoint
from tests.helpers import invoke


def net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv1d(1, 3, 3, padding=1), nn.BatchNorm1d(3), nn.ReLU(), nn.Conv1d(3, 3, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(24, 4)).eval()


def toy(n: int = 80) -> Dataset:
    gen = torch.Generator().manual_seed(0)
    return Dataset(torch.randn(n, 1, 8, generator=gen), torch.randint(0, 4, (n,), generator=gen), "toy")


def _with_slopes(alphas: list[float], frozen: list[bool]) -> SlopeReLU:
    module = SlopeReLU(len(alphas))
    with torch.no_grad():
        module.alpha.copy_(torch.tensor(alphas))
        module.frozen.copy_(torch.tensor(frozen))
    return module


slope_values = st.one_of(st.just(1.0), st.just(0.0), st.floats(-2.0, 3.0, allow_nan=False))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(slope_values, st.booleans()), min_size=1, max_size=12))
def test_a_shape_reset_unit_has_alpha_exactly_0_or_1(units):
    alphas, frozen = [a for a, _ in units], [f for _, f in units]
    model = nn.Sequential(_with_slopes(alphas, frozen))
    linear = [f or a == 1.0 for a, f in units]           # as the forward reads it
    reset = reset_shape(model)
    module = model[0]
    effective = module.effective_alpha()
    assert set(effective.tolist()) <= {0.0, 1.0} and set(module.alpha.tolist()) <= {0.0, 1.0}
    assert effective.tolist() == [1.0 if lin else 0.0 for lin in linear]
    assert module.frozen.tolist() == linear and reset == linear.count(False)
    x = torch.randn(5, len(units), 4)
    expected = torch.where(torch.tensor(linear).view(1, -1, 1), x, torch.relu(x))
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


def test_recovery_after_a_shape_reset_keeps_every_alpha_at_0_or_1_and_the_best_epoch(tmp_path):
    data = toy()
    s = LinearizeSettings(granularity=["channel"], omega=[0.05], epochs=2, batch_size=16, slope_lr=0.5, cka=False,
                          recover=3, recover_shape=True, recover_val_fraction=0.25)
    result = linearize(net(), data, s, run_dir=tmp_path / "run", progress=False)
    runs = result.tables["runs"]
    assert list(runs.columns[-6:]) == ["accuracy_recovered", "final_loss_recovered", "steps_recovered",
                                       "accuracy_shape_reset", "recover_best_step", "recover_val_accuracy"]
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "linearize_channel_w0.05_recover.pt")["model"]
    for key in (k for k in state if k.endswith(".alpha")):
        alpha = torch.where(state[key.replace("alpha", "frozen")], torch.ones_like(state[key]), state[key])
        assert set(alpha.tolist()) <= {0.0, 1.0}
    row = runs.iloc[0]
    train = data.train_test(seed=0)[0]
    per_epoch = -(-(len(train) - round(0.25 * len(train))) // 16)
    assert row.recover_best_step % per_epoch == 0 or row.recover_best_step == row.steps_recovered
    assert 0 <= row.recover_val_accuracy <= 1 and 0 <= row.accuracy_shape_reset <= 1
    assert result.meta["settings"]["recover_shape"] is True


def test_recover_best_keeps_the_best_validation_epoch_over_the_last():
    data = toy(120)
    x, y = data.inputs, data.labels
    model, _ = swap_relus(net(), "channel", x[:2])
    with torch.no_grad():
        for _, m in slope_modules(model):
            m.alpha.fill_(0.3)
    twin = copy.deepcopy(model)
    validation = (x[:30], y[:30])
    kept = recover_best(model, x[30:], y[30:], validation, epochs=6, lr=0.05, batch_size=16)
    recover(twin, x[30:], y[30:], epochs=6, lr=0.05, batch_size=16)     # the same run, last epoch kept
    assert evaluate_accuracy(model, *validation) == kept.val_accuracy
    assert kept.val_accuracy >= evaluate_accuracy(twin, *validation)
    assert kept.history.steps == 6 * 6 and kept.best_step in {6, 12, 18, 24, 30, 36}
    assert all(torch.equal(a.alpha, b.alpha) for (_, a), (_, b) in zip(slope_modules(model), slope_modules(twin),
                                                                       strict=True))


def _plain_net_with(alphas: list[torch.Tensor]) -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 3), _slopes(alphas[0]), nn.Linear(3, 3), _slopes(alphas[1]), nn.Linear(3, 2))
    return model.eval()


def _slopes(alpha: torch.Tensor) -> SlopeReLU:
    return _with_slopes(alpha.tolist(), [False] * len(alpha))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1.0, 2.0), min_size=6, max_size=6), st.floats(0.0, 1.0))
def test_napl_with_a_threshold_counts_only_units_far_from_linear(values, threshold):
    alphas = [torch.tensor(values[:3]), torch.tensor(values[3:])]
    model = _plain_net_with(alphas)
    expected = sum(float(np.mean(np.abs(1 - a.double().numpy()) > threshold)) if threshold > 0
                   else float(np.mean(a.numpy() != 1)) for a in alphas)   # a plain net: NAPL = Σ p_l
    assert path_lengths(model, torch.randn(2, 4), threshold=threshold).napl == pytest.approx(expected)
    assert path_lengths(model, torch.randn(2, 4), threshold=threshold).napl <= path_lengths(model).napl + 1e-12


def test_the_threshold_is_recorded_and_lowers_napl_of_the_same_runs(tmp_path):
    base = dict(granularity=["channel"], omega=[0.05], epochs=2, batch_size=16, slope_lr=0.5, cka=False)
    plain = linearize(net(), toy(), LinearizeSettings(**base), progress=False)
    loose = linearize(net(), toy(), LinearizeSettings(**base, napl_threshold=5.0), progress=False)
    assert loose.meta["napl_threshold"] == 5.0 and loose.meta["settings"]["napl_threshold"] == 5.0
    assert plain.tables["runs"]["mean_alpha"].equals(loose.tables["runs"]["mean_alpha"])    # the same training
    layers = loose.tables["layers"]
    # post-training leaves some α ≠ 1, none as far as 5 from it: counted with the threshold, none is nonlinear
    assert plain.tables["runs"]["napl"].iloc[0] > 0 and loose.tables["runs"]["napl"].iloc[0] == 0
    # a plain net's NAPL is the sum of its sites' nonlinear fractions, each counted with the threshold
    assert loose.tables["runs"]["napl"].iloc[0] == pytest.approx(layers["nonlinear_fraction"].sum())
    result = invoke("linearize", "simkit:cnn2d:channels=4,layers=2", "--data", "digits", "--n", "60", "--omega",
                    "0.05", "--granularity", "layer", "--epochs", "1", "--no-cka", "--napl-threshold", "0.25",
                    "--out", tmp_path / "cli", "--no-report")
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "cli" / "result.json").read_text())
    assert saved["meta"]["napl_threshold"] == 0.25


def test_recovery_options_need_recovery():
    with pytest.raises(SimkitError, match="`recover_shape` and `recover_val_fraction` shape the recovery"):
        LinearizeSettings(recover_shape=True).validate()
    with pytest.raises(SimkitError, match="`recover_val_fraction` must be a number in"):
        LinearizeSettings(recover=1, recover_val_fraction=1.0).validate()
    with pytest.raises(SimkitError, match="`napl_threshold` must be a number >= 0"):
        LinearizeSettings(napl_threshold=-0.1).validate()


def test_every_matched_point_carries_mean_abs_one_minus_alpha():
    runs = pd.DataFrame([(0, "channel", 0.01, 2.0, 0.9, 0.30), (0, "channel", 0.02, 2.0, 0.8, 0.10),
                         (0, "channel", 0.1, 0.0, 0.5, 0.00), (0, "layer", 0.1, 2.0, 0.7, 0.40),
                         (0, "layer", 0.5, 1.0, 0.6, 0.25), (1, "channel", 0.01, 3.0, 0.9, 0.5),
                         (1, "channel", 0.1, 1.0, 0.7, 0.1), (1, "layer", 0.2, 1.0, 0.6, 0.35)],
                        columns=["seed", "granularity", "omega", "napl", "accuracy", "mean_abs_one_minus_alpha"])
    matched = matched_napl(runs).set_index(["seed", "napl"])
    assert matched.loc[(0, 2.0), "channel_mean_abs_one_minus_alpha"] == pytest.approx(0.30)   # weakest ω 0.01
    assert matched.loc[(0, 2.0), "layer_mean_abs_one_minus_alpha"] == pytest.approx(0.40)
    # NAPL 1 in seed 0 interpolates the channel points at 0 (0.0) and 2 (0.30): 0.15, like the accuracy
    assert matched.loc[(0, 1.0), "channel_mean_abs_one_minus_alpha"] == pytest.approx(0.15)
    assert matched.loc[(0, 1.0), "channel_accuracy"] == pytest.approx(0.7)
    assert matched.loc[(1, 1.0), "channel_mean_abs_one_minus_alpha"] == pytest.approx(0.1)
    over = matched_over_seeds(matched.reset_index()).set_index("napl")
    assert over.loc[1.0, "layer_mean_abs_one_minus_alpha_mean"] == pytest.approx((0.25 + 0.35) / 2)
    assert over.loc[1.0, "channel_mean_abs_one_minus_alpha_mean"] == pytest.approx((0.15 + 0.1) / 2)
    bare = matched_napl(runs.drop(columns="mean_abs_one_minus_alpha"))
    assert bare["channel_mean_abs_one_minus_alpha"].isna().all()
