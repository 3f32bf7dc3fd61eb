"""ridge_r2 (simkit.metrics.predictivity) against a float64 numpy reference: an explicit k-fold loop of
ridge regressions (np.linalg.solve / lstsq), plus its invariances and its direction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simkit.errors import SimkitError
from simkit.metrics import ridge_r2
from tests import reference


def data(n, p, q, seed=0, noise=0.3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, p)) * rng.uniform(0.5, 3, size=p) + rng.normal(size=p) * 4
    y = x @ rng.normal(size=(p, q)) + noise * rng.normal(size=(n, q)) + 2.0
    return x, y


@pytest.mark.parametrize("lam", [0.0, 1e-3, 1e-2, 1.0])
@pytest.mark.parametrize("folds", [2, 3, 5])
@pytest.mark.parametrize("n, p, q", [(40, 5, 3), (23, 1, 1), (31, 2, 6), (12, 20, 3)])
def test_ridge_r2_equals_reference(lam, folds, n, p, q):
    if lam == 0 and p >= n:  # least squares interpolates: compare the minimum-norm solution anyway
        pass
    if n < 2 * folds:
        return
    x, y = data(n, p, q)
    assert ridge_r2(x, y, ridge_lambda=lam, ridge_folds=folds) == pytest.approx(
        reference.ridge_r2(x, y, lam, folds), abs=1e-8)


def test_self_prediction_is_one_without_ridge_and_near_one_with_it():
    x, _ = data(40, 4, 2)
    assert ridge_r2(x, x, ridge_lambda=0.0) == pytest.approx(1.0, abs=1e-10)
    assert 0.99 < ridge_r2(x, x, ridge_lambda=1e-3) < 1.0


def test_ridge_r2_is_directional():
    x, y = data(50, 2, 6, noise=1.0)
    assert abs(ridge_r2(x, y) - ridge_r2(y, x)) > 1e-3


def test_unrelated_data_is_not_better_than_the_mean():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 3)), rng.normal(size=(200, 2))
    assert -0.1 < ridge_r2(x, y) < 0.02


PROPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(seed=st.integers(0, 10_000))
def test_least_squares_is_invariant_to_invertible_maps_of_x(seed):
    """At ridge_lambda = 0 (the default ridge is not: tests/metrics/test_invariances.py)."""
    x, y = data(30, 4, 3, seed=seed, noise=1.0)
    a = np.random.default_rng(seed).normal(size=(4, 4)) + 3 * np.eye(4)
    a[:, 0] *= 30
    assert ridge_r2(x @ a, y, ridge_lambda=0.0) == pytest.approx(ridge_r2(x, y, ridge_lambda=0.0), abs=1e-7)


def test_errors_and_constant_input():
    x, y = data(20, 3, 2)
    with pytest.raises(SimkitError, match="`ridge_folds`=5 needs at least 10 samples"):
        ridge_r2(x[:8], y[:8])
    with pytest.raises(SimkitError, match="`ridge_folds` must be an integer >= 2"):
        ridge_r2(x, y, ridge_folds=1)
    with pytest.raises(SimkitError, match="`ridge_lambda` must be a number >= 0"):
        ridge_r2(x, y, ridge_lambda=-1.0)
    with pytest.warns(RuntimeWarning, match="constant"):
        assert math.isnan(ridge_r2(x, np.ones((20, 2))))
