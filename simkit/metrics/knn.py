"""Exact k-nearest neighbours in chunks, the mutual k-NN alignment score (spec §0.4) and the Jaccard
k-NN overlap (ReSi).

Neighbours are ranked by inner product, the point itself excluded. Rows are processed ``chunk`` at a
time, so memory beyond the input is ``O(n·k + chunk·n)`` — never an ``n × n`` matrix — and time is
``O(n²·p)`` (``benchmarks/bench_knn.py`` measures n = 50,000 × 512).

Ties are broken deterministically and independently of ``chunk``: among equal similarities the lower
index wins, both for membership at the k-th place and for the order inside the k neighbours. (Equal
*values* are only guaranteed when the products are computed exactly, e.g. small-integer data; for
general floats the BLAS may round one block differently from another.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from simkit.metrics._checks import (
    as_matrix,
    check_chunk,
    check_k,
    check_same_n,
    exact_quantile,
    is_constant,
    warn_undefined,
)

#: Default block size: about this many similarity entries (``chunk · n``) are held at once.
CHUNK_ELEMENTS = 2**24


def default_chunk(n: int) -> int:
    """Rows per block so that a block of similarities holds about :data:`CHUNK_ELEMENTS` entries."""
    return max(1, min(n, CHUNK_ELEMENTS // max(n, 1)))


def _fix_boundary_ties(s: Tensor, idx: Tensor, bad: Tensor, k: int) -> Tensor:
    """Redo the rows ``bad (c,)`` of ``idx (c, k)`` whose k-th value is tied outside the top-k: among
    the tied entries, the lowest indices are taken."""
    if not bool(bad.any()):
        return idx
    sb = s[bad]
    kb = sb.gather(1, idx[bad][:, k - 1 : k])
    greater = sb > kb
    equal = sb == kb
    need = k - greater.sum(1, keepdim=True)
    chosen = greater | (equal & (equal.cumsum(1) <= need))
    idx = idx.clone()
    idx[bad] = chosen.nonzero()[:, 1].view(-1, k)
    return idx


def _order(s: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    """Sort ``idx (c, k)`` by similarity descending, ties by ascending index; returns (values, indices)."""
    idx = idx.sort(1).values
    vals = s.gather(1, idx)
    vals, pos = vals.sort(dim=1, descending=True, stable=True)
    return vals, idx.gather(1, pos)


def topk_block(s: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-``k`` of each row of a similarity block ``s (c, n)`` with the module's tie rule.

    Self-similarities must already be set to ``-inf`` by the caller. Returns ``(values, indices)``,
    both ``(c, k)``, best first.
    """
    # one extra place reveals a tie across the boundary: the (k+1)-th value equals the k-th (the
    # self entry, -inf, cannot tie with finite values, and k <= n - 1 leaves room for it)
    vals, idx = s.topk(min(k + 1, s.shape[1]), dim=1, sorted=True)
    bad = vals[:, k] == vals[:, k - 1] if vals.shape[1] > k else torch.zeros(len(s), dtype=torch.bool, device=s.device)
    idx = _fix_boundary_ties(s, idx[:, :k], bad, k)
    return _order(s, idx)


def knn_indices(x, k: int, chunk: int | None = None) -> Tensor:
    """Exact top-``k`` neighbours by inner product of the rows of ``x (n, p)``, self excluded.

    Computed in ``x``'s floating dtype, ``chunk`` rows at a time (default :func:`default_chunk`).
    Returns int64 ``(n, k)``, most similar first; ties as described in the module docstring.
    """
    x = as_matrix(x, "x", dtype=None)
    n = len(x)
    check_k(k, n)
    check_chunk(chunk)
    chunk = int(chunk or default_chunk(n))
    out = torch.empty(n, k, dtype=torch.long, device=x.device)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        s = x[start:stop] @ x.T
        rows = torch.arange(stop - start, device=x.device)
        s[rows, rows + start] = -torch.inf
        out[start:stop] = topk_block(s, k)[1]
    return out


def knn_overlap(a: Tensor, b: Tensor) -> Tensor:
    """Per-row count of shared neighbours ``|N_a(i) ∩ N_b(i)|`` for index sets ``a, b (n, k)`` → ``(n,)``."""
    out = torch.empty(len(a), dtype=torch.long, device=a.device)
    step = max(1, 2**22 // max(1, a.shape[1] * b.shape[1]))
    for start in range(0, len(a), step):
        sa, sb = a[start : start + step], b[start : start + step]
        out[start : start + step] = (sa[:, :, None] == sb[:, None, :]).any(-1).sum(-1)
    return out


def clamp_normalize(x: Tensor, q: float = 0.95) -> Tensor:
    """Huh et al.'s preprocessing of ``x (n, p)``: clamp to ±(``q``-quantile of ``|x|`` over the whole
    matrix, linear interpolation), then L2-normalise the rows (zero rows stay zero). Same shape.

    The quantile is exact for any size (:func:`~simkit.metrics._checks.exact_quantile`).
    """
    bound = exact_quantile(x.detach().abs(), q)
    return F.normalize(x.clamp(-bound, bound), dim=1)


def _neighbour_sets(x, y, k: int, chunk: int | None, dtype: torch.dtype, metric: str) -> tuple[Tensor, Tensor] | None:
    """Both inputs' k-NN index sets ``(n, k)`` after :func:`clamp_normalize`; None (after a warning) when an
    input is constant (every neighbour would be a tie)."""
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    if xt.dim() >= 1 and yt.dim() >= 1:
        check_same_n(xt.shape[0], yt.shape[0])
    xt = as_matrix(xt, "x", dtype)
    yt = as_matrix(yt, "y", dtype)
    check_k(k, len(xt))
    for name, t in (("x", xt), ("y", yt)):
        if is_constant(t):  # every neighbour would be a tie: the score would reflect only the tie rule
            warn_undefined(f"{name} is constant: every example has the same activation", 4, metric)
            return None
    return knn_indices(clamp_normalize(xt), k, chunk), knn_indices(clamp_normalize(yt), k, chunk)


def mutual_knn(x, y, k: int = 10, chunk: int | None = None, dtype: torch.dtype = torch.float64) -> float:
    """Mutual k-NN alignment (Huh et al. 2024) of ``x (n, p)`` and ``y (n, q)``: a float in [0, 1].

    Both matrices go through :func:`clamp_normalize`; the score is ``mean_i |N_k^x(i) ∩ N_k^y(i)| / k``
    with neighbours by inner product, self excluded (:func:`knn_indices`). Computed in ``dtype``
    (float64 by default; float32 halves time and memory at large ``n``), ``chunk`` rows at a time.
    Not differentiable: a metric only (see ``losses.soft_mutual_knn`` for a smooth relative). A
    constant input (all neighbours tied) gives NaN and a warning, like CKA.
    """
    sets = _neighbour_sets(x, y, k, chunk, dtype, "mutual k-NN")
    if sets is None:
        return float("nan")
    return float(knn_overlap(*sets).double().mean() / k)


def jaccard_knn(x, y, k: int = 10, chunk: int | None = None, dtype: torch.dtype = torch.float64) -> float:
    """Jaccard k-NN overlap (ReSi, Klabunde et al. 2023) of ``x (n, p)`` and ``y (n, q)``: a float in [0, 1].

    ``mean_i |N_k^x(i) ∩ N_k^y(i)| / |N_k^x(i) ∪ N_k^y(i)|``, i.e. ``c_i / (2k − c_i)`` with ``c_i`` the shared
    neighbours; the same neighbour sets as :func:`mutual_knn` (:func:`clamp_normalize`, inner product, self
    excluded, :func:`knn_indices`). 1 for identical neighbourhoods. NaN and a warning for a constant input.
    """
    sets = _neighbour_sets(x, y, k, chunk, dtype, "jaccard k-NN")
    if sets is None:
        return float("nan")
    c = knn_overlap(*sets).double()
    return float((c / (2 * k - c)).mean())
