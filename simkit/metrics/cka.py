"""The CKA family: Gram matrices, centering, HSIC estimators and CKA (spec §0.1, §0.2).

Conventions: activations ``x (n, p)`` and ``y (n, q)`` hold the same ``n`` examples in the same order
(conv maps are flattened by the caller). Public metric functions cast to float64, check their input
(:class:`SimkitError` for mismatched ``n``, too few samples, NaN/Inf) and return a Python float. CKA of
a constant activation is undefined: NaN plus a ``RuntimeWarning`` (the engine adds the layer name).

Building blocks, public because the streaming accumulators (``streaming.py``) reuse them:

* Gram side: :func:`gram_linear`, :func:`gram_rbf`, :func:`median_distance`, :func:`center_gram`
  (``HKH``), :func:`u_center_gram` (Song et al.'s U-centering), :func:`hsic_biased`,
  :func:`hsic_unbiased`.
* Feature side (cheaper when ``p·q < n²``): :func:`gram_fro_sq`, :func:`hsic1_from_terms`,
  :func:`linear_hsic_biased_features`, :func:`linear_hsic_unbiased_features`.
* Tensor cores without checks, differentiable, in the input dtype (the losses use them):
  :func:`linear_cka_tensor`, :func:`unbiased_cka_tensor`; and :func:`cka_ratio`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from simkit.errors import SimkitError
from simkit.metrics._checks import (
    as_matrix,
    check_min_n,
    check_positive,
    check_same_n,
    exact_quantile,
    is_constant,
    warn_undefined,
)

FORMS = ("auto", "features", "gram")

# ---------------------------------------------------------------------------------------------- Grams


def gram_linear(x: Tensor) -> Tensor:
    """Linear kernel ``K = x xᵀ``: ``x (n, p)`` → ``(n, n)`` in ``x``'s dtype."""
    return x @ x.T


def _sq_distances(x: Tensor) -> Tensor:
    """Squared Euclidean distances ``(n, n)`` between the rows of ``x (n, p)``, exact zeros on the diagonal."""
    sq = (x * x).sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)).clamp_min(0.0)
    return d2 * (1.0 - torch.eye(len(x), dtype=x.dtype, device=x.device))


def median_distance(x: Tensor) -> Tensor:
    """Median Euclidean distance over the ``n(n−1)/2`` pairs ``i < j`` of rows of ``x (n, p)``.

    The diagonal (zero self-distances) is excluded; with an even number of pairs the two middle values
    are averaged (numpy's ``median``). Returns a 0-d tensor.
    """
    n = len(x)
    if n < 2:
        raise SimkitError(f"a median pairwise distance needs at least 2 samples, got {n}")
    iu = torch.triu_indices(n, n, offset=1, device=x.device)
    d = _sq_distances(x)[iu[0], iu[1]].sqrt()
    return exact_quantile(d, 0.5)


def gram_rbf(x: Tensor, factor: float = 1.0, sigma: float | None = None) -> Tensor:
    """RBF kernel ``K_ij = exp(−‖x_i − x_j‖² / (2σ²))`` for ``x (n, p)`` → ``(n, n)``.

    ``σ = factor · median pairwise distance`` (diagonal excluded) unless ``sigma`` is given. A zero
    bandwidth (more than half of the pairs are duplicates) raises: pass ``sigma`` explicitly.
    """
    check_positive(factor, "factor")
    if sigma is None:
        sigma_t = factor * median_distance(x)
        if not bool(sigma_t > 0):
            raise SimkitError(
                "RBF bandwidth is 0: the median pairwise distance is 0 (most samples are duplicates); "
                "pass sigma= explicitly or use linear CKA"
            )
    else:
        check_positive(sigma, "sigma")
        sigma_t = torch.as_tensor(float(sigma), dtype=x.dtype, device=x.device)
    return torch.exp(-_sq_distances(x) / (2.0 * sigma_t * sigma_t))


# ------------------------------------------------------------------------------------------ centering


def center_gram(k: Tensor) -> Tensor:
    """``H K H`` with ``H = I − 11ᵀ/n`` for ``k (..., n, n)`` (leading batch axes allowed)."""
    row = k.mean(-1, keepdim=True)
    col = k.mean(-2, keepdim=True)
    return k - row - col + k.mean((-2, -1), keepdim=True)


def u_center_gram(k: Tensor) -> Tensor:
    """Song et al.'s U-centering of a symmetric ``k (..., n, n)``, ``n ≥ 4`` (spec §0.2).

    Diagonal zeroed, ``m = colsum / (n−2)``, ``m −= Σm / (2(n−1))``, ``G = K̃ − m_i − m_j``, diagonal
    zeroed again; so that ``⟨U(K), U(L)⟩_F = n(n−3)·HSIC_1(K, L)``. Out of place (differentiable).
    """
    n = k.shape[-1]
    check_min_n(n, 4, "U-centering (unbiased HSIC)")
    off = 1.0 - torch.eye(n, dtype=k.dtype, device=k.device)
    g = k * off
    m = g.sum(-2) / (n - 2)
    m = m - m.sum(-1, keepdim=True) / (2 * (n - 1))
    return (g - m[..., :, None] - m[..., None, :]) * off


def _check_grams(K: Tensor, L: Tensor) -> int:
    if K.dim() < 2 or K.shape[-1] != K.shape[-2] or L.dim() < 2 or L.shape[-1] != L.shape[-2]:
        raise SimkitError(
            f"Gram matrices must be square (n, n), got {tuple(K.shape)} and {tuple(L.shape)}"
        )
    check_same_n(K.shape[-1], L.shape[-1])
    return K.shape[-1]


def hsic_biased(K: Tensor, L: Tensor) -> Tensor:
    """Biased HSIC ``tr(KHLH) / (n−1)²`` of Grams ``(..., n, n)``, ``n ≥ 2`` → ``(...)``."""
    n = _check_grams(K, L)
    check_min_n(n, 2, "biased HSIC")
    return (center_gram(K) * L).sum((-2, -1)) / (n - 1) ** 2


def hsic_unbiased(K: Tensor, L: Tensor) -> Tensor:
    """Unbiased HSIC_1 (Song et al. 2012) of Grams ``(..., n, n)``, ``n ≥ 4`` → ``(...)``.

    ``⟨U(K), U(L)⟩_F / (n(n−3))``, equal to the explicit trace formula of spec §0.2.
    """
    n = _check_grams(K, L)
    check_min_n(n, 4, "unbiased HSIC")
    return (u_center_gram(K) * u_center_gram(L)).sum((-2, -1)) / (n * (n - 3))


def hsic1_from_terms(n: int, tr_kl: Tensor, sum_k: Tensor, sum_l: Tensor, ones_kl_ones: Tensor) -> Tensor:
    """HSIC_1 from its four sufficient terms (K̃, L̃ = Grams with zero diagonal), ``n ≥ 4``:

    ``[tr(K̃L̃) + (1ᵀK̃1)(1ᵀL̃1)/((n−1)(n−2)) − 2/(n−2)·1ᵀK̃L̃1] / (n(n−3))``. Any shapes that broadcast.
    """
    check_min_n(n, 4, "unbiased HSIC")
    return (tr_kl + sum_k * sum_l / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * ones_kl_ones) / (n * (n - 3))


# ------------------------------------------------------------------------------------- feature side


def gram_fro_sq(x: Tensor) -> Tensor:
    """``‖x xᵀ‖_F² = ‖xᵀ x‖_F²`` for ``x (n, p)``, through the smaller of the two products."""
    n, p = x.shape
    g = x.T @ x if p <= n else x @ x.T
    return (g * g).sum()


def _cross_fro_sq(x: Tensor, y: Tensor, form: str) -> Tensor:
    """``‖xᵀy‖_F² = ⟨x xᵀ, y yᵀ⟩_F`` for ``x (n, p)``, ``y (n, q)``; ``form`` picks the side."""
    n, p = x.shape
    q = y.shape[1]
    if form == "auto":
        form = "features" if p * q < n * n else "gram"
    if form == "features":
        c = x.T @ y
        return (c * c).sum()
    return (gram_linear(x) * gram_linear(y)).sum()


def linear_hsic_biased_features(x: Tensor, y: Tensor, form: str = "auto") -> Tensor:
    """Biased linear HSIC ``‖x_cᵀ y_c‖_F² / (n−1)²`` from features ``x (n, p)``, ``y (n, q)``.

    Columns are centred here; ``form`` ("auto" | "features" | "gram") picks ``x_cᵀy_c`` (p×q) or the
    Grams (n×n); "auto" takes the feature side when ``p·q < n²``. Differentiable, input dtype.
    """
    n = x.shape[0]
    xc = x - x.mean(0, keepdim=True)
    yc = y - y.mean(0, keepdim=True)
    return _cross_fro_sq(xc, yc, form) / (n - 1) ** 2


def _u_terms(x: Tensor, y: Tensor, form: str, same: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The four HSIC_1 terms for linear kernels from features (valid for any column means)."""
    a = (x * x).sum(1)
    b = a if same else (y * y).sum(1)
    sx = x.sum(0)
    sy = sx if same else y.sum(0)
    cross = gram_fro_sq(x) if same else _cross_fro_sq(x, y, form)
    tr_kl = cross - (a * b).sum()
    sum_k = (sx * sx).sum() - a.sum()
    sum_l = sum_k if same else (sy * sy).sum() - b.sum()
    ones_kl_ones = ((x @ sx - a) * (y @ sy - b)).sum()
    return tr_kl, sum_k, sum_l, ones_kl_ones


def linear_hsic_unbiased_features(x: Tensor, y: Tensor, form: str = "auto") -> Tensor:
    """Unbiased HSIC_1 of linear kernels from features ``x (n, p)``, ``y (n, q)``, ``n ≥ 4`` → 0-d.

    Uses ``tr(K̃L̃) = ‖xᵀy‖² − Σ_i ‖x_i‖²‖y_i‖²``, ``1ᵀK̃1 = ‖Σx_i‖² − Σ‖x_i‖²`` and
    ``(K̃1)_i = x_i·Σx − ‖x_i‖²`` in :func:`hsic1_from_terms`; exact for any column means (columns
    are centred first only for rounding). Never forms an n×n matrix when ``form="features"``.
    """
    n = x.shape[0]
    xc = x - x.mean(0, keepdim=True)
    yc = y - y.mean(0, keepdim=True)
    return hsic1_from_terms(n, *_u_terms(xc, yc, form, same=False))


def _linear_hsic_unbiased_self(x: Tensor) -> Tensor:
    xc = x - x.mean(0, keepdim=True)
    return hsic1_from_terms(len(x), *_u_terms(xc, xc, "auto", same=True))


def cka_ratio(hxy: Tensor, hxx: Tensor, hyy: Tensor) -> Tensor:
    """``hxy / sqrt(hxx · hyy)``; NaN and a warning when the denominator is not positive."""
    den = hxx * hyy
    if not bool((den > 0).all()):
        warn_undefined("an activation has zero variance under this kernel", stacklevel=4)
    return hxy / den.clamp_min(0).sqrt()


# --------------------------------------------------------------------------------------- tensor cores


def linear_cka_tensor(x: Tensor, y: Tensor, form: str = "auto") -> Tensor:
    """Biased linear CKA of ``x (n, p)``, ``y (n, q)`` as a 0-d tensor; no input checks, differentiable.

    NaN and a warning (:func:`cka_ratio`) when a side has zero variance.
    """
    xc = x - x.mean(0, keepdim=True)
    yc = y - y.mean(0, keepdim=True)
    return cka_ratio(_cross_fro_sq(xc, yc, form), gram_fro_sq(xc), gram_fro_sq(yc))


def unbiased_cka_tensor(x: Tensor, y: Tensor, form: str = "auto") -> Tensor:
    """Unbiased (HSIC_1) linear CKA as a 0-d tensor, ``n ≥ 4``; no checks, differentiable.

    A non-positive ``HSIC_1(K, K)·HSIC_1(L, L)`` (zero variance; a negative value is impossible in exact
    arithmetic, it is ``‖U(K)‖²/(n(n−3))``) gives NaN and a warning (:func:`cka_ratio`).
    """
    hxy = linear_hsic_unbiased_features(x, y, form)
    return cka_ratio(hxy, _linear_hsic_unbiased_self(x), _linear_hsic_unbiased_self(y))


# -------------------------------------------------------------------------------------------- metrics


def _pair(x, y, minimum: int, what: str) -> tuple[Tensor, Tensor] | None:
    """Checked float64 pair, or None (after a warning) when CKA is undefined for constant input."""
    x = torch.as_tensor(x)
    y = torch.as_tensor(y)
    if x.dim() >= 1 and y.dim() >= 1:
        check_same_n(x.shape[0], y.shape[0])
    x = as_matrix(x, "x")
    y = as_matrix(y, "y")
    check_min_n(len(x), minimum, what)
    for name, t in (("x", x), ("y", y)):
        if is_constant(t):
            warn_undefined(f"{name} is constant: every example has the same activation", stacklevel=4)
            return None
    return x, y


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise SimkitError(f"unknown form {form!r}; valid: {', '.join(FORMS)}")


def linear_cka(x, y, form: str = "auto") -> float:
    """Biased linear CKA (Kornblith et al. 2019) of ``x (n, p)`` and ``y (n, q)``, in float64.

    ``‖x_cᵀy_c‖_F² / (‖x_cᵀx_c‖_F ‖y_cᵀy_c‖_F)``; ``form`` "auto" uses the feature-space products when
    ``p·q < n²`` and the Gram form otherwise ("features" / "gram" force one). NaN + warning for a
    constant input; needs ``n ≥ 2``.
    """
    _check_form(form)
    pair = _pair(x, y, 2, "linear CKA")
    if pair is None:
        return float("nan")
    return float(linear_cka_tensor(*pair, form=form))


def unbiased_cka(x, y, form: str = "auto") -> float:
    """Unbiased linear CKA from HSIC_1 (Song et al. 2012) of ``x (n, p)``, ``y (n, q)``, ``n ≥ 4``.

    ``HSIC_1(K, L) / sqrt(HSIC_1(K, K) HSIC_1(L, L))`` with ``K = x xᵀ``; may be negative or slightly
    above 1 for small ``n``. ``form`` as in :func:`linear_cka`. NaN + warning for a constant input.
    """
    _check_form(form)
    pair = _pair(x, y, 4, "unbiased CKA")
    if pair is None:
        return float("nan")
    return float(unbiased_cka_tensor(*pair, form=form))


def rbf_cka(x, y, factor: float = 1.0) -> float:
    """Biased CKA with RBF kernels (σ = ``factor`` · median pairwise distance) of ``x (n, p)``, ``y (n, q)``.

    Gram form only (``O(n²)`` memory). NaN + warning for a constant input.
    """
    check_positive(factor, "factor")
    pair = _pair(x, y, 2, "RBF CKA")
    if pair is None:
        return float("nan")
    x, y = pair
    K = gram_rbf(x, factor)
    L = gram_rbf(y, factor)
    return float(cka_ratio(hsic_biased(K, L), hsic_biased(K, K), hsic_biased(L, L)))
