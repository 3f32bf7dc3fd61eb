"""Declared invariances (``simkit.catalog.Measure.invariances``): for every measure × transformation, the
value is unchanged when the catalogue declares the invariance, and changes on some draw when it does not
(as netrep's tests check both ways). Each transformation is applied to one side at a time, X then Y:
``X·Q`` (rotation), ``c·X``, ``X + 1vᵀ``, ``X·W`` (invertible, anisotropic), ``X·P`` (permuted units)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import simkit.metrics
from simkit.catalog import BUILT_IN_METRICS, INVARIANCES, MEASURES

N, P, Q = 40, 5, 4
DRAWS = 4
#: the k-NN measures at a k small enough for n = 40 to leave room to change (the default k = 10 saturates)
KEYWORDS = {name: {"k": 4} for name in ("mutual_knn", "jaccard_knn", "cknna", "cycle_knn")}
#: unchanged: up to rounding (values of order 1); changed: clearly beyond it
SAME, CHANGED = 1e-7, 1e-6


def pair(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Related activations ``(N, P)``, ``(N, Q)`` with unequal column scales and nonzero means."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, P)) * rng.uniform(0.5, 2.0, size=P) + rng.normal(size=P)
    y = np.tanh(x @ rng.normal(size=(P, Q))) + 0.7 * rng.normal(size=(N, Q))
    return x, y


def transform(z: np.ndarray, invariance: str, rng: np.random.Generator) -> np.ndarray:
    """``z (n, d)`` under one of :data:`~simkit.catalog.INVARIANCES`, a random draw of it."""
    d = z.shape[1]
    if invariance == "rotation":
        return z @ np.linalg.qr(rng.normal(size=(d, d)))[0]
    if invariance == "isotropic_scale":
        return z * np.exp(rng.uniform(-2, 2))
    if invariance == "shift":
        return z + 3 * rng.normal(size=d)
    if invariance == "invertible_linear":
        w = rng.normal(size=(d, d)) + 2 * np.eye(d)
        return z @ (w * np.geomspace(0.1, 10, d))              # stretched unequally: not a similarity
    order = rng.permutation(d)
    while d > 1 and np.array_equal(order, np.arange(d)):
        order = rng.permutation(d)
    return z[:, order]


def changes(name: str, invariance: str, seed: int) -> list[float]:
    """``|f(T(X), Y) − f(X, Y)|`` and ``|f(X, T(Y)) − f(X, Y)|`` for one draw."""
    fn = getattr(simkit.metrics, name)
    kwargs = KEYWORDS.get(name, {})
    x, y = pair(seed)
    rng = np.random.default_rng(seed + 1000)
    base = fn(x, y, **kwargs)
    return [abs(fn(transform(x, invariance, rng), y, **kwargs) - base),
            abs(fn(x, transform(y, invariance, rng), **kwargs) - base)]


def test_every_measure_declares_known_invariances_that_imply_each_other():
    for name in BUILT_IN_METRICS:
        declared = set(MEASURES[name].invariances)
        assert declared <= set(INVARIANCES), name
        if "invertible_linear" in declared:     # an invertible map covers rotations and scalings
            assert {"rotation", "isotropic_scale"} <= declared, name
        if "rotation" in declared:              # a permutation of units is a rotation
            assert "permutation" in declared, name


@pytest.mark.parametrize("invariance", INVARIANCES)
@pytest.mark.parametrize("name", BUILT_IN_METRICS)
def test_declared_invariances_hold_and_undeclared_ones_fail_on_some_draw(name, invariance):
    torch.set_num_threads(1)
    if invariance in MEASURES[name].invariances:
        worst = max(max(changes(name, invariance, seed)) for seed in range(DRAWS))
        assert worst <= SAME, f"{name} is declared invariant to {invariance} but moved by {worst:.3g}"
    else:
        largest = max(max(changes(name, invariance, seed)) for seed in range(DRAWS))
        assert largest > CHANGED, f"{name} is not declared invariant to {invariance} yet never moved"
