"""Shape measures from second moments: orthogonal Procrustes, the CCA family and netrep's shape metric.

Activations ``x (n, p)``, ``y (n, q)``, columns centred (``X̃``, ``Ỹ``). Every measure is a function of
each side's covariance spectrum ``X̃ᵀX̃ = V diag(λ) Vᵀ`` and of the cross-covariance expressed in the two
eigenbases, ``T0 = Vᵀ X̃ᵀỸ W`` (:class:`Spectrum`, :func:`pair_values`), so the same code serves the
one-shot functions below, the streamed feature sums (``X̃ᵀX̃``, ``ỸᵀỸ``, ``X̃ᵀỸ`` accumulated over
batches) and stored activations (``T0 = EₓᵀE_y`` with ``E = X̃V``, from the ``n × n`` Gram when
``p > n``).

* ``procrustes``: ``‖X̃ᵀỸ‖_* / (‖X̃‖_F ‖Ỹ‖_F)`` ∈ [0, 1] (nuclear norm; the optimal rotation's fit);
  ``procrustes_angle``: its arccos ∈ [0, π/2], netrep's angular Procrustes distance (α = 1).
  Invariant to rotations/reflections and isotropic scaling of either side, not to general linear maps.
* ``cca``: mean squared canonical correlation ``R²_CCA = ‖Q_XᵀQ_Y‖_F² / min(r_x, r_y)`` ∈ [0, 1]
  (whitening by ``λ^{-1/2}`` on the numerical rank ``r``; equals ``/ min(p, q)`` for full-rank data). Invariant to invertible linear maps. ``cca_eps > 0`` adds the ridge
  ``cca_eps · mean(λ)`` to the covariance before whitening (then self-similarity is slightly below 1).
* ``svcca`` (Raghu et al. 2017): each side reduced to its top principal components explaining
  ``svcca_keep`` of the variance, then the mean canonical correlation ``Σρ / min(k_x, k_y)``.
* ``pwcca`` (Morcos et al. 2018): ``Σ αᵢρᵢ`` with ``αᵢ ∝ Σ_j |⟨hᵢ, x̃_j⟩|``, ``hᵢ`` the unit canonical
  variates of the side with fewer features (X on ties) and ``x̃_j`` its centred neuron columns.
  Symmetric for unequal widths (the narrower side weights both ways); for equal widths the weights come
  from the first argument, so ``pwcca(x, y) ≠ pwcca(y, x)`` in general.
* ``shape_metric`` (Williams et al. 2021, netrep ``LinearMetric(alpha, score_method="angular")``): both
  sides scaled to unit total variance, partially whitened by ``Z = V diag(α + (1−α) λ^{-1/2}) Vᵀ``, then
  the angular Procrustes distance ``arccos(‖(X̃Zₓ)ᵀ(ỸZ_y)‖_* / (‖X̃Zₓ‖_F ‖ỸZ_y‖_F))`` ∈ [0, π/2].
  α = 1 is ``procrustes_angle``, α = 0 the angular CCA distance ``arccos(Σρ / √(r_x r_y))``. (netrep mixes
  α with unscaled eigenvalues; scaling first makes the metric invariant to isotropic scaling for every α.)

Numerical rank (one rule for the functions and every streaming path, :func:`~simkit.metrics._checks.rank_rtol`):
every covariance is a float64 sum, so an eigenvalue counts when ``λ > max(100, p) · eps(float64) · λ_max``
(``p`` the layer's features; on singular values ``σ > √(max(100, p)·eps) · σ_max``), for float32
activations too; each layer has its own tolerance.

Degenerate CCA (``cca``, ``svcca``, ``pwcca``, and ``shape_metric`` with α = 0; not with ``cca_eps > 0``):
the centred samples live in ``n − 1`` dimensions, so the column spaces of ``X̃`` and ``Ỹ`` share at least
``r_x + r_y − (n − 1)`` directions and that many canonical correlations are exactly 1 whatever the data.
The value is then NaN with a ``RuntimeWarning``: naming the layer when one side's rank (for SVCCA its
kept components) reaches ``n − 1`` — always the case for generic data with ``min(p, q) ≥ n − 1`` — and
naming the pair, ``r_x + r_y`` and ``n`` when ``r_x + r_y > n − 1`` (for SVCCA the kept components
``k_x + k_y``). The same rule holds on every path (:func:`is_degenerate`, :func:`jointly_degenerate`);
:func:`cca_refusal` says up front which layers are too wide for ``n``.
Constant inputs give NaN with a warning, as CKA does.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from simkit.catalog import COVARIANCE_MEASURES
from simkit.metrics._checks import (
    as_matrix,
    check_min_n,
    check_same_n,
    is_constant,
    rank_mask,
    warn_undefined,
)
from simkit.metrics.settings import MeasureSettings, check_setting

SHAPE_MEASURES = COVARIANCE_MEASURES  # the catalogue's measures computed from covariance spectra
#: the measures that whiten (degenerate when a side's rank reaches n − 1, or both sides' ranks together
#: exceed it, without a ridge)
WHITENING = ("cca", "svcca", "pwcca", "shape_metric")
#: the measures that need no eigenbasis (orthogonally invariant in each side's features)
PROCRUSTES = ("procrustes", "procrustes_angle")


@dataclass
class Spectrum:
    """One layer's centred covariance spectrum.

    lam: ``(r,)`` float64 eigenvalues, descending, clamped at 0 (all directions, not only the rank);
    basis: ``(p, r)`` eigenvectors ``V`` (feature form) or ``(n, r)`` ``E = X̃V`` (sample form);
    loadings: ``(p, r)`` ``X̃ᵀE = V diag(λ)`` (for PWCCA) or None; rank: the numerical rank (eigenvalues
    above ``rank_rtol(p) · λ_max``, :func:`~simkit.metrics._checks.rank_rtol`); width: ``p``.
    """

    lam: Tensor
    basis: Tensor
    loadings: Tensor | None
    rank: int
    width: int

    @property
    def total(self) -> float:
        """``‖X̃‖_F² = Σ λ``."""
        return float(self.lam.sum())


def _sorted_eigh(c: Tensor) -> tuple[Tensor, Tensor]:
    lam, vec = torch.linalg.eigh(c)
    return lam.flip(0).clamp_min(0.0), vec.flip(1)


def _rank(lam: Tensor, width: int) -> int:
    return int(rank_mask(lam, width).sum())


def spectrum_from_cov(c: Tensor, loadings: bool = False, vectors: bool = True) -> Spectrum:
    """:class:`Spectrum` (feature form) of a centred covariance ``c = X̃ᵀX̃ (p, p)`` float64 (the rank by the
    one rule, :func:`~simkit.metrics._checks.rank_rtol` of ``p``). ``vectors=False``: the eigenvalues only
    (``basis`` empty), all that Procrustes needs (its ``‖T0‖_*`` is that of ``X̃ᵀỸ``, the bases being orthogonal)."""
    if not vectors:
        lam = torch.linalg.eigvalsh(c).flip(0).clamp_min(0.0)
        return Spectrum(lam, c.new_empty(0), None, _rank(lam, c.shape[0]), c.shape[0])
    lam, vec = _sorted_eigh(c)
    return Spectrum(lam, vec, vec * lam if loadings else None, _rank(lam, c.shape[0]), c.shape[0])


def spectrum_from_samples(xc: Tensor, loadings: bool = False, vectors: bool = True) -> Spectrum:
    """:class:`Spectrum` (sample form, ``basis = E = X̃V (n, r)``) of centred float64 samples ``xc (n, p)``.

    Through the ``p × p`` covariance when ``p ≤ n``, else the ``n × n`` Gram ``X̃X̃ᵀ = U diag(λ) Uᵀ``
    (``E = U diag(√λ)``). The rank rule is that of the ``p`` features either way. ``vectors=False``: the
    eigenvalues only and ``basis = X̃`` itself (Procrustes: ``‖X̃ᵀỸ‖_* = ‖EₓᵀE_y‖_*``)."""
    n, p = xc.shape
    if not vectors:
        lam = torch.linalg.eigvalsh(xc.T @ xc if p <= n else xc @ xc.T).flip(0).clamp_min(0.0)
        return Spectrum(lam, xc, None, _rank(lam, p), p)
    if p <= n:
        cov = spectrum_from_cov(xc.T @ xc, loadings)
        return Spectrum(cov.lam, xc @ cov.basis, cov.loadings, cov.rank, p)
    lam, u = _sorted_eigh(xc @ xc.T)
    e = u * lam.sqrt()
    return Spectrum(lam, e, xc.T @ e if loadings else None, _rank(lam, p), p)


def svcca_components(s: Spectrum, keep: float) -> int:
    """Leading principal components explaining at least ``keep`` of the variance (at most the rank)."""
    if s.rank == 0:
        return 0
    share = s.lam.cumsum(0) / s.lam.sum()
    k = int((share < keep * (1 - 1e-12)).sum()) + 1
    return max(1, min(k, s.rank))


def used_directions(s: Spectrum, measure: str, settings: MeasureSettings) -> int:
    """How many of the layer's directions the whitening of ``measure`` uses (rank, or SVCCA's k)."""
    return svcca_components(s, settings.svcca_keep) if measure == "svcca" else s.rank


def whitens_fully(measure: str, settings: MeasureSettings) -> bool:
    """True when ``measure`` whitens without a ridge (``cca``, ``svcca``, ``pwcca``; ``shape_metric`` with
    α = 0), so that directions shared by force make it degenerate; False with ``cca_eps > 0``."""
    if measure not in WHITENING or settings.cca_eps > 0:
        return False
    return not (measure == "shape_metric" and settings.shape_alpha > 0)


def is_degenerate(s: Spectrum, n: int, measure: str, settings: MeasureSettings) -> bool:
    """True when ``measure`` is undefined for this layer: it whitens, without a ridge, ``n − 1`` directions
    or more (every canonical correlation is then 1)."""
    return whitens_fully(measure, settings) and used_directions(s, measure, settings) >= n - 1


def jointly_degenerate(sx: Spectrum, sy: Spectrum, n: int, measure: str, settings: MeasureSettings) -> bool:
    """True when ``measure`` is undefined for this pair: it whitens, without a ridge, ``r_x + r_y > n − 1``
    directions in all (SVCCA: kept components), so at least ``r_x + r_y − (n − 1)`` canonical correlations
    are exactly 1 whatever the data (both column spaces lie in the ``n − 1`` centred dimensions)."""
    return whitens_fully(measure, settings) and (
        used_directions(sx, measure, settings) + used_directions(sy, measure, settings) > n - 1)


def joint_message(measure: str, pairs: Sequence[tuple[str, int, int]], n: int) -> str:
    """The warning for the pairs ``(name, r_x, r_y)`` of ``measure`` whose ranks add up to more than ``n − 1``
    (:func:`jointly_degenerate`; SVCCA: kept components)."""
    what = "kept components k_x + k_y" if measure == "svcca" else "rank_x + rank_y"
    other = "a lower `svcca_keep`" if measure == "svcca" else "use svcca"
    fix = f"Set `cca_eps` > 0 (ridge), {other}, reduce the layers (e.g. `reduce=\"mean\"`) or use more samples"
    if len(pairs) == 1:
        name, rx, ry = pairs[0]
        return (f"{measure} is undefined for the layer pair {name}: {what} = {rx} + {ry} = {rx + ry} > "
                f"n - 1 = {n - 1}, so at least {rx + ry - (n - 1)} canonical correlations are 1 whatever the "
                f"data; returning NaN. {fix}")
    listed = ", ".join(f"{name} ({rx} + {ry} = {rx + ry})" for name, rx, ry in pairs)
    return (f"{measure} is undefined for {len(pairs)} layer pairs whose {what} > n - 1 = {n - 1} (then at "
            f"least {what} - (n - 1) canonical correlations are 1 whatever the data): {listed}; their values "
            f"are NaN. {fix}")


def _inv_sqrt(s: Spectrum, count: int, eps: float) -> Tensor:
    """Whitening weights ``(λ + ε)^{-1/2}`` on the first ``count`` directions, ``(count,)``."""
    ridge = eps * s.total / s.width
    return (s.lam[:count] + ridge).rsqrt()


#: the largest relative error :func:`nuclear_norm` accepts from the eigenvalues of the smaller Gram before it
#: takes the singular values instead (100× below the 1e-8 every path is held to)
NUCLEAR_RTOL = 1e-10
#: an eigenvalue's error in units of ``eps · μ_max`` that :func:`nuclear_norm` assumes (measured errors of the
#: whole norm stay below the estimate with 1, ill-conditioned 512-wide products included)
EIGEN_ERROR = 4.0


def nuclear_norm(t: Tensor, rank: int | None = None) -> float:
    """``‖t‖_*`` of ``t (r, s)`` float64: ``Σ √μ`` over the eigenvalues ``μ`` of the smaller Gram (``tᵀt`` or
    ``ttᵀ``, ``min(r, s)`` wide), two to five times cheaper than an SVD. An eigenvalue carries an error of
    about :data:`EIGEN_ERROR` ``· eps · μ_max``, so its square root errs by that over ``2√μ``: when those could
    add up to more than :data:`NUCLEAR_RTOL` of the norm (a rank-deficient ``t``, a near-zero singular
    value), the singular values are taken instead, so the value is the SVD's to float64 rounding; at once
    when ``rank`` (a bound on ``t``'s rank, e.g. the smaller layer rank) says it is rank-deficient."""
    if not t.numel():
        return 0.0
    if rank is not None and rank < min(t.shape):
        return float(torch.linalg.svdvals(t).sum())
    gram = t.T @ t if t.shape[0] >= t.shape[1] else t @ t.T
    mu = torch.linalg.eigvalsh(gram)
    top = float(mu[-1])
    if float(mu[0]) > 0:
        roots = mu.sqrt()
        norm = float(roots.sum())
        error = EIGEN_ERROR * torch.finfo(mu.dtype).eps * top * float((0.5 / roots).sum())
        if error <= NUCLEAR_RTOL * norm:
            return norm
    return float(torch.linalg.svdvals(t).sum())


def nuclear_norm_of_draw(t: Tensor, rank: int | None = None) -> float:
    """``‖t‖_*`` for a draw of a permutation null: ``Σ √μ`` over the eigenvalues of the smaller Gram, never the
    SVD; an eigenvalue within its error ``EIGEN_ERROR · eps · μ_max`` of zero counts as zero (a rank-deficient
    block's zero singular values stay zero). Each root errs by at most ``√(EIGEN_ERROR · eps · μ_max)``, so
    the norm by at most ``min(r, s) · 3e-8 · ‖t‖₂``: below 3e-5 of the norm for 1000-wide blocks, far inside
    the spread of a null of a few draws, and without the SVD that :func:`nuclear_norm` falls back to for a
    rank-deficient block (``rank`` is accepted for the same signature and not needed)."""
    if not t.numel():
        return 0.0
    gram = t.T @ t if t.shape[0] >= t.shape[1] else t @ t.T
    mu = torch.linalg.eigvalsh(gram)
    cut = EIGEN_ERROR * torch.finfo(mu.dtype).eps * float(mu[-1])
    return float(mu[mu > cut].sqrt().sum())


def _canonical_directions(t: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """The ``m`` largest singular values of ``t (r, s)`` and their left singular vectors ``(r, m)``, from
    the eigendecomposition of ``t tᵀ``, cheaper than a full SVD. The canonical correlations lie in [0, 1],
    so a square root errs by at most about 1e-8, on correlations near 0 only."""
    lam, vec = torch.linalg.eigh(t @ t.T)
    return lam.flip(0)[:m].clamp_min(0.0).sqrt(), vec.flip(1)[:, :m]


def pair_values(sx: Spectrum, sy: Spectrum, t0: Tensor, measures: Sequence[str],
                settings: MeasureSettings, nuclear: Callable[[Tensor, int | None], float] = nuclear_norm
                ) -> dict[str, float]:
    """Every measure of ``measures`` for one pair from the spectra and ``t0 (r_x, r_y) = Vᵀ X̃ᵀỸ W``; ``nuclear``:
    the nuclear norm (:func:`nuclear_norm`; a null's draws take :func:`nuclear_norm_of_draw`)."""
    out: dict[str, float] = {}
    eps = settings.cca_eps
    if "procrustes" in measures or "procrustes_angle" in measures:
        score = nuclear(t0, min(sx.rank, sy.rank)) / math.sqrt(sx.total * sy.total)
        out["procrustes"] = score
        out["procrustes_angle"] = math.acos(min(1.0, max(0.0, score)))
    if "cca" in measures or "pwcca" in measures:
        rx, ry = sx.rank, sy.rank
        wx, wy = _inv_sqrt(sx, rx, eps), _inv_sqrt(sy, ry, eps)
        t = wx[:, None] * t0[:rx, :ry] * wy[None, :]
        m = min(rx, ry)
        out["cca"] = float((t * t).sum()) / m  # Σ ρ² = ‖t‖_F²: no SVD unless pwcca needs its directions
        if "pwcca" in measures:
            narrow_x = sx.width <= sy.width
            side, w = (sx, wx) if narrow_x else (sy, wy)
            rho, dirs = _canonical_directions(t if narrow_x else t.T, m)
            a = w[:, None] * dirs                         # canonical weights in the eigenbasis (r, m)
            loadings = side.loadings
            assert loadings is not None, "pwcca needs spectra built with loadings=True"
            num = (loadings[:, :a.shape[0]] @ a).abs().sum(0)   # Σ_j |⟨h_i, x̃_j⟩| · ‖h_i‖
            norm = (side.lam[:a.shape[0], None] * a * a).sum(0).sqrt()
            weight = num / norm
            out["pwcca"] = float((weight / weight.sum() * rho).sum())
    if "svcca" in measures:
        kx, ky = svcca_components(sx, settings.svcca_keep), svcca_components(sy, settings.svcca_keep)
        t = _inv_sqrt(sx, kx, eps)[:, None] * t0[:kx, :ky] * _inv_sqrt(sy, ky, eps)[None, :]
        out["svcca"] = nuclear(t, None) / min(kx, ky)
    if "shape_metric" in measures:
        alpha = settings.shape_alpha

        def scale(s: Spectrum) -> Tensor:
            g = torch.full_like(s.lam, alpha)
            r = s.rank
            if alpha < 1:
                g[:r] += (1 - alpha) * (s.lam[:r] / s.total + eps / s.width).rsqrt()
            return g / math.sqrt(s.total)

        gx, gy = scale(sx), scale(sy)
        t = gx[:, None] * t0 * gy[None, :]
        nx, ny = float((sx.lam * gx * gx).sum()), float((sy.lam * gy * gy).sum())
        out["shape_metric"] = math.acos(min(1.0, max(0.0, nuclear(t, min(sx.rank, sy.rank)) / math.sqrt(nx * ny))))
    return {m: out[m] for m in measures}


# ------------------------------------------------------------------------------------ one-shot functions


def _centred_pair(x, y, what: str) -> tuple[Tensor, Tensor] | None:
    """Checked float64 column-centred pair, or None (after a warning) for a constant input."""
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    if xt.dim() >= 1 and yt.dim() >= 1:
        check_same_n(xt.shape[0], yt.shape[0])
    xt, yt = as_matrix(xt, "x"), as_matrix(yt, "y")
    check_min_n(len(xt), 2, what)
    for name, t in (("x", xt), ("y", yt)):
        if is_constant(t):
            warn_undefined(f"{name} is constant: every example has the same activation", 4, what)
            return None
    return xt - xt.mean(0), yt - yt.mean(0)


def _one_shot(x, y, measure: str, settings: MeasureSettings) -> float:
    pair = _centred_pair(x, y, measure)
    if pair is None:
        return float("nan")
    xc, yc = pair
    n = len(xc)
    spectra = [spectrum_from_samples(t, loadings=measure == "pwcca") for t in (xc, yc)]
    for name, s in zip("xy", spectra, strict=True):
        if is_degenerate(s, n, measure, settings):
            warnings.warn(degenerate_message(measure, f"`{name}`", s, n, settings), RuntimeWarning, stacklevel=3)
            return float("nan")
    sx, sy = spectra
    if sx.rank == 0 or sy.rank == 0:  # no variance above rounding: undefined, as for a constant input
        warn_undefined("an input has no variance above rounding", 3, measure)
        return float("nan")
    if jointly_degenerate(sx, sy, n, measure, settings):
        used = (used_directions(sx, measure, settings), used_directions(sy, measure, settings))
        warnings.warn(joint_message(measure, [("(`x`, `y`)", *used)], n), RuntimeWarning, stacklevel=3)
        return float("nan")
    return pair_values(sx, sy, sx.basis.T @ sy.basis, [measure], settings)[measure]


def degenerate_message(measure: str, layer: str, s: Spectrum, n: int, settings: MeasureSettings) -> str:
    """The warning for a degenerate whitening measure (``layer`` names the layer)."""
    used = used_directions(s, measure, settings)
    return (f"{measure} is undefined for layer {layer}: it has {s.width} features and {used} whitened "
            f"directions >= n - 1 = {n - 1}, so every canonical correlation is 1; returning NaN. Set "
            "`cca_eps` > 0 (ridge), use svcca, or use more samples")


def procrustes(x, y) -> float:
    """Orthogonal Procrustes similarity ``‖X̃ᵀỸ‖_* / (‖X̃‖_F ‖Ỹ‖_F)`` ∈ [0, 1] of ``x (n, p)``, ``y (n, q)``."""
    return _one_shot(x, y, "procrustes", MeasureSettings())


def procrustes_angle(x, y) -> float:
    """Angular Procrustes distance ``arccos(procrustes(x, y))`` ∈ [0, π/2] (netrep, α = 1); 0 for x = y."""
    return _one_shot(x, y, "procrustes_angle", MeasureSettings())


def cca(x, y, cca_eps: float = 0.0) -> float:
    """Mean squared canonical correlation ``R²_CCA`` ∈ [0, 1] of ``x (n, p)``, ``y (n, q)`` (module docstring).

    ``cca_eps``: ridge relative to each side's mean eigenvalue (0: pseudo-inverse on the numerical rank).
    NaN + warning when ``cca_eps = 0`` and a side's rank reaches ``n − 1`` or ``rank_x + rank_y > n − 1``
    (canonical correlations forced to 1, module docstring).
    """
    return _one_shot(x, y, "cca", MeasureSettings(cca_eps=check_setting("cca_eps", cca_eps)))


def svcca(x, y, svcca_keep: float = 0.99, cca_eps: float = 0.0) -> float:
    """SVCCA (Raghu et al.): mean canonical correlation of the top principal components explaining
    ``svcca_keep`` of each side's variance; ``x (n, p)``, ``y (n, q)`` → float in [0, 1]. NaN + warning when
    ``cca_eps = 0`` and a side keeps ``n − 1`` components or ``k_x + k_y > n − 1``."""
    return _one_shot(x, y, "svcca", MeasureSettings(svcca_keep=check_setting("svcca_keep", svcca_keep), cca_eps=check_setting("cca_eps", cca_eps)))


def pwcca(x, y, cca_eps: float = 0.0) -> float:
    """Projection-weighted CCA (Morcos et al.) of ``x (n, p)``, ``y (n, q)`` → float in [0, 1]; weights from
    the narrower side (X on ties): symmetric for unequal widths, not for equal ones. NaN + warning as
    :func:`cca`."""
    return _one_shot(x, y, "pwcca", MeasureSettings(cca_eps=check_setting("cca_eps", cca_eps)))


def shape_metric(x, y, shape_alpha: float = 0.5, cca_eps: float = 0.0) -> float:
    """netrep's generalised shape metric (angular, in [0, π/2]) with regularisation ``shape_alpha`` ∈ [0, 1]
    (0: CCA, 1: Procrustes) of ``x (n, p)``, ``y (n, q)``; 0 for x = y.

    Degenerate samples (``cca_eps = 0``): with α = 0 the metric is the angular CCA distance, and like
    :func:`cca` it is NaN + warning when a side's rank reaches ``n − 1`` or ``rank_x + rank_y > n − 1``
    (canonical correlations forced to 1). With α > 0 it is returned: the partial whitening
    ``α + (1−α) λ^{-1/2}`` keeps every direction's own variance in play, so the value stays a finite,
    continuous, well-defined distance between the two sample sets. Near α = 0 it tends to the
    degenerate CCA value, though, so when ``p + q`` approaches ``n`` use α well above 0 or ``cca_eps > 0``.
    """
    return _one_shot(x, y, "shape_metric",
                     MeasureSettings(shape_alpha=check_setting("shape_alpha", shape_alpha), cca_eps=check_setting("cca_eps", cca_eps)))


def cca_refusal(metrics: Sequence[str], dims_a: Sequence[int], dims_b: Sequence[int], n: int, cca_eps: float,
                names_a: Sequence[str] | None = None, names_b: Sequence[str] | None = None, *,
                shape_alpha: float = 0.5) -> str | None:
    """One line refusing a comparison up front, or None: the layers with ``n − 1`` features or more, for
    which every pair's ``cca``, ``pwcca`` (and ``shape_metric`` with ``shape_alpha`` = 0) would be NaN
    (with ``cca_eps`` = 0, ``n`` samples, generic data: the layer's rank reaches ``n − 1``, every canonical
    correlation is 1), and the fixes. ``svcca`` keeps fewer components and is not refused (it is one of
    the fixes); pairs that are degenerate only together (``rank_x + rank_y > n − 1``) are NaN with a
    warning when computed. ``names_*``: layer names (default ``A[i]``, ``B[j]``).
    """
    chosen = [m for m in metrics if m in ("cca", "pwcca") or (m == "shape_metric" and shape_alpha == 0)]
    if not chosen or cca_eps > 0:
        return None
    labels_a = list(names_a) if names_a is not None else [f"A[{i}]" for i in range(len(dims_a))]
    labels_b = list(names_b) if names_b is not None else [f"B[{j}]" for j in range(len(dims_b))]
    wide = [f"{name} ({d} features)" for names, dims in ((labels_a, dims_a), (labels_b, dims_b))
            for name, d in zip(names, dims, strict=True) if int(d) >= n - 1]
    if not wide:
        return None
    what = " and ".join(chosen) if len(chosen) <= 2 else ", ".join(chosen[:-1]) + " and " + chosen[-1]
    return (f"{what} would be undefined (NaN) for every pair of layer{'s' if len(wide) > 1 else ''} "
            f"{', '.join(wide)}: at n = {n} samples a layer with n - 1 = {n - 1} features or more makes every "
            "canonical correlation 1 whatever the data. Set `cca_eps` > 0 (ridge), reduce the layer (`reduce`=mean), "
            "use svcca instead, or use more than "
            f"{max(int(d) for d in (*dims_a, *dims_b)) + 1} samples")
