"""RSA (simkit.metrics.rsa) and jaccard_knn (simkit.metrics.knn) against float64 references (tests/reference.py):
scipy's pdist / spearmanr / pearsonr and an explicit O(m²) Kendall τ_a; brute-force neighbour sets."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import pdist

from simkit.errors import SimkitError
from simkit.metrics import jaccard_knn, mutual_knn, rdm, rsa
from simkit.metrics.rsa import check_rsa_n, kendall_tau_a, rsa_bytes, rsa_max_n
from tests import reference


def data(n, p, q, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, p)) + rng.normal(size=p)
    y = np.tanh(x @ rng.normal(size=(p, q))) + 0.5 * rng.normal(size=(n, q))
    return x, y


@pytest.mark.parametrize("distance", ["correlation", "euclidean", "cosine"])
@pytest.mark.parametrize("compare", ["spearman", "pearson", "kendall_tau_a"])
@pytest.mark.parametrize("n, p, q", [(20, 5, 3), (7, 30, 3), (3, 4, 4)])  # q = 2: r = ±1, ties up to rounding
def test_rsa_equals_reference(distance, compare, n, p, q):
    x, y = data(n, p, q)
    assert rsa(x, y, rsa_distance=distance, rsa_compare=compare) == pytest.approx(
        reference.rsa(x, y, distance, compare), abs=1e-8)


def test_rdm_equals_pdist():
    x, _ = data(9, 4, 2)
    for distance in ("correlation", "euclidean", "cosine"):
        full = rdm(x, rsa_distance=distance).numpy()
        np.testing.assert_allclose(full[np.triu_indices(9, 1)], pdist(x, distance), atol=1e-12)
        np.testing.assert_allclose(full, full.T, atol=0)


def test_rsa_of_p1_needs_a_distance_defined_for_scalars():
    x, y = data(15, 1, 1)
    assert rsa(x, y, rsa_distance="euclidean") == pytest.approx(reference.rsa(x, y, "euclidean"), abs=1e-8)
    with pytest.warns(RuntimeWarning, match="rsa is undefined for `x`.*rsa_distance=euclidean"):
        assert math.isnan(rsa(x, y))


def test_kendall_tau_a_with_ties_equals_the_explicit_count():
    rng = np.random.default_rng(1)
    for m in (2, 3, 17, 200):
        a, b = rng.integers(0, 4, size=m).astype(float), rng.integers(0, 3, size=m).astype(float)
        assert kendall_tau_a(torch.tensor(a), torch.tensor(b)) == pytest.approx(reference.tau_a(a, b), abs=1e-12)
        c = rng.normal(size=m)
        assert kendall_tau_a(torch.tensor(c), torch.tensor(c ** 3)) == pytest.approx(1.0)


def test_self_similarity_is_one():
    x, _ = data(12, 6, 2)
    for distance in ("correlation", "euclidean", "cosine"):
        for compare in ("spearman", "pearson", "kendall_tau_a"):
            assert rsa(x, x, rsa_distance=distance, rsa_compare=compare) == pytest.approx(1.0, abs=1e-12)


def test_n_limit_is_stated_and_enforced():
    assert rsa_bytes(rsa_max_n(10**6, 4), 4) <= 10**6 < rsa_bytes(rsa_max_n(10**6, 4) + 1, 4)
    with pytest.raises(SimkitError, match=r"rsa keeps one RDM .* use at most n=\d+ \(`n`\), fewer layers .*`mode`=minibatch.* or raise `memory_budget_bytes`"):
        check_rsa_n(1000, 4, 10**6)
    with pytest.raises(SimkitError, match="at least 3 samples"):
        rsa(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(SimkitError, match="`rsa_compare` must be one of spearman, pearson, kendall_tau_a, got 'kendall'"):
        rsa(*data(5, 2, 2), rsa_compare="kendall")
    with pytest.raises(SimkitError, match="`rsa_distance` must be one of"):
        rsa(*data(5, 2, 2), rsa_distance="manhattan")


PROPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(seed=st.integers(0, 10_000), scale=st.floats(0.01, 100))
def test_euclidean_rsa_is_invariant_to_rotation_shift_scale_and_monotone_maps(seed, scale):
    x, y = data(14, 4, 3, seed=seed)
    rot, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(4, 4)))
    ref = rsa(x, y, rsa_distance="euclidean")
    assert rsa(x @ rot * scale + 2, y, rsa_distance="euclidean") == pytest.approx(ref, abs=1e-9)
    # Spearman sees only the order of the distances: the same for correlation distance under per-sample affine maps
    a = np.random.default_rng(seed).uniform(0.5, 3, size=(14, 1))
    assert rsa(x * a + a, y) == pytest.approx(rsa(x, y), abs=1e-9)


def test_euclidean_rsa_is_not_invariant_to_general_linear_maps():
    x, y = data(20, 4, 3, seed=2)
    stretch = np.diag([30.0, 1, 1, 0.1])
    assert abs(rsa(x @ stretch, y, rsa_distance="euclidean") - rsa(x, y, rsa_distance="euclidean")) > 1e-3


# ------------------------------------------------------------------------------------- jaccard k-NN


@pytest.mark.parametrize("n, p, q, k", [(30, 5, 3, 4), (12, 40, 2, 1), (6, 2, 2, 5)])
def test_jaccard_knn_equals_reference(n, p, q, k):
    x, y = data(n, p, q)
    assert jaccard_knn(x, y, k=k) == pytest.approx(reference.jaccard_knn(x, y, k), abs=1e-12)


def test_jaccard_self_is_one_and_below_mutual_knn():
    x, y = data(40, 5, 3)
    assert jaccard_knn(x, x, k=5) == pytest.approx(1.0)
    assert jaccard_knn(x, y, k=5) <= mutual_knn(x, y, k=5) + 1e-12
    with pytest.warns(RuntimeWarning, match="constant"):
        assert math.isnan(jaccard_knn(x, np.ones((40, 2)), k=5))
    with pytest.raises(SimkitError, match="k=40 neighbours need at least 41 samples"):
        jaccard_knn(x, y, k=40)
