"""The fast exact k-NN search (simkit.metrics.knn_search): float32 screen, float64 decision, fallback rows.

Every result is compared with a float64 numpy reference (tests/reference.py) (stable argsort: ties to the lower
index), on data that goes through the screen (n above two tiles), both backends where faiss is installed.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from simkit.errors import SimkitError
from simkit.metrics import knn as K
from simkit.metrics import knn_search as S
from tests import reference

BACKENDS = ["torch"] + (["faiss"] if S.faiss_available() else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_screened_search_equals_the_float64_reference(backend, dtype):
    x = torch.randn(700, 24, generator=torch.Generator().manual_seed(0), dtype=dtype)
    got = K.knn_indices(x, 10, chunk=64, backend=backend)
    np.testing.assert_array_equal(got.numpy(), reference.knn(x.double().numpy(), 10))


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_through_the_screen_go_to_the_lower_index(backend):
    # small integers: every product is exact, ties are real; the check cannot prove tied rows, which are
    # then redone by the exact path, so the tie rule holds on the fast path too
    x = torch.randint(-1, 2, (300, 3), generator=torch.Generator().manual_seed(1)).double()
    for k in (1, 4, 9):
        got = K.knn_indices(x, k, chunk=32, backend=backend)
        np.testing.assert_array_equal(got.numpy(), reference.knn(x.numpy(), k))


def test_differences_below_float32_resolution_are_decided_in_float64():
    # rows equal to float32 precision, different in float64: the screen cannot rank them, the check sees it
    g = torch.Generator().manual_seed(2)
    base = torch.randn(1, 16, generator=g, dtype=torch.float64)
    x = torch.cat([base + 1e-9 * torch.randn(250, 16, generator=g, dtype=torch.float64),
                   torch.randn(250, 16, generator=g, dtype=torch.float64)])
    got = K.knn_indices(x, 5, chunk=32)
    np.testing.assert_array_equal(got.numpy(), reference.knn(x.numpy(), 5))


def test_the_float64_check_proves_almost_every_row_of_random_data():
    x = torch.nn.functional.normalize(torch.randn(900, 32, generator=torch.Generator().manual_seed(3)), dim=1)
    m = S.screen_size(10, len(x))
    floor, cand = S.screen_torch(x, m, 128)
    out, proven = S.decide(x, floor, cand, 10)
    ref = reference.knn(x.numpy(), 10)
    assert float(proven.double().mean()) > 0.95          # the fast path does the work
    np.testing.assert_array_equal(out[proven].numpy(), ref[proven.numpy()])
    # the screen's floor really bounds every excluded product (the property the check relies on)
    s = (x @ x.T).fill_diagonal_(-torch.inf)
    inside = torch.zeros_like(s, dtype=torch.bool).scatter_(1, cand, True)
    assert bool((s.masked_fill(inside, -torch.inf).amax(1) <= floor).all())


def test_progress_reports_every_row_once():
    x = torch.randn(500, 8, generator=torch.Generator().manual_seed(4))
    seen: list[int] = []
    K.knn_indices(x, 3, chunk=64, progress=seen.append)
    assert sum(seen) == 500 and len(seen) > 1
    seen.clear()
    K.knn_indices(x[:50], 3, progress=seen.append)  # small n: one step
    assert seen == [50]


def test_faiss_missing_is_a_clear_error_and_auto_falls_back(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss now raises ImportError
    x = torch.randn(500, 8, generator=torch.Generator().manual_seed(5))
    with pytest.raises(SimkitError, match=r"needs faiss-cpu, which is not installed; pip install 'simkit\[fast\]'"):
        K.knn_indices(x, 3, backend="faiss")
    np.testing.assert_array_equal(K.knn_indices(x, 3, chunk=64).numpy(), reference.knn(x.numpy(), 3))
    with pytest.raises(SimkitError, match="unknown k-NN `backend` 'annoy'"):
        K.knn_indices(x, 3, backend="annoy")


def test_mutual_and_jaccard_take_the_backend():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(600, 12, generator=g, dtype=torch.float64)
    y = x + torch.randn(600, 12, generator=g, dtype=torch.float64)
    a, b = reference.knn(K.clamp_normalize(x).numpy(), 10), reference.knn(K.clamp_normalize(y).numpy(), 10)
    shared = np.array([len(set(a[i]) & set(b[i])) for i in range(600)], dtype=np.float64)
    for backend in BACKENDS:
        assert K.mutual_knn(x, y, chunk=100, backend=backend) == pytest.approx(shared.mean() / 10, abs=1e-15)
        assert K.jaccard_knn(x, y, chunk=100, backend=backend) == pytest.approx(
            np.mean(shared / (20 - shared)), abs=1e-15)


@pytest.mark.parametrize("q", [0.0, 0.3, 0.95, 0.999, 1.0])
def test_the_clamp_quantile_is_numpys_with_repeated_values(q):
    # the next order statistic is taken without a second selection: repeats and gaps both checked
    from simkit.metrics._checks import exact_quantile

    rng = np.random.default_rng(7)
    for a in (rng.integers(0, 4, size=1001).astype(np.float64), rng.standard_normal(999), np.ones(10), np.arange(2.0)):
        assert float(exact_quantile(torch.from_numpy(a), q)) == pytest.approx(np.quantile(a, q), abs=1e-15)
