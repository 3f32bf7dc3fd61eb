"""CKA family against float64 numpy references (tests/reference.py) from the formulas (spec §0.1, §0.2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simkit.errors import SimkitError
from simkit.metrics import cka as C
from simkit.metrics._checks import exact_quantile
from tests import reference

TOL = dict(rtol=1e-10, atol=1e-10)
FAST = settings(max_examples=25, deadline=None)

# ------------------------------------------------------------------------------ data


def data(n, p, seed, shift=0.0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, p)) + shift


# (n, p, q): awkward shapes: p > n, p = 1, n = 4, both sides of p·q = n²
SHAPES = [(4, 1, 1), (4, 7, 2), (5, 30, 3), (6, 6, 6), (7, 1, 50), (10, 3, 40), (12, 12, 12), (25, 4, 9)]


@pytest.mark.parametrize("n,p,q", SHAPES)
@pytest.mark.parametrize("form", ["auto", "features", "gram"])
def test_linear_and_unbiased_cka_match_numpy(n, p, q, form):
    X, Y = data(n, p, 1, shift=2.0), data(n, q, 2, shift=-1.0) + data(n, 1, 3)
    Y[:, :1] += X[:, :1]  # some real dependence
    K, L = X @ X.T, Y @ Y.T
    np.testing.assert_allclose(C.linear_cka(X, Y, form=form), reference.cka_of_grams(K, L, reference.hsic_biased), **TOL)
    np.testing.assert_allclose(C.unbiased_cka(X, Y, form=form), reference.cka_of_grams(K, L, reference.hsic_unbiased), **TOL)


@pytest.mark.parametrize("n,p,q", SHAPES)
@pytest.mark.parametrize("factor", [0.5, 1.0, 2.0])
def test_rbf_cka_matches_numpy(n, p, q, factor):
    X, Y = data(n, p, 4), data(n, q, 5)
    np.testing.assert_allclose(C.rbf_cka(X, Y, factor), reference.cka_of_grams(reference.rbf_gram(X, factor), reference.rbf_gram(Y, factor), reference.hsic_biased), **TOL)


@pytest.mark.parametrize("n", [4, 5, 9])
def test_gram_building_blocks_match_numpy(n):
    X, Y = data(n, 3, 6), data(n, 8, 7)
    K, L = X @ X.T, Y @ Y.T
    Kt, Lt = torch.from_numpy(K), torch.from_numpy(L)
    np.testing.assert_allclose(C.gram_linear(torch.from_numpy(X)).numpy(), K, **TOL)
    np.testing.assert_allclose(C.gram_rbf(torch.from_numpy(X)).numpy(), reference.rbf_gram(X), **TOL)
    np.testing.assert_allclose(C.center_gram(Kt).numpy(), reference.centring_matrix(n) @ K @ reference.centring_matrix(n), **TOL)
    np.testing.assert_allclose(float(C.hsic_biased(Kt, Lt)), reference.hsic_biased(K, L), **TOL)
    np.testing.assert_allclose(float(C.hsic_unbiased(Kt, Lt)), reference.hsic_unbiased(K, L), **TOL)
    # the spec's identity <U(K), U(L)>_F = n(n-3) HSIC_1, and U(K) has a zero diagonal
    U = C.u_center_gram(Kt)
    np.testing.assert_allclose(float((U * C.u_center_gram(Lt)).sum()), n * (n - 3) * reference.hsic_unbiased(K, L), **TOL)
    assert torch.equal(U.diagonal(), torch.zeros(n, dtype=U.dtype))
    # batched Grams equal one at a time
    both = torch.stack([Kt, Lt])
    assert torch.allclose(C.center_gram(both)[1], C.center_gram(Lt), rtol=0, atol=1e-12)
    assert torch.allclose(C.u_center_gram(both)[1], C.u_center_gram(Lt), rtol=0, atol=1e-12)
    assert torch.allclose(C.hsic_unbiased(both, both.flip(0))[0], C.hsic_unbiased(Kt, Lt), rtol=1e-12)


@pytest.mark.parametrize("n,p,q", SHAPES)
def test_feature_helpers_match_gram_formulas_for_any_mean(n, p, q):
    X, Y = data(n, p, 8, shift=3.0), data(n, q, 9, shift=-2.0)
    K, L = X @ X.T, Y @ Y.T  # uncentred Grams: HSIC_1 of linear kernels ignores the mean
    Xt, Yt = torch.from_numpy(X), torch.from_numpy(Y)
    for form in ("features", "gram"):
        got = float(C.linear_hsic_unbiased_features(Xt, Yt, form))
        np.testing.assert_allclose(got, reference.hsic_unbiased(K, L), rtol=1e-9, atol=1e-9)
        got_b = float(C.linear_hsic_biased_features(Xt, Yt, form))
        np.testing.assert_allclose(got_b, reference.hsic_biased(K, L), rtol=1e-9, atol=1e-9)
    if n >= 4:
        Kt, Lt = K.copy(), L.copy()
        np.fill_diagonal(Kt, 0)
        np.fill_diagonal(Lt, 0)
        one = np.ones(n)
        terms = [np.trace(Kt @ Lt), one @ Kt @ one, one @ Lt @ one, one @ Kt @ Lt @ one]
        got = C.hsic1_from_terms(n, *[torch.tensor(t) for t in terms])
        np.testing.assert_allclose(float(got), reference.hsic_unbiased(K, L), **TOL)
    np.testing.assert_allclose(float(C.gram_fro_sq(Xt)), np.sum(K * K), rtol=1e-12)


def test_median_distance_excludes_the_diagonal_and_matches_numpy():
    X = data(9, 3, 10)
    d = np.sqrt(((X[:, None] - X[None]) ** 2).sum(-1))[np.triu_indices(9, 1)]
    np.testing.assert_allclose(float(C.median_distance(torch.from_numpy(X))), np.median(d), **TOL)


@pytest.mark.parametrize("size", [1, 2, 7, 100])
@pytest.mark.parametrize("q", [0.0, 0.5, 0.95, 1.0])
def test_exact_quantile_matches_numpy(size, q):
    a = data(size, 1, 11).ravel()
    np.testing.assert_allclose(float(exact_quantile(torch.from_numpy(a), q)), np.quantile(a, q), **TOL)


def test_exact_quantile_beyond_torch_quantile_limit():
    # torch.quantile refuses inputs over 2**24 entries in older torch releases (simkit supports >= 2.1)
    a = torch.rand(2**24 + 3, generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose(float(exact_quantile(a, 0.95)), np.quantile(a.numpy().astype(np.float64), 0.95), rtol=1e-6)


# ------------------------------------------------------------------------------------ properties

shapes = st.tuples(st.integers(4, 14), st.integers(1, 20), st.integers(1, 20), st.integers(0, 10**6))
METRICS = [C.linear_cka, C.unbiased_cka, C.rbf_cka]


def torch_pair(n, p, q, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, p, generator=g, dtype=torch.float64)
    y = torch.randn(n, q, generator=g, dtype=torch.float64) + x[:, :1] * torch.randn(1, q, generator=g, dtype=torch.float64)
    return x, y


@FAST
@given(shapes)
def test_symmetric_self_one_and_forms_agree(shape):
    n, p, q, seed = shape
    x, y = torch_pair(n, p, q, seed)
    for metric in METRICS:
        assert metric(x, y) == pytest.approx(metric(y, x), abs=1e-10)
        assert metric(x, x) == pytest.approx(1.0, abs=1e-10)
    assert 0.0 <= C.linear_cka(x, y) <= 1.0 + 1e-12
    for metric in (C.linear_cka, C.unbiased_cka):
        assert metric(x, y, form="features") == pytest.approx(metric(x, y, form="gram"), abs=1e-10)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10**6))
def test_unbiased_cka_of_independent_data_is_near_zero_where_biased_is_not(seed):
    # high-dimensional, small n: biased CKA of independent Gaussians is close to 1 (the known bias)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(30, 1000, generator=g, dtype=torch.float64)
    y = torch.randn(30, 1000, generator=g, dtype=torch.float64)
    assert C.linear_cka(x, y) > 0.9
    assert abs(C.unbiased_cka(x, y)) < 0.2


def test_unbiased_cka_detects_real_dependence():
    x, _ = torch_pair(30, 1000, 1, 0)
    assert C.unbiased_cka(x, x[:, :500] + 0.1 * torch.randn(30, 500, dtype=torch.float64)) > 0.5


# ---------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("metric", METRICS)
def test_mismatched_sample_counts(metric):
    with pytest.raises(SimkitError, match=r"found inconsistent numbers of samples: \[100, 80\]"):
        metric(torch.randn(100, 3), torch.randn(80, 3))


def test_unbiased_needs_four_samples():
    with pytest.raises(SimkitError, match="unbiased CKA needs at least 4 samples, got 3"):
        C.unbiased_cka(torch.randn(3, 2), torch.randn(3, 2))
    with pytest.raises(SimkitError, match="unbiased HSIC needs at least 4 samples, got 3"):
        C.hsic_unbiased(torch.eye(3), torch.eye(3))


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input(metric, bad):
    x = torch.randn(6, 3)
    x[2, 1] = bad
    with pytest.raises(SimkitError, match=r"non-finite activations \(NaN or Inf\) in x"):
        metric(x, torch.randn(6, 2))


@pytest.mark.parametrize("metric", METRICS)
def test_constant_activation_gives_nan_and_a_warning(metric):
    with pytest.warns(RuntimeWarning, match="CKA is undefined .y is constant"):
        value = metric(torch.randn(6, 3), torch.full((6, 4), 0.1))
    assert np.isnan(value)


def _rounded_constant(n: int = 60) -> torch.Tensor:
    """(n, 3) float32: every row the same sum of 64 terms, added in a different order per row, so the
    rows differ only by float32 rounding (like a bias-only layer computed by different kernels)."""
    gen = torch.Generator().manual_seed(0)
    terms = torch.randn(64, generator=gen)
    sums = torch.stack([terms[torch.randperm(64, generator=gen)].sum() for _ in range(n)])
    assert sums.unique().numel() > 1                     # not exactly constant
    return sums[:, None] + torch.tensor([0.5, -2.0, 7.0])


def test_constant_up_to_rounding_is_constant_and_small_variance_is_not():
    from simkit.metrics._checks import is_constant

    gen = torch.Generator().manual_seed(1)
    noise = torch.randn(60, 4, generator=gen, dtype=torch.float64)
    assert is_constant(torch.full((60, 4), 0.1, dtype=torch.float64)) and is_constant(torch.zeros(5, 2))
    assert is_constant(_rounded_constant().double())
    assert is_constant(1e8 + 1e-1 * noise)               # 1e8 with noise at 1e-9 relative
    assert not is_constant(1.0 + 1e-3 * noise)           # a genuinely varying small-variance layer
    assert not is_constant(1e-300 * noise) and not is_constant(1e300 * noise)   # no under/overflow
    big_constant_column = torch.cat([torch.full((60, 1), 1e8, dtype=torch.float64), noise[:, :1]], 1)
    assert not is_constant(big_constant_column)          # one column varies: CKA is defined


@FAST
@given(st.floats(1e-3, 1e6), st.booleans(), st.integers(-40, 40))
def test_is_constant_is_relative_to_the_values_magnitude(size, negative, power):
    from simkit.metrics._checks import is_constant

    shift = (-size if negative else size) * 2.0 ** power
    spread = torch.linspace(-1, 1, 16, dtype=torch.float64)[:, None] * torch.tensor([1.0, -3.0], dtype=torch.float64)
    row = torch.full((16, 2), shift, dtype=torch.float64)
    assert is_constant(row)
    assert is_constant(row + 1e-9 * shift * spread)      # relative spread 1e-9: rounding
    assert not is_constant(row + 1e-4 * shift * spread)  # relative spread 1e-4: real variation
    assert not is_constant(1e-9 * shift * spread)        # the same spread around 0 is real variation


@pytest.mark.parametrize("metric", METRICS)
def test_rounding_noise_constant_gives_nan_and_a_warning(metric):
    y = torch.randn(60, 5, generator=torch.Generator().manual_seed(2))
    with pytest.warns(RuntimeWarning, match="CKA is undefined .x is constant"):
        value = metric(_rounded_constant(), y)
    assert np.isnan(value)
    x = 1.0 + 1e-3 * torch.randn(60, 3, generator=torch.Generator().manual_seed(3))
    X, Y = x.double().numpy(), y.double().numpy()
    if metric is C.linear_cka:                           # small variance: a real value, no NaN
        np.testing.assert_allclose(metric(x, y), reference.cka_of_grams(X @ X.T, Y @ Y.T, reference.hsic_biased), rtol=1e-6)


def test_bad_shapes_and_options():
    with pytest.raises(SimkitError, match=r"`x` must be a 2-D \(n, features\) matrix, got shape \(4, 2, 2\)"):
        C.linear_cka(torch.randn(4, 2, 2), torch.randn(4, 3))
    with pytest.raises(SimkitError, match="unknown form 'dense'; valid: auto, features, gram"):
        C.linear_cka(torch.randn(4, 2), torch.randn(4, 3), form="dense")
    with pytest.raises(SimkitError, match="`factor` must be a positive number"):
        C.rbf_cka(torch.randn(4, 2), torch.randn(4, 3), factor=0)
    with pytest.raises(SimkitError, match="RBF bandwidth is 0"):
        C.gram_rbf(torch.tensor([[0.0], [0.0], [0.0], [0.0], [1.0]], dtype=torch.float64))
    with pytest.raises(SimkitError, match=r"Gram matrices must be square"):
        C.hsic_biased(torch.ones(4, 3), torch.ones(4, 4))
    with pytest.raises(SimkitError, match=r"biased HSIC needs at least 2 samples, got 1"):
        C.hsic_biased(torch.ones(1, 1), torch.ones(1, 1))
