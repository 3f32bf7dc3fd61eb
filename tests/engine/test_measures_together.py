"""The end phase shared across measures (issue #27): every covariance measure and ``ridge_r2`` computed
together in one compare equal each computed alone, on the same tensors, to 1e-10 in float64, in both
modes and on both the streamed and the stored paths; one eigendecomposition per layer serves the six
covariance measures; each A layer's ridge factorisations are made once per fold and serve every B layer
and every permutation of a null; the sample-space ridge of wide layers and the Cholesky solve agree with
the moments and the eigendecomposition; and the values match the float64 numpy references of
``tests/reference.py``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import simkit
from simkit.metrics import predictivity
from simkit.metrics.predictivity import (
    FoldSolver,
    SampleFolds,
    centred,
    fold_moments,
    ridge_from_moments,
    sample_space_cheaper,
)
from simkit.metrics.rsa import average_ranks
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming import make_accumulator
from tests import reference
from tests.engine.test_every_path import Tables

COVARIANCE = ("procrustes", "procrustes_angle", "cca", "svcca", "pwcca", "shape_metric")
SHARED = (*COVARIANCE, "ridge_r2")
TOL = 1e-10
N, BATCH = 160, 32


def layers() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """float64 layers on N samples: A = [6, 30 of rank 12 about a mean of 50, 90 (wide: the sample-space ridge)],
    B = [10 (depends on A[0]), 40 (depends on A[2]), 25]; every pair is defined (ranks add up to at most
    90 + 40 < N − 1)."""
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    a0 = r(N, 6)
    a1 = r(N, 12) @ r(12, 30) + 50.0
    a2 = torch.tanh(r(N, 90))
    b0 = a0 @ r(6, 10) + 0.5 * r(N, 10)
    b1 = a2[:, :40] @ r(40, 40) + r(N, 40)
    b2 = r(N, 25) - 3.0
    return [a0, a1, a2], [b0, b1, b2]


XA, XB = layers()
OPTS = {"svcca_keep": 0.95, "shape_alpha": 0.4, "ridge_lambda": 0.05, "ridge_folds": 4}


def accumulate(metrics, stored: bool = False, null: int = 0, **kw) -> dict:
    """An exact accumulator of ``metrics`` fed XA, XB in batches (``stored``: the stored paths, via a null)."""
    settings = CompareSettings(metrics=list(metrics), mode="exact", null=null or (1 if stored else 0),
                               **{**OPTS, **kw})  # type: ignore[arg-type]
    acc = make_accumulator(settings, [x.shape[1] for x in XA], [y.shape[1] for y in XB])
    for s in range(0, N, BATCH):
        acc.update([x[s:s + BATCH] for x in XA], [y[s:s + BATCH] for y in XB])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return acc.compute()


def compared(metrics, mode: str) -> dict[str, np.ndarray]:
    """``simkit.compare`` of models whose layers output XA, XB (float64) in ``mode``."""
    models = Tables(XA), Tables(XB)
    names = [[f"layers.l{i}" for i in range(len(xs))] for xs in (XA, XB)]
    settings = CompareSettings(metrics=list(metrics), mode=mode, batch_size=BATCH, null=0,
                               **OPTS)  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = simkit.compare(*models, torch.arange(N), settings, layers_a=names[0], layers_b=names[1],
                                progress=False)
    return {m: result.matrix(m).to_numpy(dtype=float, na_value=np.nan) for m in metrics}


def assert_close(got: np.ndarray, want: np.ndarray, what: str, tol: float = TOL) -> None:
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: NaN pattern\n{got}\n{want}"
    assert np.allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=0, atol=tol), f"{what}:\n{got}\n{want}"


@pytest.mark.parametrize("mode", ["exact", "minibatch"])
def test_compare_of_all_shared_measures_equals_each_alone(mode):
    together = compared(SHARED, mode)
    assert np.isfinite(together["procrustes"]).all() and np.isfinite(together["ridge_r2"]).all()
    for m in SHARED:
        assert_close(together[m], compared([m], mode)[m], f"{m} in {mode} mode")


@pytest.mark.parametrize("stored", [False, True])
def test_accumulator_together_equals_alone_on_both_paths(stored):
    together = accumulate(SHARED, stored=stored)
    for m in SHARED:
        alone = accumulate([m], stored=stored)
        assert_close(together[m]["value"], alone[m]["value"], f"{m}, stored={stored}")
        if stored:
            assert_close(together[m]["null"], alone[m]["null"], f"{m} null, stored={stored}")


def test_streamed_and_stored_paths_agree_and_match_the_float64_references():
    streamed, stored = accumulate(SHARED), accumulate(SHARED, stored=True)
    for m in SHARED:
        assert_close(streamed[m]["value"], stored[m]["value"], f"{m}: streamed vs stored", tol=1e-9)
    xa, xb = [x.numpy() for x in XA], [y.numpy() for y in XB]
    for name, fn, tol in (("procrustes", reference.procrustes, 1e-10), ("cca", reference.cca, 1e-8),
                          ("ridge_r2", lambda a, b: reference.ridge_r2(a, b, OPTS["ridge_lambda"], OPTS["ridge_folds"]),
                           1e-9)):
        rows = [0, 2] if name == "cca" else [0, 1, 2]   # the numpy CCA divides by the width: full-rank layers
        want = np.array([[fn(xa[i], b) for b in xb] for i in rows])
        assert_close(stored[name]["value"][rows], want, f"{name} vs the numpy reference", tol=tol)


def test_one_eigendecomposition_per_layer_serves_every_covariance_measure(monkeypatch):
    from simkit.metrics.streaming import features, stored

    calls = {"cov": 0, "samples": 0}
    real_cov, real_samples = features.spectrum_from_cov, stored.spectrum_from_samples

    def count_cov(*args, **kw):
        calls["cov"] += 1
        return real_cov(*args, **kw)

    def count_samples(*args, **kw):
        calls["samples"] += 1
        return real_samples(*args, **kw)

    monkeypatch.setattr(features, "spectrum_from_cov", count_cov)
    monkeypatch.setattr(stored, "spectrum_from_samples", count_samples)
    accumulate(COVARIANCE)
    assert calls == {"cov": len(XA) + len(XB), "samples": 0}
    accumulate(COVARIANCE, null=3)   # the null permutes B's bases: no layer is decomposed again
    assert calls == {"cov": len(XA) + len(XB), "samples": len(XA) + len(XB)}


@pytest.mark.parametrize("null", [0, 4])
def test_ridge_factorises_each_a_layer_once_per_fold_for_every_b_layer_and_draw(monkeypatch, null):
    made = []
    real = FoldSolver.__init__

    def counting(self, cxx, ridge_lambda):
        made.append(cxx.shape[0])
        real(self, cxx, ridge_lambda)

    monkeypatch.setattr(FoldSolver, "__init__", counting)
    out = accumulate(["ridge_r2"], stored=True, null=null)
    assert sorted(made) == sorted(x.shape[1] for x in XA for _ in range(OPTS["ridge_folds"]))
    if null:
        assert out["ridge_r2"]["null"].shape == (null, len(XA), len(XB))


def test_wide_layers_take_the_sample_space_and_agree_with_the_moments():
    assert sample_space_cheaper(N, 90, 4) and not sample_space_cheaper(N, 6, 4)
    y = centred(XB)
    dims_b = [t.shape[1] for t in XB]
    for lam in (0.0, 1e-3, 0.05, 1.0):
        for x in XA:
            moments = ridge_from_moments(fold_moments([x], XB, 4), [x.shape[1]], dims_b, lam)[0]
            sample = SampleFolds(centred([x]), 4, lam).r2(y, dims_b)
            assert_close(sample.numpy(), moments.numpy(), f"lambda={lam}, width {x.shape[1]}")


def test_cholesky_solve_agrees_with_the_eigendecomposition(monkeypatch):
    dims_b = [t.shape[1] for t in XB]
    moments = fold_moments(XA, XB, 4)
    dims_a = [x.shape[1] for x in XA]
    for lam in (1e-3, 0.05, 1.0):
        chol = ridge_from_moments(moments, dims_a, dims_b, lam)
        with monkeypatch.context() as patch:
            patch.setattr(predictivity, "CHOLESKY_MIN", float("inf"))   # every solve by the eigendecomposition
            eig = ridge_from_moments(moments, dims_a, dims_b, lam)
        assert_close(chol.numpy(), eig.numpy(), f"lambda={lam}")


def test_cholesky_is_used_only_with_a_ridge_large_enough():
    c = XA[1] - XA[1].mean(0)
    cov = c.T @ c                                     # rank 12 of 30
    assert FoldSolver(cov, 0.05).chol is not None
    assert FoldSolver(cov, 0.0).chol is None          # least squares: the pseudo-inverse on the rank
    assert FoldSolver(cov, 1e-9).chol is None         # condition number beyond 1/CHOLESKY_MIN


def test_average_ranks_with_ties_equal_scipy():
    from scipy.stats import rankdata

    v = torch.tensor(np.random.default_rng(0).integers(0, 7, size=500), dtype=torch.float64)
    np.testing.assert_array_equal(average_ranks(v).numpy(), rankdata(v.numpy()))
