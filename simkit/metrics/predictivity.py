"""Linear predictivity ``ridge_r2``: how well a ridge regression on X predicts Y, cross-validated.

``ridge_r2(x, y)`` for ``x (n, p)``, ``y (n, q)``: sample ``i`` is in fold ``i mod k`` (``ridge_folds``);
for each fold the ridge map ``W = (C_xx + λ' I)^{-1} C_xy`` is fitted on the other folds (columns centred
on the training means, ``λ' = ridge_lambda · tr(C_xx) / p``, relative to the mean eigenvalue so the value
is invariant to isotropic scaling of X; ``ridge_lambda = 0`` is least squares with the pseudo-inverse on
the numerical rank of the training covariance, by the one rule of every path:
:func:`~simkit.metrics._checks.rank_rtol` of X's width, float64's epsilon), and the held-out fold is
predicted. The value pools the folds::

    R² = 1 − Σ_f Σ_{i∈f} ‖(y_i − ȳ₋f) − (x_i − x̄₋f) W₋f‖² / Σ_f Σ_{i∈f} ‖y_i − ȳ₋f‖²

(summed over Y's columns: a variance-weighted R², 1 for a perfect prediction, 0 for the training mean,
negative when worse). Directional: ``ridge_r2(x, y) ≠ ridge_r2(y, x)``; an all-pairs matrix has rows
predicting columns.

Everything comes from per-fold first and second moments (:class:`FoldMoments`: counts, ``Σx``, ``Σy``,
per-layer ``Σxxᵀ``, ``Σxyᵀ``, ``Σ‖y‖²`` per layer) taken about any common reference, so the streaming
accumulator adds them batch by batch (:func:`ridge_from_moments` is the one estimator). Each fold's
training covariance is factorised once (:class:`FoldSolver`: Cholesky with a ridge, the eigendecomposition
without) and serves every B layer; on stored samples a wide A layer is fitted in sample space instead
(:class:`SampleFolds`, the same estimator at ``n_f · n_t`` instead of ``3 d²`` multiply-adds per fold and B
feature), and the factorisations serve every permutation of a null too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from simkit.errors import SimkitError
from simkit.metrics._checks import as_matrix, check_same_n, is_constant, rank_mask, warn_undefined
from simkit.metrics.settings import check_setting

#: the smallest ridge, relative to the trace of the training covariance, that :class:`FoldSolver` inverts by a
#: Cholesky factor (condition number at most 1 + 1/CHOLESKY_MIN); below it, and without a ridge, by its
#: eigendecomposition
CHOLESKY_MIN = 1e-6


@dataclass
class FoldMoments:
    """Per-fold moments about a common reference (float64): n ``(k,)``, sx ``(k, P)``, sy ``(k, Q)``,
    sxx ``(k, Σp_i²)`` (each A layer's ``Σxxᵀ`` block, flattened), sxy ``(k, P, Q)``, tyy ``(k, L_b)``."""

    n: Tensor
    sx: Tensor
    sy: Tensor
    sxx: Tensor
    sxy: Tensor
    tyy: Tensor


def _segsum_cols(t: Tensor, dims: Sequence[int]) -> Tensor:
    """Sum the last axis of ``t`` over consecutive groups of widths ``dims`` → ``(..., len(dims))``."""
    return torch.stack([part.sum(-1) for part in torch.split(t, list(dims), dim=-1)], -1)


def check_fold_samples(n: int, folds: int) -> None:
    """Raise unless every fold has a sample and every training set at least two."""
    if n < 2 * folds:
        raise SimkitError(f"ridge_r2 with `ridge_folds`={folds} needs at least {2 * folds} samples, got {n}; "
                          "use more samples or fewer folds")


def fold_moments(xs: Sequence[Tensor], ys: Sequence[Tensor], folds: int, offset: int = 0) -> FoldMoments:
    """:class:`FoldMoments` of stored layers ``xs [(n, p_i)]``, ``ys [(n, q_j)]`` in float64 about their
    global means; row ``r`` is sample ``offset + r`` (fold ``(offset + r) mod folds``)."""
    return centred_fold_moments(centred(xs), centred(ys), [t.shape[1] for t in xs], [t.shape[1] for t in ys],
                                folds, offset)


def centred(xs: Sequence[Tensor]) -> Tensor:
    """Layers ``[(n, p_i)]`` concatenated in float64 and centred on their global means: ``(n, Σp_i)``."""
    x = torch.cat([t.double() for t in xs], 1)
    return x - x.mean(0)


def centred_fold_moments(x: Tensor, y: Tensor, dims_a: Sequence[int], dims_b: Sequence[int], folds: int,
                         offset: int = 0) -> FoldMoments:
    """:func:`fold_moments` of already concatenated, centred float64 samples ``x (n, P)``, ``y (n, Q)``
    (:func:`centred`: one copy of B's layers serves every A layer and every permutation of a null)."""
    fold = (offset + torch.arange(len(x), device=x.device)) % folds
    out = []
    for f in range(folds):
        rows = torch.nonzero(fold == f).flatten()
        xf, yf = x[rows], y[rows]
        blocks = torch.cat([(b.T @ b).flatten() for b in torch.split(xf, list(dims_a), 1)])
        out.append((torch.tensor(float(len(rows)), dtype=torch.float64, device=x.device), xf.sum(0), yf.sum(0),
                    blocks, xf.T @ yf, _segsum_cols(yf * yf, dims_b).sum(0)))
    return FoldMoments(*(torch.stack(list(parts)) for parts in zip(*out, strict=True)))


class FoldSolver:
    """``(C + λ'I)⁻¹`` of one fold's training covariance ``C (d, d)`` (``λ' = ridge_lambda · tr(C) / d``), or
    with ``ridge_lambda = 0`` the pseudo-inverse on the numerical rank (:func:`~simkit.metrics._checks.rank_mask`
    of ``d``): factorised once, applied to any right-hand side (every B layer, every permutation of a null).

    With a ridge of at least :data:`CHOLESKY_MIN` of the trace the factor is a Cholesky factor (``d³/3``
    multiply-adds; the condition number is then at most ``1 + 1/CHOLESKY_MIN``, so the solve agrees with the
    eigendecomposition's to float64 rounding times that); otherwise (least squares, a tiny ridge, or a
    factorisation that fails) the eigendecomposition ``C = V diag(λ) Vᵀ``.
    """

    def __init__(self, cxx: Tensor, ridge_lambda: float):
        c = (cxx + cxx.T) / 2
        d = c.shape[0]
        trace = float(c.diagonal().sum())
        ridge = ridge_lambda * trace / d
        self.chol: Tensor | None = None
        if ridge > 0 and ridge >= CHOLESKY_MIN * trace:
            factor, info = torch.linalg.cholesky_ex(c + ridge * torch.eye(d, dtype=c.dtype, device=c.device))
            if int(info) == 0:
                self.chol = factor
                return
        lam, self.vec = torch.linalg.eigh(c)
        lam = lam.clamp_min(0.0)
        ridge = ridge_lambda * float(lam.sum()) / d
        if ridge > 0:
            self.inv = 1.0 / (lam + ridge)
        else:
            keep = rank_mask(lam, d)
            self.inv = torch.where(keep, 1.0 / torch.where(keep, lam, torch.ones_like(lam)), torch.zeros_like(lam))

    def solve(self, rhs: Tensor) -> Tensor:
        """``(C + λ'I)⁻¹ rhs`` (or ``C⁺ rhs``) for ``rhs (d, k)``."""
        if self.chol is not None:
            return torch.cholesky_solve(rhs, self.chol)
        return self.vec @ (self.inv[:, None] * (self.vec.T @ rhs))


def _train_cov(m: FoldMoments, f: int, dims_a: Sequence[int]) -> list[tuple[Tensor, Tensor]]:
    """Per A layer, fold ``f``'s training covariance (about the training mean) and held-out second moment
    (about the training mean), both ``(d, d)``, from the moments."""
    total_n, total_sx, total_sxx = m.n.sum(), m.sx.sum(0), m.sxx.sum(0)
    nf = m.n[f]
    nt = total_n - nf
    mux = (total_sx - m.sx[f]) / nt
    out = []
    start = off = 0
    for d in dims_a:
        u, s = mux[start:start + d], m.sx[f, start:start + d]
        block_all = total_sxx[off:off + d * d].view(d, d)
        block_f = m.sxx[f, off:off + d * d].view(d, d)
        out.append((block_all - block_f - nt * torch.outer(u, u),
                    block_f - torch.outer(s, u) - torch.outer(u, s) + nf * torch.outer(u, u)))
        start, off = start + d, off + d * d
    return out


def fold_solvers(m: FoldMoments, dims_a: Sequence[int], ridge_lambda: float) -> list[list[FoldSolver]]:
    """``[fold][A layer]`` :class:`FoldSolver` of the training covariances: they depend on A's samples only,
    so permutations of B's samples (a null) reuse them (:func:`ridge_from_moments`'s ``solvers``)."""
    return [[FoldSolver(cxx, ridge_lambda) for cxx, _ in _train_cov(m, f, dims_a)] for f in range(len(m.n))]


def ridge_from_moments(m: FoldMoments, dims_a: Sequence[int], dims_b: Sequence[int], ridge_lambda: float,
                       solvers: list[list[FoldSolver]] | None = None) -> Tensor:
    """Cross-validated ridge R² of every B layer from every A layer: ``(L_a, L_b)`` float64 (module docstring).

    One factorisation per A layer and fold (:class:`FoldSolver`), shared by all B layers; ``solvers``: those of
    :func:`fold_solvers` for the same A samples (e.g. the unpermuted moments of a null), None: made here. With
    ``ridge_lambda = 0`` the pseudo-inverse keeps the eigenvalues of the numerical rank, each A layer by its
    own width (:func:`~simkit.metrics._checks.rank_mask`). A B layer without held-out variance is NaN.
    """
    la, lb = len(dims_a), len(dims_b)
    dev = m.sx.device
    total_n, total_sx, total_sy = m.n.sum(), m.sx.sum(0), m.sy.sum(0)
    total_sxy = m.sxy.sum(0)
    sse = torch.zeros(la, lb, dtype=torch.float64, device=dev)
    sst = torch.zeros(lb, dtype=torch.float64, device=dev)
    for f in range(len(m.n)):
        nf = m.n[f]
        nt = total_n - nf
        mux, muy = (total_sx - m.sx[f]) / nt, (total_sy - m.sy[f]) / nt
        sx_f, sy_f = m.sx[f], m.sy[f]
        ty_test = m.tyy[f] - 2 * _segsum_cols(muy * sy_f, dims_b) + nf * _segsum_cols(muy * muy, dims_b)
        sst += ty_test
        cxy_train = total_sxy - m.sxy[f] - nt * torch.outer(mux, muy)
        sxy_test = m.sxy[f] - torch.outer(sx_f, muy) - torch.outer(mux, sy_f) + nf * torch.outer(mux, muy)
        start = 0
        for i, (d, (cxx, test_xx)) in enumerate(zip(dims_a, _train_cov(m, f, dims_a), strict=True)):
            rows = slice(start, start + d)
            solver = solvers[f][i] if solvers is not None else FoldSolver(cxx, ridge_lambda)
            w = solver.solve(cxy_train[rows])                               # (d, Q): all B layers at once
            fit = _segsum_cols((w * sxy_test[rows]).sum(0), dims_b)
            spread = _segsum_cols((w * (test_xx @ w)).sum(0), dims_b)
            sse[i] += ty_test - 2 * fit + spread
            start += d
    return _r2(sse, sst)


def _r2(sse: Tensor, sst: Tensor) -> Tensor:
    """``1 − sse / sst`` per B layer (columns), NaN where a B layer has no held-out variance."""
    ok = sst > 0
    return torch.where(ok[None, :], 1 - sse / torch.where(ok, sst, torch.ones_like(sst))[None, :],
                       torch.full_like(sse, float("nan")))


def sample_space_cheaper(n: int, width: int, folds: int) -> bool:
    """True when :class:`SampleFolds` costs fewer multiply-adds than the moments for an A layer of ``width``
    features: per fold and B feature ``n_f · n_t`` (held-out predictions from the training targets) against
    ``3 d²`` (solve, fit and spread of :func:`ridge_from_moments`)."""
    held = n / folds
    return held * (n - held) < 3 * width * width


class SampleFolds:
    """One A layer's cross-validated ridge in sample space, for stored samples and a wide layer
    (:func:`sample_space_cheaper`): per fold the map ``M_f = X̃_te (C + λ'I)⁻¹ X̃_trᵀ`` ``(n_f, n_t)`` (columns
    centred on the training mean, :class:`FoldSolver`) sends the training targets to the held-out
    predictions (``X̃_trᵀ Ỹ_tr = X̃_trᵀ Y_tr``). Built once from A's samples, applied to any targets: B's
    samples and every permutation of them (a null). The same estimator as :func:`ridge_from_moments`; the
    residuals are summed directly instead of expanded."""

    def __init__(self, x: Tensor, folds: int, ridge_lambda: float, offset: int = 0):
        fold = (offset + torch.arange(len(x), device=x.device)) % folds
        self.maps: list[tuple[Tensor, Tensor, Tensor]] = []
        for f in range(folds):
            test, train = torch.nonzero(fold == f).flatten(), torch.nonzero(fold != f).flatten()
            xtr = x[train]
            mux = xtr.mean(0)
            xtr = xtr - mux
            solver = FoldSolver(xtr.T @ xtr, ridge_lambda)
            self.maps.append((test, train, solver.solve((x[test] - mux).T).T @ xtr.T))

    def r2(self, y: Tensor, dims_b: Sequence[int]) -> Tensor:
        """R² ``(L_b,)`` of the B layers ``y (n, Q)`` (float64, concatenated) from this A layer."""
        sse = torch.zeros(1, len(dims_b), dtype=torch.float64, device=y.device)
        sst = torch.zeros(len(dims_b), dtype=torch.float64, device=y.device)
        for test, train, held in self.maps:
            ytr = y[train]
            muy = ytr.mean(0)
            yte = y[test] - muy
            resid = yte - held @ (ytr - muy)
            sse[0] += _segsum_cols((resid * resid).sum(0), dims_b)
            sst += _segsum_cols((yte * yte).sum(0), dims_b)
        return _r2(sse, sst)[0]


def residual_form(x: Tensor | None, n: int, folds: int, ridge_lambda: float) -> Tensor:
    """The ``(n, n)`` form ``Q = Σ_f O_fᵀ O_f`` of one A layer's held-out residuals: for any targets ``Y (n, q)``
    the summed squared residuals of :class:`SampleFolds` are ``⟨Q, Y Yᵀ⟩`` (``O_f Y`` the residuals of fold
    ``f``: ``O_f = S_te − (H_f C_tr + 11ᵀ/n_t) S_tr``, ``H_f`` its held-out map, ``C_tr`` the training
    centring). So a permutation of the targets' samples, ``⟨Q, Y[π]Y[π]ᵀ⟩``, only re-indexes B's Gram.
    ``x (n, d)`` centred float64; None: the training means alone (``H_f = 0``), whose form gives the held-out
    variance ``Σ_f ‖Y_te − ȳ_tr‖²``."""
    dev = x.device if x is not None else None
    out = torch.zeros(n, n, dtype=torch.float64, device=dev)
    maps: list[tuple[Tensor, Tensor, Tensor | None]]
    if x is not None:
        maps = list(SampleFolds(x, folds, ridge_lambda).maps)
    else:
        fold = torch.arange(n, device=dev) % folds
        maps = [(torch.nonzero(fold == f).flatten(), torch.nonzero(fold != f).flatten(), None) for f in range(folds)]
    for test, train, held in maps:
        o = torch.zeros(len(test), n, dtype=torch.float64, device=dev)
        o[torch.arange(len(test), device=dev), test] = 1.0
        spread = torch.full((len(test), len(train)), 1.0 / len(train), dtype=torch.float64, device=dev)
        if held is not None:
            spread += held - held.sum(1, keepdim=True) / len(train)
        o[:, train] = -spread
        out.addmm_(o.T, o)
    return out


def ridge_r2(x, y, ridge_lambda: float = 1e-2, ridge_folds: int = 5) -> float:
    """Cross-validated linear predictivity of ``y (n, q)`` from ``x (n, p)`` (module docstring): R² ≤ 1.

    Directional (``ridge_r2(x, y) ≠ ridge_r2(y, x)``). NaN + warning for a constant input.
    """
    lam, folds = check_setting("ridge_lambda", ridge_lambda), check_setting("ridge_folds", ridge_folds)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    if xt.dim() >= 1 and yt.dim() >= 1:
        check_same_n(xt.shape[0], yt.shape[0])
    xt, yt = as_matrix(xt, "x"), as_matrix(yt, "y")
    check_fold_samples(len(xt), folds)
    for name, t in (("x", xt), ("y", yt)):
        if is_constant(t):
            warn_undefined(f"{name} is constant: every example has the same activation", 3, "ridge_r2")
            return float("nan")
    moments = fold_moments([xt], [yt], folds)
    return float(ridge_from_moments(moments, [xt.shape[1]], [yt.shape[1]], lam)[0, 0])
