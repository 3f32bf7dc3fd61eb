"""Calibration of the corrected tests, shown over repeated draws (issue #36), not assumed.

On independent arrays (every cell a true null): Holm's family-wise rate of "beats chance" anywhere in the
grid stays at most α (a one-sided binomial test at 1 %), while the uncorrected per-cell decision exceeds
it (so the check can fail); the max-corrected p-value of the best pair is uniform (Kolmogorov–Smirnov at a
loose level). With one related pair among nulls, Benjamini–Hochberg keeps the false discovery proportion
at most α on average. On related networks (a model and a slightly perturbed copy) the corrected test still
finds the diagonal.
"""

from __future__ import annotations

import functools
import warnings
import zlib

import numpy as np
import pytest
import torch
from scipy.stats import binomtest, kstest
from torch import nn

import simkit
from simkit.settings.pvalues import ALPHA

pytestmark = pytest.mark.usefixtures("one_thread")
DRAWS = 150


def independent(rng: np.random.Generator, n: int = 60, signal: float = 0.0) -> tuple[dict, dict]:
    """Three layers per side, every pair independent, except A's l0 and B's l0 share ``signal`` of a factor."""
    shared = rng.normal(size=(n, 2))
    a = {f"l{i}": rng.normal(size=(n, 3 + i)) ** (1 + i % 2) for i in range(3)}
    b = {f"l{j}": rng.normal(size=(n, 2 + 2 * j)) for j in range(3)}
    a["l0"][:, :2] += signal * shared
    b["l0"][:, :2] += signal * shared
    return ({k: v.astype(np.float32) for k, v in a.items()}, {k: v.astype(np.float32) for k, v in b.items()})


@functools.cache
def null_runs(metric: str, mode: str, draws: int, correction: str = "holm", signal: float = 0.0) -> list:
    """The similarity tables and p-value records of ``draws`` comparisons of independent arrays."""
    rng = np.random.default_rng(zlib.crc32(repr((metric, mode, correction, signal)).encode()))
    extra = {"null": 19} if mode == "exact" and metric.endswith("cka") else {}  # its cells need no draws
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(draws):
            result = simkit.compare_arrays(*independent(rng, signal=signal), metrics=[metric], mode=mode,
                                           batch_size=20, p_values=True, correction=correction, progress=False,
                                           **extra)
            out.append((result.to_frame(), result.summary["p_values"]["metrics"][metric]))
    return out


def at_most_alpha(hits: int, draws: int) -> bool:
    """The rate ``hits / draws`` is not significantly above ALPHA (one-sided binomial test at 1 %)."""
    return binomtest(hits, draws, ALPHA, alternative="greater").pvalue > 0.01


@pytest.mark.parametrize("metric, mode, draws", [("unbiased_cka", "minibatch", DRAWS), ("linear_cka", "exact", DRAWS),
                                                 ("procrustes", "exact", 100)])
def test_holm_keeps_the_family_wise_rate_at_most_alpha(metric, mode, draws):
    runs = null_runs(metric, mode, draws)
    corrected = sum(bool(frame["beats_chance"].any()) for frame, _ in runs)
    uncorrected = sum(bool((frame["p_value"] <= ALPHA).any()) for frame, _ in runs)
    assert at_most_alpha(corrected, draws), f"{corrected} of {draws} null grids had a corrected rejection"
    assert not at_most_alpha(uncorrected, draws), "the uncorrected per-cell test should exceed alpha on 9 cells"
    assert all(record["cells"] == 9 for _, record in runs)


@pytest.mark.parametrize("metric, mode", [("unbiased_cka", "minibatch"), ("linear_cka", "exact")])
def test_the_max_corrected_p_value_of_the_best_pair_is_uniform_under_the_null(metric, mode):
    runs = null_runs(metric, mode, DRAWS)
    p_max = np.array([record["best"]["p_max"] for _, record in runs])
    assert kstest(p_max, "uniform").pvalue > 0.001, np.sort(p_max)
    assert at_most_alpha(int((p_max <= ALPHA).sum()), DRAWS)


def test_benjamini_hochberg_keeps_the_false_discovery_rate_at_most_alpha():
    """One related pair (A.l0 × B.l0) among eight nulls: the false discoveries over all discoveries average at
    most ALPHA (within 2.6 standard errors), and the related pair is found in most draws."""
    runs = null_runs("unbiased_cka", "minibatch", DRAWS, correction="bh", signal=1.5)
    proportions, found = [], 0
    for frame, _ in runs:
        related = (frame["layer_a"] == "l0") & (frame["layer_b"] == "l0")
        discoveries = frame["beats_chance"].astype(bool)
        proportions.append((discoveries & ~related).sum() / max(1, discoveries.sum()))
        found += bool(discoveries[related].all())
    proportions = np.array(proportions)
    assert proportions.mean() <= ALPHA + 2.6 * proportions.std(ddof=1) / np.sqrt(DRAWS), proportions.mean()
    assert found > 0.8 * DRAWS


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(),
                         nn.Linear(48, 10))


@pytest.mark.parametrize("metric, mode", [("unbiased_cka", "minibatch"), ("linear_cka", "exact"),
                                          ("mutual_knn", "exact")])
def test_on_a_model_and_a_perturbed_copy_the_corrected_test_finds_the_diagonal(metric, mode):
    model, copy = _mlp(0), _mlp(0)
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(0.3 * p.abs().mean() * torch.randn_like(p))
    x = torch.randn(300, 32, generator=torch.Generator().manual_seed(1))
    layers = ["1", "3", "5"]
    result = simkit.compare(model, copy, x, metrics=[metric], mode=mode, p_values=True, knn_k=5, layers_a=layers,
                            layers_b=layers, progress=False)
    beats = result.matrix(metric, "beats_chance").to_numpy(dtype=bool)
    assert beats.diagonal().all(), result.matrix(metric, "p_corrected")
    best = result.summary["p_values"]["metrics"][metric]["best"]
    assert best["layer_a"] == best["layer_b"] and best["beats_max_null"]
