"""Moment-matched p-values of the stored CKA family (``stored-gram``): every layer's Gram traces, taken in
the blocks of Gram rows the value already makes, then every pair's Pearson type III fit.

The eight traces of :mod:`simkit.metrics.permutation_moments` come from the rows (``T``, ``T2``, ``S2``,
``S3``, ``U``, ``B``, ``R``: a few sums per row block) and from :func:`cube_trace` (``tr W³``): for a linear
Gram ``W = X̃X̃ᵀ`` it is ``tr M³`` with ``M = X̃ᵀX̃`` (``p × p``), for a U-centred one a factorised form of the
same size (:func:`_u_centred_cube`), otherwise (RBF, or a layer wider than the sample) from the whole
``n × n`` Gram. A layer ``g`` is a ``stored.GramRows``: its kind, centred samples ``xc``, rows on demand.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from simkit.metrics.inference import pearson3_p
from simkit.metrics.permutation_moments import (
    FEWEST_FOR_FORMULAS,
    block_traces,
    cumulants,
    enumerated_cumulants,
)
from simkit.metrics.streaming.common import mask_constant

#: how the stored CKA p-values are found (``describe()["p_value"]``)
STORED_P_VALUE = ("Pearson type III fit of the exact permutation mean, variance and skewness of the Grams' inner "
                  "product (Kazi-Aoual et al. 1995, as FactoMineR's coeffRV)")


def gram_diagonal(g: Any) -> Tensor:
    """The diagonal ``(n,)`` of layer ``g``'s centred (U-centred: 0, RBF: ``1 − 2·row mean + grand mean``)
    Gram."""
    n, dev = g.n, g.xc.device
    if g.full is not None:
        return g.full.diagonal()
    if g.constant or g.kind == "unbiased":
        return torch.zeros(n, dtype=torch.float64, device=dev)
    if g.kind == "biased":
        return (g.xc * g.xc).sum(1)
    return 1.0 - 2.0 * g.row_mean + g.grand


def _cube(w: Tensor) -> float:
    """``tr W³`` of a symmetric ``W``."""
    return float(((w @ w) * w).sum())


def _u_centred_cube(g: Any) -> float:
    """``tr Ũ³`` of the U-centred linear Gram ``Ũ = Z G Zᵀ + diag(e)``: ``Z = [X̃, m, 1]``, ``G`` the identity
    with ``[[0, −1], [−1, 0]]`` for the two offset columns, ``e = 2m − diag(X̃X̃ᵀ)`` (the diagonal zeroed), so
    ``tr Ũ³ = tr (GC)³ + 3 tr(GCG·ZᵀEZ) + 3 Σ e²·(ZG ⊙ Z)1 + Σ e³`` with ``C = ZᵀZ``: ``n·(p+2)²`` work."""
    xc, m = g.xc, g.m
    ones = torch.ones_like(m)
    z = torch.cat([xc, m[:, None], ones[:, None]], 1)
    gm = torch.eye(z.shape[1], dtype=torch.float64, device=z.device)
    gm[-2:, -2:] = torch.tensor([[0.0, -1.0], [-1.0, 0.0]], dtype=torch.float64, device=z.device)
    e = 2 * m - (xc * xc).sum(1)
    gc = gm @ (z.T @ z)
    first = float(torch.trace(gc @ gc @ gc))
    second = float(torch.trace(gc @ gm @ ((z * e[:, None]).T @ z)))
    third = float((e * e * ((z @ gm) * z).sum(1)).sum())
    return first + 3 * second + 3 * third + float((e ** 3).sum())


def cube_trace(g: Any) -> float:
    """``tr W³`` of layer ``g``'s (centred, U-centred or RBF) Gram, in the smaller of feature and sample
    space."""
    if g.constant:
        return 0.0
    if g.full is not None:
        return _cube(g.full)
    narrow = g.xc.shape[1] + 2 < g.n
    if g.kind == "biased" and narrow:
        return _cube(g.xc.T @ g.xc)
    if g.kind == "unbiased" and narrow:
        return _u_centred_cube(g)
    return _cube(g.rows(torch.arange(g.n, device=g.xc.device)))


class GramTraces:
    """Every layer's traces of A and of B, fed with the blocks of Gram rows of :meth:`StoredPart._gram`."""

    def __init__(self, ga: list[Any], gb: list[Any]):
        self.ga, self.gb = ga, gb
        self.diag = [torch.stack([gram_diagonal(g) for g in side]) for side in (ga, gb)]
        dev = self.diag[0].device
        self.sums = [torch.zeros(len(side), 8, dtype=torch.float64, device=dev) for side in (ga, gb)]

    def add(self, rows_a: Tensor, rows_b: Tensor, idx: Tensor) -> None:
        """Add one block: ``rows_* (L, len(idx)·n)``, the rows ``idx`` of every layer's Gram, flattened."""
        for k, rows in enumerate((rows_a, rows_b)):
            diag = self.diag[k]
            self.sums[k].add_(block_traces(rows.view(len(diag), len(idx), -1), diag[:, idx], diag))

    def cumulants(self) -> Tensor:
        """The permutation cumulants ``(3, La, Lb)`` of every pair's inner product of Grams."""
        n = self.ga[0].n
        if n < FEWEST_FOR_FORMULAS:
            every = torch.arange(n, device=self.diag[0].device)
            full = [torch.stack([g.rows(every) for g in side]) for side in (self.ga, self.gb)]
            return enumerated_cumulants(full[0], full[1])
        for sums, side in zip(self.sums, (self.ga, self.gb), strict=True):
            sums[:, 2] = torch.tensor([cube_trace(g) for g in side], dtype=torch.float64, device=sums.device)
        return cumulants(self.sums[0], self.sums[1], n)

    def p_values(self, cross: Tensor, self_a: Tensor, self_b: Tensor, const_a: Tensor,
                 const_b: Tensor) -> dict[str, np.ndarray]:
        """``p_value`` of every pair (the fit's upper tail at the observed inner product ``cross``) and its
        ``chance`` (the exact permutation mean of the CKA value)."""
        k1, k2, k3 = self.cumulants()
        norm = torch.sqrt(self_a[:, None] * self_b[None, :])
        chance = mask_constant(k1 / torch.where(norm > 0, norm, torch.ones_like(norm)), const_a, const_b)
        p = pearson3_p(*(t.cpu().numpy() for t in (cross, k1, k2, k3)))
        p[np.isnan(chance.cpu().numpy())] = np.nan
        return {"p_value": p, "chance": chance.cpu().numpy()}
