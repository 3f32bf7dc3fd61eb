"""Inference over a measure's grid: p-values per cell, their correction, and a null for the best pair.

Every function takes numpy arrays and is torch-free:

* :func:`permutation_p`: ``(1 + #{null ≥ observed}) / (1 + K)`` per cell from K permutation draws (``≤``
  for a distance, where lower is more similar): the draws count as one more draw, so the p-value is never
  0 and a test at level α is exact under exchangeability.
* :func:`pearson3_p`: the upper tail of a Pearson type III distribution matched to the exact permutation
  mean, variance and third cumulant of a statistic (:mod:`simkit.metrics.permutation_moments`), as
  FactoMineR's ``coeffRV`` tests the RV coefficient (Josse, Pagès & Husson 2008) with scipy's
  ``pearson3``: a p-value far below ``1 / K`` without K permutations.
* :func:`holm` (family-wise error) and :func:`benjamini_hochberg` (false discovery rate, scipy's
  ``false_discovery_control``), applied by :func:`correct` to the cells of one measure's grid.
* :func:`best_pair`: the grid's best cell and its max-corrected p-value: under each permutation the grid
  maximum (minimum for a distance) is recomputed, and one permutation of B's samples serves every layer
  of B, so those maxima are exact draws of the maximum's null.
* :func:`calibrated`: ``(v − τ) / (best − τ)`` clipped at 0, ``best`` the measure's best value (1 for the
  CKA family) and τ the critical threshold at level α (:func:`critical_value`: the order statistic of the
  value and its permutation draws that the calibrated-similarity package calls ``tau``).
* :func:`p_value_permutations`: how many permutations a measure draws with p-values.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from simkit.settings.pvalues import ALPHA

#: the permutations drawn with p-values for the null of the best pair (and the null band) when the cells'
#: p-values need none (a moment-matched measure): its max-corrected p-value is then at least 1/200
MAX_NULL_DRAWS = 199


def p_value_permutations(cells: int, moment_matched: bool) -> int:
    """The permutations a measure draws with p-values (``null`` not given): :data:`MAX_NULL_DRAWS` for a
    moment-matched measure (its cells need none), else enough that ``1 / (K + 1)`` lies below Holm's first
    threshold ``ALPHA / cells`` (K = ⌈cells / ALPHA⌉, 6160 for a 14 × 22 grid)."""
    if moment_matched:
        return MAX_NULL_DRAWS
    return max(MAX_NULL_DRAWS, math.ceil(cells / ALPHA))


def _oriented(similarity: bool) -> Callable[[np.ndarray], np.ndarray]:
    """Values turned so that higher is always more similar (a distance negated)."""
    return (lambda a: a) if similarity else (lambda a: -a)


def permutation_p(value: np.ndarray, draws: np.ndarray, similarity: bool) -> np.ndarray:
    """Per cell ``(1 + #{draw ≥ value}) / (1 + K)`` (``≤`` for a distance) over the finite draws of ``draws``
    ``(K, ...)``; NaN where the value is NaN or no draw is finite."""
    turn = _oriented(similarity)
    value, draws = turn(np.asarray(value, dtype=np.float64)), turn(np.asarray(draws, dtype=np.float64))
    finite = np.isfinite(draws)
    with np.errstate(invalid="ignore"):
        at_least = (finite & (draws >= value[None])).sum(0)
    count = finite.sum(0)
    p = (1.0 + at_least) / (1.0 + count)
    return np.where(np.isfinite(value) & (count > 0), p, np.nan)


def pearson3_p(statistic: np.ndarray, k1: np.ndarray, k2: np.ndarray, k3: np.ndarray) -> np.ndarray:
    """Upper-tail p-values ``P(S ≥ statistic)`` of a Pearson type III fit (``scipy.stats.pearson3``) to a
    permutation distribution with mean ``k1``, variance ``k2`` and third cumulant ``k3`` (arrays of one
    shape). A distribution with no spread (every permutation gives the statistic) gives 1; the fit's
    upper bound (negative skew) is floored at the smallest positive float. NaN where any input is."""
    from scipy.stats import pearson3

    stat, k1, k2, k3 = (np.asarray(a, dtype=np.float64) for a in (statistic, k1, k2, k3))
    scale = np.maximum(np.abs(k1), np.abs(stat))
    spread = k2 > 1e-24 * np.maximum(scale * scale, np.finfo(float).tiny)
    safe = np.where(spread, k2, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (stat - k1) / np.sqrt(safe)
        skew = np.clip(k3 / safe**1.5, -1e3, 1e3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            p = pearson3.sf(np.nan_to_num(z), np.nan_to_num(skew))
    p = np.maximum(np.where(spread, p, 1.0), np.finfo(float).tiny)
    known = np.isfinite(stat) & np.isfinite(k1) & np.isfinite(k2) & np.isfinite(k3)
    return np.where(known, p, np.nan)


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values of a 1-D array (Holm 1979, "A simple sequentially rejective
    multiple test procedure", Scand. J. Statist. 6:65–70): sorted ascending, ``p̃_(i) = max_{j ≤ i} min(1,
    (m − j + 1)·p_(j))``; rejecting ``p̃ ≤ α`` controls the family-wise error rate at α for any dependence."""
    p = np.asarray(p, dtype=np.float64)
    m = len(p)
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(stepped) if m else stepped
    return adjusted


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values of a 1-D array (``scipy.stats.false_discovery_control``):
    rejecting ``p̃ ≤ α`` controls the false discovery rate at α for independent or positively dependent
    tests."""
    from scipy.stats import false_discovery_control

    p = np.asarray(p, dtype=np.float64)
    return false_discovery_control(p, method="bh") if len(p) else p.copy()


_ADJUST: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "holm": holm, "bh": benjamini_hochberg, "none": lambda p: np.asarray(p, dtype=np.float64).copy()}


def correct(p: np.ndarray, method: str, family: np.ndarray | None = None) -> np.ndarray:
    """``p`` (any shape) adjusted across the cells of ``family`` (bool, ``p``'s shape; default: every cell)
    by ``method`` (``holm``, ``bh`` or ``none``): the finite p-values of the family are one family; every
    other cell is NaN."""
    p = np.asarray(p, dtype=np.float64)
    keep = np.isfinite(p) & (np.ones(p.shape, dtype=bool) if family is None else np.asarray(family, dtype=bool))
    out = np.full(p.shape, np.nan)
    out[keep] = _ADJUST[method](p[keep])
    return out


def best_pair(value: np.ndarray, draws: np.ndarray | None, similarity: bool,
              family: np.ndarray | None = None) -> dict[str, Any] | None:
    """The best cell of ``value`` (La, Lb) among ``family`` (default: every cell; the maximum, the minimum
    for a distance) and its max-corrected p-value from ``draws`` (K, La, Lb): ``(1 + #{best of draw k ≥
    value}) / (1 + K)``, each draw's best taken over the same cells (NaN ignored). ``{"row", "col",
    "value", "p_max", "permutations"}``; ``p_max`` None without draws; None when no cell is finite."""
    turn = _oriented(similarity)
    value = np.asarray(value, dtype=np.float64)
    keep = np.ones(value.shape, dtype=bool) if family is None else np.asarray(family, dtype=bool)
    scored = np.where(keep & np.isfinite(value), turn(value), -np.inf)
    if not np.isfinite(scored).any():
        return None
    i, j = (int(k) for k in np.unravel_index(int(np.argmax(scored)), scored.shape))
    out: dict[str, Any] = {"row": i, "col": j, "value": float(value[i, j]), "p_max": None, "permutations": 0}
    if draws is None or len(draws) == 0:
        return out
    turned = np.where(keep[None] & np.isfinite(draws), turn(np.asarray(draws, dtype=np.float64)), -np.inf)
    maxima = turned.reshape(len(turned), -1).max(1)
    seen = np.isfinite(maxima)
    out["p_max"] = float((1 + int((maxima[seen] >= scored[i, j]).sum())) / (1 + int(seen.sum())))
    out["permutations"] = int(seen.sum())
    return out


def critical_value(value: np.ndarray, draws: np.ndarray, similarity: bool, alpha: float = ALPHA) -> np.ndarray:
    """τ per cell: the ``⌈(1 − α)(K + 1)⌉``-th smallest of the observed value and its K permutation
    ``draws (K, ...)`` (for a distance, the same order statistic from the other end), the critical
    threshold of the calibrated-similarity package (Gröger et al., ``calibrate``'s ``tau``), so that a
    value at or below it is not distinguishable from chance at level α. NaN draws are left out; NaN where
    no draw is finite or the value is NaN."""
    value = np.asarray(value, dtype=np.float64)
    sign = 1.0 if similarity else -1.0
    combined = sign * np.concatenate([value[None], np.asarray(draws, dtype=np.float64)], axis=0)
    finite = np.isfinite(combined)
    count = finite.sum(0)
    ranked = np.sort(np.where(finite, combined, np.inf), axis=0)         # NaN draws sorted past the end
    index = np.clip(np.ceil((1.0 - alpha) * count).astype(np.int64) - 1, 0, None)
    tau = np.take_along_axis(ranked, np.minimum(index, len(combined) - 1)[None], axis=0)[0]
    return np.where(np.isfinite(value) & (count > 1), sign * tau, np.nan)


def calibrated(value: np.ndarray, chance: np.ndarray, best: float | None, similarity: bool) -> np.ndarray:
    """``(v − τ) / (best − τ)`` clipped at 0 per cell (``(τ − v) / (τ − best)`` for a distance): 0 at or
    below τ, 1 at the measure's best value ``best``; NaN where ``best`` is None or τ is the best. ``chance``
    is τ: the callers give :func:`critical_value` of the permutation draws (the calibrated-similarity
    package's score, 0 under the null at level α)."""
    value, chance = np.asarray(value, dtype=np.float64), np.asarray(chance, dtype=np.float64)
    if best is None:
        return np.full(value.shape, np.nan)
    gain, room = (value - chance, best - chance) if similarity else (chance - value, chance - best)
    with np.errstate(invalid="ignore", divide="ignore"):
        score = np.where(room > 0, gain / np.where(room > 0, room, 1.0), np.nan)
    return np.where(np.isfinite(score), np.maximum(score, 0.0), np.nan)
