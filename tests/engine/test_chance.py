"""Chance levels: the closed forms are the exact permutation expectations, and the chance rule tells
unrelated representations from related ones for every measure, end to end through compare."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import simkit
from simkit.catalog import METRICS
from simkit.metrics import cca, linear_cka, unbiased_cka
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming import make_accumulator

DRAWS = 3000


def _pair(n: int = 30):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 5, dtype=torch.float64, generator=g) @ torch.randn(5, 5, dtype=torch.float64, generator=g) + 3
    y = torch.randn(n, 7, dtype=torch.float64, generator=g) ** 2
    return x, y, g


def _feature_chance(metric: str, x: torch.Tensor, y: torch.Tensor) -> float:
    acc = make_accumulator(CompareSettings(metrics=[metric], mode="exact"), [x.shape[1]], [y.shape[1]])
    acc.update([x], [y])
    out = acc.compute()[metric]
    assert acc.describe()[metric]["path"] == "features" and acc.describe()[metric]["null"] == 0
    return float(out["chance"][0, 0])


@pytest.mark.parametrize("metric, function", [("linear_cka", linear_cka), ("unbiased_cka", unbiased_cka),
                                              ("cca", cca)])
def test_closed_form_chance_is_the_mean_over_permutations(metric, function):
    x, y, g = _pair()
    draws = np.array([function(x, y[torch.randperm(len(y), generator=g)]) for _ in range(DRAWS)])
    closed = _feature_chance(metric, x, y)
    assert abs(draws.mean() - closed) < 4 * draws.std() / np.sqrt(DRAWS) + 1e-12, (draws.mean(), closed)


def _mlp(seed: int, width: int = 12) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def _compare(a, b, x, x_b=None):
    return simkit.compare(a, b, x, metrics=list(METRICS), mode="exact", layers_a=["1", "3"], layers_b=["1", "3"],
                          data_b=x_b, knn_k=5, progress=False)


def test_unrelated_representations_do_not_beat_chance_for_any_measure():
    g = torch.Generator().manual_seed(1)
    x, x_b = torch.randn(300, 64, generator=g), torch.randn(300, 64, generator=g)  # B sees other samples
    frame = _compare(_mlp(0), _mlp(1), x, x_b).to_frame()
    assert set(frame["metric"]) == set(METRICS) and frame.loc[frame["value"].notna(), "chance"].notna().all()
    beating = frame.groupby("metric")["beats_chance"].sum()
    assert (beating == 0).all(), beating[beating > 0]


def test_trained_models_on_real_data_beat_chance_for_every_measure():
    from simkit.data import load_data

    data = load_data("digits", n=600, seed=0)
    wrapped = []
    for seed in (0, 1):
        model = nn.Sequential(nn.Flatten(), *_mlp(seed))
        simkit.train_classifier(model, data, simkit.TrainConfig(epochs=15, batch_size=64, lr=3e-3, seed=seed))
        wrapped.append(model.eval())
    x = data.inputs
    frame = simkit.compare(wrapped[0], wrapped[1], x, metrics=list(METRICS), mode="exact", layers_a=["2", "4"],
                           layers_b=["2", "4"], knn_k=5, progress=False).to_frame()
    beating = frame.groupby("metric")["beats_chance"].sum()
    assert (beating >= 1).all(), beating[beating == 0]
