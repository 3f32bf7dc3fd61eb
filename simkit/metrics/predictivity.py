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
accumulator adds them batch by batch (:func:`ridge_from_moments` is the one estimator).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from simkit.errors import SimkitError
from simkit.metrics._checks import as_matrix, check_same_n, is_constant, rank_mask, warn_undefined
from simkit.metrics.settings import check_folds, check_lambda


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
    x = torch.cat([t.double() for t in xs], 1)
    y = torch.cat([t.double() for t in ys], 1)
    x, y = x - x.mean(0), y - y.mean(0)
    dims_a = [t.shape[1] for t in xs]
    dims_b = [t.shape[1] for t in ys]
    fold = (offset + torch.arange(len(x), device=x.device)) % folds
    out = []
    for f in range(folds):
        rows = torch.nonzero(fold == f).flatten()
        xf, yf = x[rows], y[rows]
        blocks = torch.cat([(b.T @ b).flatten() for b in torch.split(xf, dims_a, 1)])
        out.append((torch.tensor(float(len(rows)), dtype=torch.float64, device=x.device), xf.sum(0), yf.sum(0),
                    blocks, xf.T @ yf, _segsum_cols(yf * yf, dims_b).sum(0)))
    return FoldMoments(*(torch.stack(list(parts)) for parts in zip(*out, strict=True)))


def ridge_from_moments(m: FoldMoments, dims_a: Sequence[int], dims_b: Sequence[int], ridge_lambda: float,
                       ) -> Tensor:
    """Cross-validated ridge R² of every B layer from every A layer: ``(L_a, L_b)`` float64 (module docstring).

    One eigendecomposition per A layer and fold, shared by all B layers. With ``ridge_lambda = 0`` the
    pseudo-inverse keeps the eigenvalues of the numerical rank, each A layer by its own width
    (:func:`~simkit.metrics._checks.rank_mask`). A B layer without held-out variance is NaN.
    """
    la, lb = len(dims_a), len(dims_b)
    dev = m.sx.device
    total_n, total_sx, total_sy = m.n.sum(), m.sx.sum(0), m.sy.sum(0)
    total_sxx, total_sxy = m.sxx.sum(0), m.sxy.sum(0)
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
        start = off = 0
        for i, d in enumerate(dims_a):
            rows = slice(start, start + d)
            u, s = mux[rows], sx_f[rows]
            block_all = total_sxx[off:off + d * d].view(d, d)
            block_f = m.sxx[f, off:off + d * d].view(d, d)
            cxx = block_all - block_f - nt * torch.outer(u, u)
            test_xx = block_f - torch.outer(s, u) - torch.outer(u, s) + nf * torch.outer(u, u)
            lam, vec = torch.linalg.eigh((cxx + cxx.T) / 2)
            lam = lam.clamp_min(0.0)
            ridge = ridge_lambda * float(lam.sum()) / d
            if ridge > 0:
                inv = 1.0 / (lam + ridge)
            else:
                keep = rank_mask(lam, d)
                inv = torch.where(keep, 1.0 / torch.where(keep, lam, torch.ones_like(lam)), torch.zeros_like(lam))
            w = vec @ (inv[:, None] * (vec.T @ cxy_train[rows]))          # (d, Q): all B layers at once
            fit = _segsum_cols((w * sxy_test[rows]).sum(0), dims_b)
            spread = _segsum_cols((w * (test_xx @ w)).sum(0), dims_b)
            sse[i] += ty_test - 2 * fit + spread
            start, off = start + d, off + d * d
    ok = sst > 0
    return torch.where(ok[None, :], 1 - sse / torch.where(ok, sst, torch.ones_like(sst))[None, :],
                       torch.full_like(sse, float("nan")))


def ridge_r2(x, y, ridge_lambda: float = 1e-2, ridge_folds: int = 5) -> float:
    """Cross-validated linear predictivity of ``y (n, q)`` from ``x (n, p)`` (module docstring): R² ≤ 1.

    Directional (``ridge_r2(x, y) ≠ ridge_r2(y, x)``). NaN + warning for a constant input.
    """
    lam, folds = check_lambda(ridge_lambda), check_folds(ridge_folds)
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
