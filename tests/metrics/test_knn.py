"""Chunked exact k-NN and mutual k-NN (spec §0.4) against the numpy references of tests/reference.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simkit.errors import SimkitError
from simkit.metrics import knn as K
from tests import reference

FAST = settings(max_examples=30, deadline=None)


@FAST
@given(st.integers(2, 40), st.integers(1, 4), st.data())
def test_chunked_topk_equals_dense_reference_with_ties(n, p, draw):
    # small integers: products are exact, so ties are real ties and the tie rule is tested
    k = draw.draw(st.integers(1, n - 1))
    seed = draw.draw(st.integers(0, 10**6))
    x = torch.randint(-1, 2, (n, p), generator=torch.Generator().manual_seed(seed)).double()
    ref = reference.knn(x.numpy(), k)
    for chunk in (1, 3, n, None):
        got = K.knn_indices(x, k, chunk=chunk)
        assert got.dtype == torch.long and got.shape == (n, k)
        np.testing.assert_array_equal(got.numpy(), ref)


def test_all_points_identical_neighbours_are_the_lowest_other_indices():
    x = torch.ones(6, 2, dtype=torch.float64)
    got = K.knn_indices(x, 3, chunk=2)
    assert got.tolist() == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2], [0, 1, 2], [0, 1, 2]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_equals_one_block_on_random_data(dtype):
    x = torch.randn(300, 16, generator=torch.Generator().manual_seed(0), dtype=dtype)
    dense = K.knn_indices(x, 10, chunk=300)
    assert not (dense == torch.arange(300)[:, None]).any()  # self excluded
    for chunk in (1, 7, 64, None):
        assert torch.equal(K.knn_indices(x, 10, chunk=chunk), dense)
    np.testing.assert_array_equal(K.knn_indices(x.double(), 10).numpy(), reference.knn(x.double().numpy(), 10))


@pytest.mark.parametrize("n,p,q,k", [(12, 3, 5, 1), (30, 8, 2, 5), (60, 20, 40, 10), (11, 1, 1, 10)])
def test_mutual_knn_matches_numpy(n, p, q, k):
    rng = np.random.default_rng(n + k)
    X = rng.standard_normal((n, p)) * rng.exponential(size=p)  # heavy columns: the clamp matters
    Y = X[:, :1] * rng.standard_normal((1, q)) + rng.standard_normal((n, q))
    ref = reference.mutual_knn(X, Y, k)
    for chunk in (None, 5):
        assert K.mutual_knn(X, Y, k=k, chunk=chunk) == pytest.approx(ref, abs=1e-12)


def test_mutual_knn_clamp_is_per_matrix_quantile():
    x = torch.randn(50, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[0, 0] = 1e6  # one outlier would otherwise dominate row 0's direction
    b = np.quantile(np.abs(x.numpy()), 0.95)
    z = K.clamp_normalize(x)
    expected = np.clip(x.numpy(), -b, b)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(z.numpy(), expected, rtol=1e-12, atol=1e-14)


@FAST
@given(st.integers(12, 40), st.integers(1, 10), st.integers(0, 10**6))
def test_mutual_knn_properties(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g, dtype=torch.float64)
    y = torch.randn(n, 7, generator=g, dtype=torch.float64)
    score = K.mutual_knn(x, y, k=k)
    assert 0.0 <= score <= 1.0
    assert K.mutual_knn(x, x, k=k) == 1.0
    assert K.mutual_knn(y, x, k=k) == pytest.approx(score, abs=1e-15)
    assert K.mutual_knn(3.5 * x, y, k=k) == pytest.approx(score, abs=1e-15)  # positive scaling


def test_mutual_knn_float32_mode():
    x = torch.randn(100, 8, generator=torch.Generator().manual_seed(2))
    y = x + 0.3 * torch.randn(100, 8, generator=torch.Generator().manual_seed(3))
    assert K.mutual_knn(x, y, dtype=torch.float32) == pytest.approx(K.mutual_knn(x, y), abs=0.02)


def test_constant_input_gives_nan_and_a_warning():
    with pytest.warns(RuntimeWarning, match="mutual k-NN is undefined .x is constant"):
        assert np.isnan(K.mutual_knn(torch.ones(12, 3), torch.randn(12, 2), k=3))


def test_knn_overlap_counts():
    a = torch.tensor([[1, 2, 3], [0, 2, 3]])
    b = torch.tensor([[3, 4, 1], [5, 6, 7]])
    assert K.knn_overlap(a, b).tolist() == [2, 0]


def test_chunk_is_the_screening_tile_and_does_not_change_the_sets():
    # n above two tiles: the float32 screen and the float64 decision run (not the small-n exact path)
    x = torch.randn(400, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    ref = reference.knn(x.numpy(), 7)
    for chunk in (16, 150, 399, None):
        np.testing.assert_array_equal(K.knn_indices(x, 7, chunk=chunk).numpy(), ref)


def test_errors():
    x = torch.randn(10, 3)
    with pytest.raises(SimkitError, match=r"found inconsistent numbers of samples: \[100, 80\]"):
        K.mutual_knn(torch.randn(100, 3), torch.randn(80, 3))
    with pytest.raises(SimkitError, match="k=10 neighbours need at least 11 samples, got 10"):
        K.mutual_knn(x, x)
    with pytest.raises(SimkitError, match="`k` must be a positive integer, got 0"):
        K.knn_indices(x, 0)
    with pytest.raises(SimkitError, match="`chunk` must be a positive integer"):
        K.knn_indices(x, 2, chunk=0)
    x[0, 0] = float("nan")
    with pytest.raises(SimkitError, match="non-finite activations"):
        K.knn_indices(x, 2)
    with pytest.raises(SimkitError, match=r"must be a 2-D \(n, features\) matrix"):
        K.knn_indices(torch.randn(10), 2)
