"""The exact permutation mean, variance and third cumulant of ``t = ⟨A, B_π⟩ = Σ_ij A_ij B_π(i)π(j)``.

A and B are symmetric ``m × m`` matrices whose rows sum to zero: the centred Grams ``HKH`` of linear and
RBF CKA (the RV coefficient's operators) and the U-centred Grams of unbiased CKA (diagonal zero, rows
summing to zero). π is a uniform random permutation of B's samples. Kazi-Aoual, Hitier, Sabatier &
Lebreton (1995, "Refined approximations to permutation tests for multivariate inference", Comput. Stat.
Data Anal. 20:643–656) give the first three moments from eight traces of each matrix; FactoMineR's
``coeffRV`` (Josse, Pagès & Husson 2008, "Testing the significance of the RV coefficient", Comput. Stat.
Data Anal. 53:82–91) uses them to fit a Pearson type III distribution. The formulas hold for any symmetric
matrices with zero row sums (``tests/engine/test_p_values.py`` checks them against every permutation of a
small sample for all three kinds).

Per matrix (:func:`matrix_traces`, :data:`TRACES`): ``T = tr A``, ``T2 = tr A²``, ``T3 = tr A³``,
``S2 = Σ d²``, ``S3 = Σ d³`` (d the diagonal), ``U = Σ_ij A_ij³``, ``B = dᵀAd``, ``R = Σ_i d_i (A²)_ii``.
:func:`cumulants` turns the traces of every layer of A and of B into the three cumulants of every pair;
below six samples (where the formulas' denominators vanish) :func:`enumerated_cumulants` takes them over
every permutation. Cumulants add over independent sums, so a minibatch statistic (a sum of per-batch
terms, each batch permuted on its own) gets its cumulants as sums over batches.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

#: the traces of one matrix, in the order of :func:`matrix_traces`' last axis
TRACES = ("T", "T2", "T3", "S2", "S3", "U", "B", "R")
#: below this many samples the cumulants are taken over every permutation
FEWEST_FOR_FORMULAS = 6


def matrix_traces(w: Tensor) -> Tensor:
    """The :data:`TRACES` of each symmetric matrix of ``w (L, m, m)``: ``(L, 8)`` float64."""
    w = w.double()
    d = torch.diagonal(w, dim1=-2, dim2=-1)
    squares = (w * w).sum(-1)                                   # (A²)_ii per row
    cube = ((w @ w) * w).sum((-2, -1))
    b = torch.einsum("li,lij,lj->l", d, w, d)
    return torch.stack([d.sum(-1), squares.sum(-1), cube, (d * d).sum(-1), (d ** 3).sum(-1),
                        (w ** 3).sum((-2, -1)), b, (d * squares).sum(-1)], -1)


def block_traces(rows: Tensor, diag_rows: Tensor, diag: Tensor) -> Tensor:
    """The traces of each matrix that rows ``rows (L, r, m)`` (rows ``idx`` of every layer's matrix, whose
    diagonal entries are ``diag_rows (L, r)``; the whole diagonal ``diag (L, m)``) add, except ``T3``
    (left 0: :func:`matrix_traces` or a factorised form gives it): ``(L, 8)`` float64, summed over blocks."""
    squares = (rows * rows).sum(-1)
    b = (diag_rows * (rows @ diag[..., None])[..., 0]).sum(-1)
    zero = torch.zeros_like(b)
    return torch.stack([diag_rows.sum(-1), squares.sum(-1), zero, (diag_rows ** 2).sum(-1),
                        (diag_rows ** 3).sum(-1), (rows ** 3).sum((-2, -1)), b, (diag_rows * squares).sum(-1)], -1)


_S3, _U, _B, _R, _TS2, _TC, _TT2, _T3 = range(8)
#: the third-moment coefficients: (feature of A, feature of B, polynomial in n), each term added to both
#: (a, b) and (b, a) (the formula is symmetric in A and B); features as in :func:`_features`
_TERMS = (
    (_S3, _S3, lambda n: n**2 * (n + 1) * (n**2 + 15 * n - 4) / 2),
    (_U, _U, lambda n: 2 * (n**4 - 8 * n**3 + 19 * n**2 - 4 * n - 16)),
    (_U, _B, lambda n: 24 * (n**2 - n - 4)),
    (_B, _B, lambda n: 3 * (n**4 - 8 * n**3 + 21 * n**2 - 6 * n - 24)),
    (_R, _R, lambda n: 6 * (n**4 - n**3 - 8 * n**2 + 36 * n - 48)),
    (_TS2, _R, lambda n: 12 * (n**3 - 2 * n**2 + 9 * n - 12)),
    (_TS2, _TS2, lambda n: 1.5 * (n**4 - 4 * n**3 - 2 * n**2 + 9 * n - 12)),
    (_R, _U, lambda n: 24 * (n**3 - 3 * n**2 - 2 * n + 8)),
    (_R, _B, lambda n: 24 * (n**3 - 2 * n**2 - 3 * n + 12)),
    (_TS2, _U, lambda n: 12 * (n**2 - n + 4)),
    (_TS2, _B, lambda n: 6 * (2 * n**3 - 7 * n**2 - 3 * n + 12)),
    (_U, _S3, lambda n: -4 * n * (n - 1) * (n**2 - n + 4)),
    (_B, _S3, lambda n: -6 * n * (n - 1) * (n**2 - n + 4)),
    (_TS2, _S3, lambda n: -3 * n * (n - 1) ** 2 * (n + 4)),
    (_R, _S3, lambda n: -12 * n * (n - 1) ** 2 * (n + 4)),
    (_TC, _S3, lambda n: 2 * n * (n - 1) * (n - 2)),
    (_TT2, _S3, lambda n: 12 * n * (n - 1) * (n - 2)),
    (_T3, _S3, lambda n: 16 * n * (n - 1) * (n - 2)),
    (_TC, _TC, lambda n: (n**3 - 9 * n**2 + 23 * n - 14) / 2),
    (_TC, _TT2, lambda n: 6 * (n - 4)),
    (_TC, _T3, lambda n: 8.0),
    (_TT2, _TT2, lambda n: 3 * (n**3 - 9 * n**2 + 24 * n - 14)),
    (_TT2, _T3, lambda n: 24 * (n - 3)),
    (_T3, _T3, lambda n: 4 * (n**3 - 9 * n**2 + 26 * n - 22)),
    (_TC, _U, lambda n: -16.0),
    (_TT2, _U, lambda n: -6 * (2 * n**2 - 10 * n + 16)),
    (_T3, _U, lambda n: -8 * (3 * n**2 - 15 * n + 16)),
    (_TC, _B, lambda n: -(6 * n**2 - 30 * n + 24)),
    (_TT2, _B, lambda n: -6 * (4 * n**2 - 20 * n + 24)),
    (_T3, _B, lambda n: -8 * (3 * n**2 - 15 * n + 24)),
    (_TC, _R, lambda n: -24 * (n - 2)),
    (_TT2, _R, lambda n: -6 * (n - 2) * (2 * n**2 - 10 * n + 24)),
    (_T3, _R, lambda n: -8 * (n - 2) * (3 * n**2 - 15 * n + 24)),
    (_TC, _TS2, lambda n: -(n - 2) * (3 * n**2 - 15 * n + 6)),
    (_TT2, _TS2, lambda n: -6 * (n - 2) * (n**2 - 5 * n + 6)),
    (_T3, _TS2, lambda n: -48 * (n - 2)),
)


def third_moment_matrix(n: int, device: torch.device | str = "cpu") -> Tensor:
    """``M (8, 8)`` with ``E t³ = f_Aᵀ M f_B / (n(n−1)(n−2)(n−3)(n−4)(n−5))`` (:func:`_features`), the
    polynomial of Kazi-Aoual et al. as FactoMineR's ``coeffRV`` writes it."""
    m = torch.zeros(8, 8, dtype=torch.float64)
    x = float(n)
    for a, b, coefficient in _TERMS:
        value = coefficient(x)
        m[a, b] += value
        m[b, a] += value
    return m.to(device)


def _features(t: Tensor) -> Tensor:
    """The third moment's features of each matrix from its traces ``(L, 8)``: ``S3, U, B, R, T·S2, T³,
    T·T2, T3``."""
    tr, t2, t3, s2, s3, u, b, r = t.unbind(-1)
    return torch.stack([s3, u, b, r, tr * s2, tr ** 3, tr * t2, t3], -1)


def _unit(t: Tensor) -> tuple[Tensor, Tensor]:
    """Traces of each matrix scaled to unit Frobenius norm (``A / ‖A‖``: a trace of degree k divided by
    ``‖A‖^k``), and the norms (1 for a zero matrix): the cumulants are formed at scale 1, where their
    differences lose no digits to the matrices' magnitude."""
    norm = torch.sqrt(t[..., 1])
    norm = torch.where(norm > 0, norm, torch.ones_like(norm))
    degree = torch.tensor([1, 2, 3, 2, 3, 3, 3, 3], dtype=torch.float64, device=t.device)
    return t / norm[..., None] ** degree, norm


def cumulants(traces_a: Tensor, traces_b: Tensor, n: int) -> Tensor:
    """The permutation mean, variance and third cumulant of ``⟨A_i, B_j,π⟩`` for every layer pair:
    ``(3, La, Lb)`` float64 from each layer's traces ``(La, 8)``, ``(Lb, 8)`` on ``n ≥ 6`` samples."""
    ta, norm_a = _unit(traces_a.double())
    tb, norm_b = _unit(traces_b.double())
    x = float(n)
    tr_a, t2_a, s2_a = ta[:, 0], ta[:, 1], ta[:, 3]
    tr_b, t2_b, s2_b = tb[:, 0], tb[:, 1], tb[:, 3]
    mean = torch.outer(tr_a, tr_b) / (x - 1)
    spread = torch.outer((x - 1) * t2_a - tr_a**2, (x - 1) * t2_b - tr_b**2)
    diag = torch.outer(x * (x + 1) * s2_a - (x - 1) * (tr_a**2 + 2 * t2_a),
                       x * (x + 1) * s2_b - (x - 1) * (tr_b**2 + 2 * t2_b))
    var = (2 * spread / ((x - 1) ** 2 * (x + 1) * (x - 2))
           + diag / ((x + 1) * x * (x - 1) * (x - 2) * (x - 3)))
    falling = x * (x - 1) * (x - 2) * (x - 3) * (x - 4) * (x - 5)
    third = _features(ta) @ third_moment_matrix(n, ta.device) @ _features(tb).T / falling
    k3 = third - 3 * mean * var - mean**3
    scale = torch.outer(norm_a, norm_b)
    return torch.stack([mean * scale, var * scale**2, k3 * scale**3])


def enumerated_cumulants(fa: Tensor, fb: Tensor) -> Tensor:
    """The three cumulants ``(3, La, Lb)`` of ``⟨fa_i, fb_j,π⟩`` over every permutation π of ``m < 6``
    samples (at most 120), for matrices ``fa (La, m, m)``, ``fb (Lb, m, m)``."""
    la, lb, m = fa.shape[0], fb.shape[0], fa.shape[-1]
    perms = torch.tensor(list(itertools.permutations(range(m))), device=fa.device)
    permuted = fb.double()[:, perms[:, :, None], perms[:, None, :]]           # (Lb, P, m, m)
    t = (fa.double().reshape(la, m * m) @ permuted.reshape(-1, m * m).T).reshape(la, lb, -1)
    mean = t.mean(-1)
    centred = t - mean[..., None]
    return torch.stack([mean, (centred**2).mean(-1), (centred**3).mean(-1)])


def pair_cumulants(fa: Tensor, fb: Tensor) -> Tensor:
    """The permutation cumulants ``(3, La, Lb)`` of every pair of the matrices ``fa (La, m, m)``,
    ``fb (Lb, m, m)`` (one batch's centred or U-centred Grams)."""
    if fa.shape[-1] < FEWEST_FOR_FORMULAS:
        return enumerated_cumulants(fa, fb)
    return cumulants(matrix_traces(fa), matrix_traces(fb), fa.shape[-1])
