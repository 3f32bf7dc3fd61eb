"""The CKA family: Gram matrices, centering, HSIC estimators and CKA (spec §0.1, §0.2).

Conventions: activations ``x (n, p)`` and ``y (n, q)`` hold the same ``n`` examples in the same order
(conv maps are flattened by the caller). Public metric functions cast to float64, check their input
(:class:`SimkitError` for mismatched ``n``, too few samples, NaN/Inf) and return a Python float. CKA of
a constant activation is undefined: NaN plus a ``RuntimeWarning`` (the engine adds the layer name).

Building blocks, public because the streaming accumulators (``simkit.metrics.streaming``) use them:
each estimator is written once, here, and both the functions and the accumulators call it. They take
floating-point torch tensors and check their types and shapes (:class:`SimkitError`), not their values:
they compute in the input's dtype, so NaN in (or overflow in that dtype) gives NaN out.

* Gram side: :func:`gram_linear`, :func:`gram_rbf`, :func:`sq_distances` (the one distance formula),
  :func:`median_of_distances` / :func:`median_distance` (the one median, chunked),
  :func:`rbf_from_sq_distances`, :func:`center_gram` (``HKH``), :func:`u_center_gram` with its parts
  :func:`u_center_offsets` and :func:`u_center_rows` (Song et al.'s U-centering), :func:`hsic_biased`,
  :func:`hsic_unbiased`.
* Feature side (cheaper when ``p·q < n²``): :func:`gram_fro_sq`, :func:`hsic1_from_terms`,
  :func:`linear_hsic_biased_features`, :func:`linear_hsic_unbiased_features`.
* Tensor cores without checks, differentiable, in the input dtype (the losses use them):
  :func:`linear_cka_tensor`, :func:`unbiased_cka_tensor`; and :func:`cka_ratio`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from simkit.errors import SimkitError
from simkit.metrics._checks import (
    as_matrix,
    check_min_n,
    check_positive,
    check_same_n,
    check_tensor,
    exact_quantile,
    is_constant,
    warn_undefined,
)

FORMS = ("auto", "features", "gram")
#: how far above 1 a float64 CKA ratio may round before :func:`cka_ratio` takes its denominator for rounding
#: noise (in float32, e.g. a training loss, 1e4 eps: about 1e-3)
RATIO_SLACK = 1e-6

# ---------------------------------------------------------------------------------------------- Grams


def gram_linear(x: Tensor) -> Tensor:
    """Linear kernel ``K = x xᵀ``: ``x (n, p)`` → ``(n, n)`` in ``x``'s dtype."""
    check_tensor(x, "x", 2, 2)
    return x @ x.T


def sq_distances(gram_rows: Tensor, sq: Tensor, idx: Tensor) -> Tensor:
    """Rows ``idx (r,)`` of the squared Euclidean distance matrix, from rows of the Gram.

    ``gram_rows (..., r, n)`` are the rows ``idx`` of ``x xᵀ`` and ``sq (..., n)`` the squared row norms
    (leading layer axes allowed): ``(sq_i + sq_j − 2 K_ij)`` clamped at 0, exactly 0 at ``(k, idx[k])``
    (self-distances). The one distance formula of the module and of the streaming accumulators.
    """
    d2 = (sq[..., idx, None] + sq[..., None, :] - 2.0 * gram_rows).clamp_min_(0.0)
    d2[..., torch.arange(len(idx), device=idx.device), idx] = 0.0
    return d2


def _sq_distances(x: Tensor) -> Tensor:
    """Squared Euclidean distances ``(n, n)`` between the rows of ``x (n, p)``, exact zeros on the diagonal."""
    return sq_distances(x @ x.T, (x * x).sum(1), torch.arange(len(x), device=x.device))


def default_chunk(n: int) -> int:
    """Rows per block so that a block of ``chunk × n`` distances holds about 2**24 entries."""
    return max(1, min(n, 2**24 // max(n, 1)))


def median_of_distances(sq_rows: Callable[[Tensor], Tensor], n: int, chunk: int | None = None,
                        device: torch.device | str | None = None) -> Tensor:
    """Exact median Euclidean distance over the ``n(n−1)/2`` pairs ``i < j`` (numpy's ``median``).

    ``sq_rows(idx)`` gives rows ``idx`` of the squared distance matrix (:func:`sq_distances`); they are
    asked for ``chunk`` rows at a time (default :func:`default_chunk`), so only the ``n(n−1)/2``
    distances are held, never the ``n × n`` matrix. The one median of simkit (the functions, the
    minibatch Grams and the stored exact path all use it). Returns a 0-d tensor.
    """
    if n < 2:
        raise SimkitError(f"a median pairwise distance needs at least 2 samples, got {n}")
    step = int(chunk or default_chunk(n))
    parts = []
    for start in range(0, n, step):
        idx = torch.arange(start, min(n, start + step), device=device)
        upper = torch.arange(n, device=device)[None, :] > idx[:, None]
        parts.append(sq_rows(idx)[upper].sqrt())
    return exact_quantile(torch.cat(parts), 0.5)


def median_distance(x: Tensor, chunk: int | None = None) -> Tensor:
    """Median Euclidean distance over the ``n(n−1)/2`` pairs ``i < j`` of rows of ``x (n, p)``.

    The diagonal (zero self-distances) is excluded; with an even number of pairs the two middle values
    are averaged (numpy's ``median``). ``chunk`` rows of distances at a time (:func:`median_of_distances`).
    Returns a 0-d tensor.
    """
    sq = (x * x).sum(1)
    return median_of_distances(lambda idx: sq_distances(x[idx] @ x.T, sq, idx), len(x), chunk, x.device)


def rbf_from_sq_distances(d2: Tensor, sigma: Tensor | float) -> Tensor:
    """The RBF kernel ``exp(−d² / (2σ²))`` of squared distances ``d2``; ``σ`` broadcasts against ``d2``.

    A zero bandwidth gives the ``σ → 0`` limit ``K = [d = 0]`` (used per batch by the minibatch path;
    the full-data functions refuse σ = 0 before they get here).
    """
    if isinstance(sigma, float) and sigma > 0:
        return torch.exp(-d2 / (2.0 * sigma * sigma))
    two_s2 = 2.0 * sigma * sigma
    if not isinstance(two_s2, Tensor):
        two_s2 = torch.as_tensor(two_s2, dtype=d2.dtype, device=d2.device)
    k = torch.exp(-d2 / torch.where(two_s2 > 0, two_s2, torch.ones_like(two_s2)))
    return torch.where(two_s2 > 0, k, (d2 == 0).to(d2.dtype))


def gram_rbf(x: Tensor, factor: float = 1.0, sigma: float | None = None) -> Tensor:
    """RBF kernel ``K_ij = exp(−‖x_i − x_j‖² / (2σ²))`` for ``x (n, p)`` → ``(n, n)``.

    ``σ = factor · median pairwise distance`` (diagonal excluded) unless ``sigma`` is given. A zero
    bandwidth (more than half of the pairs are duplicates) raises: pass ``sigma`` explicitly.
    """
    check_tensor(x, "x", 2, 2)
    check_positive(factor, "factor")
    if sigma is None:
        sigma_t = factor * median_distance(x)
        if not bool(torch.isfinite(sigma_t)):
            raise SimkitError("the median pairwise distance of `x` is not finite (NaN or Inf in `x`, or overflow in "
                              f"its dtype {x.dtype}); check `x`, or cast it to float64")
        if not bool(sigma_t > 0):
            raise SimkitError(
                "RBF bandwidth is 0: the median pairwise distance is 0 (most samples are duplicates); "
                "pass `sigma` explicitly or use linear CKA"
            )
    else:
        check_positive(sigma, "sigma")
        sigma_t = torch.as_tensor(float(sigma), dtype=x.dtype, device=x.device)
    return rbf_from_sq_distances(_sq_distances(x), sigma_t)


# ------------------------------------------------------------------------------------------ centering


def center_gram(k: Tensor) -> Tensor:
    """``H K H`` with ``H = I − 11ᵀ/n`` for ``k (..., n, n)`` (leading batch axes allowed)."""
    check_tensor(k, "k", square=True)
    row = k.mean(-1, keepdim=True)
    col = k.mean(-2, keepdim=True)
    return k - row - col + k.mean((-2, -1), keepdim=True)


def u_center_offsets(colsum: Tensor, n: int) -> Tensor:
    """The offsets ``m`` of Song et al.'s U-centring from the column sums ``(..., n)`` of ``K̃`` (``K``
    with its diagonal zeroed): ``m = colsum / (n−2)``, ``m −= Σm / (2(n−1))`` (spec §0.2)."""
    m = colsum / (n - 2)
    return m - m.sum(-1, keepdim=True) / (2 * (n - 1))


def u_center_rows(k_rows: Tensor, m: Tensor, idx: Tensor) -> Tensor:
    """Rows ``idx (r,)`` of the U-centred Gram ``G = K̃ − m_i − m_j`` (diagonal zero) from rows
    ``k_rows (..., r, n)`` of ``K`` (their diagonal entries are ignored) and offsets ``m (..., n)``
    (:func:`u_center_offsets`). Out of place (differentiable)."""
    off = torch.arange(m.shape[-1], device=idx.device)[None, :] != idx[:, None]
    return (k_rows - m[..., idx, None] - m[..., None, :]) * off.to(k_rows.dtype)


def u_center_gram(k: Tensor) -> Tensor:
    """Song et al.'s U-centering of a symmetric ``k (..., n, n)``, ``n ≥ 4`` (spec §0.2).

    Diagonal zeroed, ``m = colsum / (n−2)``, ``m −= Σm / (2(n−1))``, ``G = K̃ − m_i − m_j``, diagonal
    zeroed again; so that ``⟨U(K), U(L)⟩_F = n(n−3)·HSIC_1(K, L)``. Out of place (differentiable).
    The streaming accumulators build the same rows from :func:`u_center_offsets` and :func:`u_center_rows`.
    """
    n = check_tensor(k, "k", square=True).shape[-1]
    check_min_n(n, 4, "U-centering (unbiased HSIC)")
    off = 1.0 - torch.eye(n, dtype=k.dtype, device=k.device)
    m = u_center_offsets((k * off).sum(-2), n)
    return u_center_rows(k, m, torch.arange(n, device=k.device))


def _check_grams(K: Tensor, L: Tensor) -> int:
    check_tensor(K, "K")
    check_tensor(L, "L")
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


def cka_ratio(hxy: Tensor, hxx: Tensor, hyy: Tensor, warn: bool = True, bounded: bool = True) -> Tensor:
    """``hxy / sqrt(hxx · hyy)`` (shapes broadcast, e.g. ``(La, 1)`` × ``(1, Lb)`` for all layer pairs).

    Where the denominator is not positive (a side without variance under this kernel) the value is NaN,
    with a warning unless ``warn=False`` (the streaming accumulators warn themselves, naming the layers).
    So it is where ``|ratio|`` exceeds 1 by more than :data:`RATIO_SLACK` (float64; 1e4 eps in a lower precision):
    Cauchy–Schwarz bounds every CKA ratio by 1 (the HSICs are inner products, biased, U-centred or summed
    over batches), so beyond it the denominator is rounding noise (the unbiased HSIC of a degenerate
    sample, e.g. 3 equal rows of 4).
    The one CKA ratio of simkit. Where ``hxx · hyy`` under- or overflows (tiny or huge activations) it is
    ``hxy / (√hxx · √hyy)``, the same ratio without the product. ``bounded=False`` drops the |ratio| ≤ 1 rule
    for a ratio that Cauchy–Schwarz does not bound (``cknna``: its self terms keep each side's own neighbours).
    """
    den = hxx * hyy
    off_scale = (hxx > 0) & (hyy > 0) & ~(torch.isfinite(den) & (den >= torch.finfo(den.dtype).tiny))
    out = torch.where(off_scale, hxy / (hxx.clamp_min(0).sqrt() * hyy.clamp_min(0).sqrt()),
                      hxy / den.clamp_min(0).sqrt())
    slack = max(RATIO_SLACK, 1e4 * float(torch.finfo(out.dtype).eps))  # float32 sums of 1e4 terms round further
    ok = ((den > 0) | off_scale) & ((out.abs() <= 1 + slack) | (not bounded))
    if warn and not bool(ok.all()):
        warn_undefined("an activation has zero variance under this kernel (up to rounding)", stacklevel=4)
    return torch.where(ok, out, torch.full_like(out, float("nan")))


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

    >>> import torch
    >>> x = torch.randn(100, 8, generator=torch.Generator().manual_seed(0))
    >>> round(linear_cka(x, 3 * x + 1), 6)   # invariant to isotropic scaling and shifts
    1.0
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
