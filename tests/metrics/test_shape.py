"""Procrustes, the CCA family and netrep's shape metric (simkit.metrics.shape) against float64 numpy
references (tests/reference.py) from the formulas (SVD / QR / explicit whitening), plus invariance properties."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simkit.errors import SimkitError
from simkit.metrics import cca, procrustes, procrustes_angle, pwcca, shape_metric, svcca
from simkit.metrics.shape import nuclear_norm, nuclear_norm_of_draw
from tests import reference

# ------------------------------------------------------------------------------ data


def data(n, p, q, seed=0, noise=0.5):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, p)) * rng.uniform(0.5, 2, size=p) + rng.normal(size=p) * 3
    y = np.tanh(x @ rng.normal(size=(p, q))) + noise * rng.normal(size=(n, q))
    return x, y


def rotation(p, seed):
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(p, p)))
    return q


SHAPES = [(40, 5, 3), (30, 1, 1), (25, 1, 4), (12, 3, 7), (60, 8, 8)]

# --------------------------------------------------------------------------- reference equality


@pytest.mark.parametrize("n, p, q", SHAPES)
def test_procrustes_and_angle_equal_reference(n, p, q):
    x, y = data(n, p, q)
    assert procrustes(x, y) == pytest.approx(reference.procrustes(x, y), abs=1e-10)
    assert procrustes_angle(x, y) == pytest.approx(math.acos(reference.procrustes(x, y)), abs=1e-8)


@pytest.mark.parametrize("n, p, q", [(8, 20, 30), (5, 9, 2)])
def test_procrustes_with_more_features_than_samples(n, p, q):
    x, y = data(n, p, q)
    assert procrustes(x, y) == pytest.approx(reference.procrustes(x, y), abs=1e-10)


@pytest.mark.parametrize("n, p, q", SHAPES)
def test_cca_family_equals_reference(n, p, q):
    x, y = data(n, p, q)
    assert cca(x, y) == pytest.approx(reference.cca(x, y), abs=1e-8)
    assert svcca(x, y) == pytest.approx(reference.svcca(x, y), abs=1e-8)
    assert svcca(x, y, svcca_keep=0.6) == pytest.approx(reference.svcca(x, y, 0.6), abs=1e-8)
    assert pwcca(x, y) == pytest.approx(reference.pwcca(x, y), abs=1e-8)


def test_cca_ridge_equals_reference():
    x, y = data(30, 6, 4)
    for eps in (1e-3, 0.1, 2.0):
        assert cca(x, y, cca_eps=eps) == pytest.approx(reference.cca_ridge(x, y, eps), abs=1e-8)


def test_cca_of_rank_deficient_input_uses_the_numerical_rank():
    x, y = data(40, 4, 3)
    x = np.concatenate([x, x[:, :1] * 2 - x[:, 1:2]], 1)   # a dependent fifth column
    qx, qy = reference.orth_basis(x), reference.orth_basis(y)
    rho = np.linalg.svd(qx.T @ qy, compute_uv=False)
    assert cca(x, y) == pytest.approx((rho**2).sum() / 3, abs=1e-8)
    assert cca(x, x) == pytest.approx(1.0, abs=1e-10)


@pytest.mark.parametrize("alpha", [0.0, 0.25, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("n, p, q", [(40, 5, 3), (30, 1, 1), (12, 3, 7), (8, 12, 5)])
def test_shape_metric_equals_netrep_reference(alpha, n, p, q):
    x, y = data(n, p, q)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        got = shape_metric(x, y, shape_alpha=alpha)
    if alpha == 0 and max(p, q) >= n - 1:
        assert math.isnan(got)
    else:
        assert got == pytest.approx(reference.shape_metric(x, y, alpha), abs=1e-8)


def test_shape_metric_ends_are_procrustes_and_cca():
    x, y = data(50, 4, 6)
    assert shape_metric(x, y, shape_alpha=1.0) == pytest.approx(procrustes_angle(x, y), abs=1e-10)
    rho = reference.canonical_correlations(x, y)
    assert shape_metric(x, y, shape_alpha=0.0) == pytest.approx(np.arccos(rho.sum() / math.sqrt(4 * 6)), abs=1e-8)


# ------------------------------------------------------------------------- self-similarity and NaN


@pytest.mark.parametrize("n, p", [(30, 4), (12, 1), (7, 3)])   # 2p <= n - 1: the pair is not degenerate
def test_self_similarity(n, p):
    x, _ = data(n, p, 2)
    assert procrustes(x, x) == pytest.approx(1.0, abs=1e-12)
    assert procrustes_angle(x, x) == pytest.approx(0.0, abs=1e-6)
    assert cca(x, x) == pytest.approx(1.0, abs=1e-10)
    assert svcca(x, x) == pytest.approx(1.0, abs=1e-10)
    assert pwcca(x, x) == pytest.approx(1.0, abs=1e-10)
    for alpha in (0.0, 0.5, 1.0):
        assert shape_metric(x, x, shape_alpha=alpha) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("fn", [cca, pwcca, lambda x, y: shape_metric(x, y, shape_alpha=0.0)])
@pytest.mark.parametrize("n, p, q", [(10, 9, 12), (10, 12, 2), (6, 5, 5)])
def test_cca_with_a_side_of_n_minus_1_dims_is_nan_and_warns(fn, n, p, q):
    x, y = data(n, p, q)
    with pytest.warns(RuntimeWarning, match=r"every canonical correlation is 1.*`cca_eps`"):
        assert math.isnan(fn(x, y))


def test_self_similarity_of_a_pair_whose_ranks_exceed_n_minus_1_is_nan_for_the_cca_family():
    x, _ = data(6, 3, 2)   # ranks 3 + 3 > n - 1 = 5: a correlation of 1 says nothing about the data
    for fn in (cca, pwcca, lambda a, b: shape_metric(a, b, shape_alpha=0.0)):
        with pytest.warns(RuntimeWarning, match=r"rank_x \+ rank_y = 3 \+ 3 = 6 > n - 1 = 5"):
            assert math.isnan(fn(x, x))
    assert shape_metric(x, x, shape_alpha=0.5) == pytest.approx(0.0, abs=1e-6)


JOINT = {"cca": cca, "pwcca": pwcca, "shape_metric": lambda x, y: shape_metric(x, y, shape_alpha=0.0),
         "svcca": lambda x, y: svcca(x, y, svcca_keep=1.0)}


@pytest.mark.parametrize("name", JOINT)
def test_a_pair_whose_ranks_exceed_n_minus_1_is_nan_and_warns_naming_the_ranks_and_n(name):
    fn = JOINT[name]
    x, y = data(20, 12, 10)                 # 12 + 10 = 22 > 19: at least 3 correlations are 1 by force
    what = r"kept components k_x \+ k_y" if name == "svcca" else r"rank_x \+ rank_y"
    with pytest.warns(RuntimeWarning, match=what + r" = 12 \+ 10 = 22 > n - 1 = 19, so at least 3 canonical"):
        assert math.isnan(fn(x, y))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert 0 <= fn(x, y[:, :7]) <= math.pi / 2           # 12 + 7 = n - 1: defined
        deficient = np.concatenate([x[:, :6], 2 * x[:, :6]], 1)   # 12 features of rank 6: 6 + 10 <= 19
        assert 0 <= fn(deficient, y) <= math.pi / 2


def test_the_forced_correlations_are_what_the_joint_rule_guards():
    """Without the guard (a vanishing ridge), independent data above n - 1 look similar: at least 3 of the
    10 canonical correlations are 1 by force, so R²_CCA >= 0.3 whatever the data."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 12)), rng.normal(size=(20, 10))   # independent
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cca(x, y, cca_eps=1e-9) > 0.3
    with pytest.warns(RuntimeWarning, match="rank_x"):
        assert math.isnan(cca(x, y))


def test_ridge_or_shape_alpha_above_0_keep_a_jointly_degenerate_pair_defined():
    x, y = data(20, 12, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert 0 < cca(x, y, cca_eps=0.1) < 1
        assert 0 < pwcca(x, y, cca_eps=0.1) < 1
        assert 0 < shape_metric(x, y, shape_alpha=0.5) < math.pi / 2
        assert 0 < svcca(x, y, svcca_keep=0.8) <= 1                  # fewer components kept


def test_cca_refusal_names_the_layers_with_n_minus_1_features_and_the_fixes():
    from simkit.metrics.shape import cca_refusal

    line = cca_refusal(["linear_cka", "cca"], [64, 600], [512, 100], 500, 0.0, ["enc.1", "enc.2"], ["dec.0", "dec.1"])
    assert line is not None and "\n" not in line
    assert "enc.2 (600 features)" in line and "dec.0 (512 features)" in line
    assert "enc.1" not in line and "dec.1" not in line
    assert "n = 500" in line and "n - 1 = 499" in line
    assert "`cca_eps` > 0" in line and "`reduce`=mean" in line and "svcca" in line
    assert line.startswith("cca would be undefined")
    # exactly n - 1 features is already degenerate; n - 2 is not
    assert cca_refusal(["pwcca"], [499], [10], 500, 0.0) is not None
    assert "A[0] (499 features)" in (cca_refusal(["pwcca"], [499], [10], 500, 0.0) or "")
    assert cca_refusal(["pwcca"], [498], [10], 500, 0.0) is None
    # a ridge, measures that do not whiten fully, or shape_metric with alpha > 0: nothing to refuse
    assert cca_refusal(["cca", "pwcca"], [600], [600], 500, 0.1) is None
    assert cca_refusal(["svcca", "procrustes", "ridge_r2", "linear_cka"], [600], [600], 500, 0.0) is None
    assert cca_refusal(["shape_metric"], [600], [10], 500, 0.0) is None
    both = cca_refusal(["cca", "shape_metric", "pwcca"], [600], [10], 500, 0.0, shape_alpha=0.0)
    assert both is not None and both.startswith("cca, shape_metric and pwcca would be undefined")


def test_cca_ridge_or_svcca_reduction_avoid_the_degenerate_case():
    x, y = data(10, 15, 12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = cca(x, y, cca_eps=0.1)
        assert 0 < value < 1
        assert 0 < svcca(x, y, svcca_keep=0.5) <= 1
        assert 0 < pwcca(x, y, cca_eps=0.1) < 1
        assert 0 < shape_metric(x, y, shape_alpha=0.0, cca_eps=0.1) < math.pi / 2
        assert not math.isnan(shape_metric(x, y, shape_alpha=0.3))


@pytest.mark.parametrize("fn", [procrustes, cca, svcca, pwcca, shape_metric, procrustes_angle])
def test_constant_input_is_nan_with_a_warning(fn):
    x, _ = data(20, 3, 2)
    with pytest.warns(RuntimeWarning, match="constant"):
        assert math.isnan(fn(x, np.ones((20, 2))))


def test_bad_arguments_are_one_line_errors():
    x, y = data(20, 3, 2)
    with pytest.raises(SimkitError, match=r"`shape_alpha` must be a number in \[0, 1\]"):
        shape_metric(x, y, shape_alpha=1.5)
    with pytest.raises(SimkitError, match="`cca_eps` must be a number >= 0"):
        cca(x, y, cca_eps=-1)
    with pytest.raises(SimkitError, match=r"`svcca_keep` must be a number in \(0, 1\], got 0"):
        svcca(x, y, svcca_keep=0)
    with pytest.raises(SimkitError, match="inconsistent numbers of samples"):
        procrustes(x, y[:5])
    with pytest.raises(SimkitError, match="at least 2 samples"):
        procrustes(x[:1], y[:1])


# ------------------------------------------------------------------------------------- properties

PROPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# rotations, scalings, shifts and permutations of units at the default settings, and invertible maps for
# cca: tests/metrics/test_invariances.py; here what depends on a setting or lies outside those five


@PROPS
@given(seed=st.integers(0, 10_000), scale=st.floats(0.01, 100), p=st.integers(1, 6))
def test_shape_metric_is_rotation_and_scale_invariant_at_every_alpha(seed, scale, p):
    x, y = data(30, p, 3, seed=seed)
    xr = x @ rotation(p, seed + 1) * scale + 5.0
    for alpha in (0.0, 0.4, 1.0):
        assert shape_metric(xr, y, shape_alpha=alpha) == pytest.approx(shape_metric(x, y, shape_alpha=alpha), abs=1e-6)


@PROPS
@given(seed=st.integers(0, 10_000))
def test_shape_metric_at_alpha_zero_is_invariant_to_invertible_linear_maps(seed):
    x, y = data(40, 4, 3, seed=seed)
    a = np.random.default_rng(seed).normal(size=(4, 4)) + 3 * np.eye(4)
    a[:, 0] *= 10                                    # stretch one direction: not a rotation
    assert shape_metric(x @ a, y, shape_alpha=0.0) == pytest.approx(shape_metric(x, y, shape_alpha=0.0), abs=1e-6)


@PROPS
@given(seed=st.integers(0, 10_000))
def test_pwcca_is_invariant_to_sign_flips_of_neurons(seed):
    x, y = data(40, 3, 5, seed=seed)
    assert pwcca(x * np.array([1, -1, 1]), y) == pytest.approx(pwcca(x, y), abs=1e-7)


def test_pwcca_weights_come_from_the_narrower_layer_so_equal_widths_are_not_symmetric():
    x, y = data(60, 3, 5, seed=1)
    x = x * np.array([5.0, 1.0, 0.2])
    assert abs(pwcca(x, y) - pwcca(y, x)) < 1e-12         # the weights come from x (narrower) both ways
    z, _ = data(60, 5, 5, seed=2)
    assert abs(pwcca(y, z) - pwcca(z, y)) > 1e-6           # equal widths: weights from the first argument


@PROPS
@given(seed=st.integers(0, 10_000), alpha=st.floats(0, 1))
def test_shape_metric_is_symmetric_and_satisfies_the_triangle_inequality(seed, alpha):
    rng = np.random.default_rng(seed)
    x, y, z = (np.tanh(rng.normal(size=(25, 4)) @ rng.normal(size=(4, 4))) for _ in range(3))
    d = lambda a, b: shape_metric(a, b, shape_alpha=alpha)  # noqa: E731
    assert d(x, y) == pytest.approx(d(y, x), abs=1e-8)
    assert d(x, z) <= d(x, y) + d(y, z) + 1e-8
    assert 0 <= d(x, y) <= math.pi / 2 + 1e-12


@PROPS
@given(seed=st.integers(0, 10_000))
def test_ranges(seed):
    x, y = data(20, 3, 4, seed=seed, noise=2.0)
    for fn in (procrustes, cca, svcca, pwcca):
        assert -1e-12 <= fn(x, y) <= 1 + 1e-12


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 40), rank=st.integers(0, 40), seed=st.integers(0, 10**6),
       scale=st.sampled_from([1e-6, 1.0, 1e6]))
def test_a_null_draws_nuclear_norm_is_within_its_stated_bound_of_the_singular_values(rows, cols, rank, seed, scale):
    """Rank-deficient blocks included (where the exact norm takes the SVD): ``min(r, s) · 3e-8 · ‖t‖₂``."""
    g = torch.Generator().manual_seed(seed)
    k = min(rank, rows, cols)
    t = scale * (torch.randn(rows, k, generator=g, dtype=torch.float64)
                 @ torch.randn(k, cols, generator=g, dtype=torch.float64))
    s = np.linalg.svd(t.numpy(), compute_uv=False)
    want = float(s.sum())
    bound = min(rows, cols) * 3e-8 * float(s.max(initial=0.0))
    assert abs(nuclear_norm_of_draw(t) - want) <= bound + 1e-300
    assert nuclear_norm(t) == pytest.approx(want, rel=1e-9, abs=1e-300)
