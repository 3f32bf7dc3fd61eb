"""The measures computed pair by pair (simkit.metrics.pairs): cknna, cycle_knn, distance_correlation,
information_imbalance, bures_similarity. Each against its float64 reference (tests/reference.py, written
from the peer's code or paper) and, where the peer is a package (dcor), against the package; every batch
split of the stored path in both modes equals the function; the null is the function on permuted samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from simkit.catalog import MEASURES
from simkit.errors import SimkitError
from simkit.metrics import bures_similarity, cknna, cycle_knn, distance_correlation, information_imbalance
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming import make_accumulator
from simkit.metrics.streaming.common import draw_perms, perm_generator
from tests import reference

PAIRWISE = ["cknna", "cycle_knn", "distance_correlation", "information_imbalance", "bures_similarity"]
FUNCTIONS = {"cknna": cknna, "cycle_knn": cycle_knn, "distance_correlation": distance_correlation,
             "information_imbalance": information_imbalance, "bures_similarity": bures_similarity}
K = 4


def related(n: int, p: int, q: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, p)) + rng.normal(size=p)
    y = np.tanh(x @ rng.normal(size=(p, q))) + 0.5 * rng.normal(size=(n, q))
    return x, y


def one_shot(name: str, x, y, st: CompareSettings) -> float:
    """The function under the settings of a run."""
    keywords = {"cknna": {"k": st.knn_k}, "cycle_knn": {"k": st.knn_k},
                "distance_correlation": {"dcor_estimator": st.dcor_estimator},
                "bures_similarity": {"rsa_distance": st.rsa_distance}}
    return FUNCTIONS[name](x, y, **keywords.get(name, {}))


@pytest.mark.parametrize("n, p, q", [(30, 5, 3), (12, 40, 2), (25, 1, 6)])
def test_each_function_equals_its_reference(n, p, q):
    x, y = related(n, p, q)
    assert cknna(x, y, k=K) == pytest.approx(reference.cknna(x, y, K), abs=1e-10)
    assert cycle_knn(x, y, k=K) == reference.cycle_knn(x, y, K)
    for estimator in ("bias_corrected", "plain"):
        got = distance_correlation(x, y, dcor_estimator=estimator)
        assert got == pytest.approx(reference.distance_correlation(x, y, estimator), abs=1e-10)
    assert information_imbalance(x, y) == pytest.approx(reference.information_imbalance(x, y), abs=1e-12)
    for distance in ("correlation", "cosine", "euclidean"):
        if distance == "correlation" and p == 1:   # one unit: every sample vector is constant
            with pytest.warns(RuntimeWarning, match="constant or zero under correlation distance"):
                assert math.isnan(bures_similarity(x, y))
            continue
        # rsatoolbox's square roots of eigenvalues lose ~1e-8 near zero; simkit's nuclear norm does not
        got = bures_similarity(x, y, rsa_distance=distance)
        assert got == pytest.approx(reference.bures_similarity(x, y, distance), abs=1e-6)


def test_distance_correlation_agrees_with_the_dcor_package():
    dcor = pytest.importorskip("dcor")
    for seed, (n, p, q) in enumerate([(40, 6, 3), (9, 30, 2)]):
        x, y = related(n, p, q, seed)
        assert distance_correlation(x, y, dcor_estimator="plain") == pytest.approx(
            dcor.distance_correlation(x, y), abs=1e-10)
        assert distance_correlation(x, y) == pytest.approx(dcor.u_distance_correlation_sqr(x, y), abs=1e-10)


def test_bures_similarity_with_euclidean_distance_is_procrustes():
    from simkit.metrics import procrustes

    x, y = related(30, 4, 7)
    assert bures_similarity(x, y, rsa_distance="euclidean") == pytest.approx(procrustes(x, y), abs=1e-12)


def test_values_on_identical_unrelated_and_directional_inputs():
    x, y = related(60, 6, 4)
    noise = np.random.default_rng(5).normal(size=(60, 4))
    for name, fn in FUNCTIONS.items():
        same, unrelated = fn(x, x), fn(x, noise)
        best = 0.0 if name == "information_imbalance" else 1.0
        assert same == pytest.approx(best, abs=2 / 60 + 1e-12), name   # Δ(x→x) = 2/n: each neighbour ranks 1
        assert abs(unrelated - best) > 0.3, name
    assert MEASURES["cycle_knn"].directional and MEASURES["information_imbalance"].directional
    assert cycle_knn(x, y, k=K) != cycle_knn(y, x, k=K)
    assert information_imbalance(x, y) != information_imbalance(y, x)


def test_refusals_and_constant_inputs():
    x, y = related(10, 3, 2)
    with pytest.raises(SimkitError, match="k=10 neighbours need at least 11 samples, got 10"):
        cknna(x, y, k=10)
    with pytest.raises(SimkitError, match="`dcor_estimator` must be one of bias_corrected, plain"):
        distance_correlation(x, y, dcor_estimator="unbiased")
    with pytest.raises(SimkitError, match="at least 4 samples"):
        distance_correlation(x[:3], y[:3])
    for fn in FUNCTIONS.values():
        with pytest.warns(RuntimeWarning, match="constant"):
            assert math.isnan(fn(*related(20, 3, 2)[:1], np.ones((20, 2))))


@pytest.mark.parametrize("mode", ["exact", "minibatch"])
def test_stored_path_equals_the_functions_and_the_null_is_their_permutation(mode):
    g = torch.Generator().manual_seed(3)
    xa = [torch.randn(33, 5, generator=g), torch.randn(33, 7, generator=g) + 2]
    xb = [torch.tanh(xa[0] @ torch.randn(5, 3, generator=g)), torch.randn(33, 2, generator=g)]  # width 1: k-NN ties
    st = CompareSettings(metrics=PAIRWISE, mode=mode, null=2, knn_k=K, seed=4, dcor_estimator="plain",
                         rsa_distance="cosine").validate()
    acc = make_accumulator(st, [5, 7], [3, 2])
    for start in (0, 10, 27):                           # unequal batches
        stop = {0: 10, 10: 27, 27: 33}[start]
        acc.update([x[start:stop] for x in xa], [y[start:stop] for y in xb])
    out, paths = acc.compute(), acc.describe()
    perms = draw_perms(2, 33, perm_generator(4, -1), "cpu")
    for name in PAIRWISE:
        assert paths[name]["path"] == "stored-pairwise"
        want = np.array([[one_shot(name, a, b, st) for b in xb] for a in xa])
        np.testing.assert_allclose(out[name]["value"], want, atol=1e-10, err_msg=name)
        null = np.array([[[one_shot(name, a, b[pk], st) for b in xb] for a in xa] for pk in perms])
        np.testing.assert_allclose(out[name]["null"], null, atol=1e-10, err_msg=name)


def test_the_memory_budget_is_checked_before_the_work():
    x = [torch.randn(50, 3)]
    acc = make_accumulator(CompareSettings(metrics=["distance_correlation"], mode="exact", null=0,
                                           memory_budget_bytes=10_000), [3], [3])
    acc.update(x, x)
    with pytest.raises(SimkitError, match=r"distance_correlation keeps every layer .* `memory_budget_bytes`"):
        acc.compute()
