"""Exact k-nearest neighbours in chunks, the mutual k-NN alignment score (spec §0.4) and the Jaccard
k-NN overlap (ReSi).

Neighbours are ranked by inner product, the point itself excluded (:mod:`simkit.metrics.knn_search`:
a float32 screen of half the ``n²`` products in tiles, then a float64 decision with a proven error
bound, the plain float64 path for the rows it cannot prove). Memory beyond the input is
``O(n·(k + p) + chunk²)`` — never an ``n × n`` matrix — and time ``O(n²·p / 2)`` in float32
(``benchmarks/bench_knn.py`` measures n = 50,000 × 512).

Ties are broken deterministically and independently of ``chunk``, the backend and the dtype: among
equal float64 similarities the lower index wins, both for membership at the k-th place and for the
order inside the k neighbours. (Equal *values* are only guaranteed when the products are computed
exactly, e.g. small-integer data; for general floats two float64 routines may round the last bit
differently.)
"""

from __future__ import annotations

from collections.abc import Callable

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
    row_eps,
    warn_undefined,
)
from simkit.metrics.knn_search import search

#: Entries of one block of per-row work elsewhere in simkit.metrics (D-MNN's KL stage).
CHUNK_ELEMENTS = 2**24


def knn_indices(x, k: int, chunk: int | None = None, backend: str | None = None,
                progress: Callable[[int], None] | None = None) -> Tensor:
    """Exact top-``k`` neighbours by inner product of the rows of ``x (n, p)``, self excluded.

    Returns int64 ``(n, k)``, most similar first; ties to the lower index (module docstring). The search
    (:mod:`simkit.metrics.knn_search`) screens in float32 and decides in float64, so the sets are those
    of float64 inner products whatever ``x``'s dtype, ``chunk`` (rows and columns of one screening tile,
    default :data:`~simkit.metrics.knn_search.TILE`, at least ``MIN_TILE``) and ``backend`` (``"auto"``/None: torch;
    ``"torch"``; ``"faiss"``: faiss-cpu's flat index, optional). ``progress(rows)`` is called as rows of
    the screen finish (``n`` in all); None: silent.
    """
    x = as_matrix(x, "x", dtype=None)
    check_k(k, len(x))
    check_chunk(chunk)
    return search(x, int(k), tile=None if chunk is None else int(chunk), backend=backend, progress=progress)


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
    return F.normalize(x.clamp(-bound, bound), dim=1, eps=row_eps(x.dtype))


def _neighbour_sets(x, y, k: int, chunk: int | None, dtype: torch.dtype, metric: str,
                    backend: str | None) -> tuple[Tensor, Tensor] | None:
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
    return (knn_indices(clamp_normalize(xt), k, chunk, backend),
            knn_indices(clamp_normalize(yt), k, chunk, backend))


def mutual_knn(x, y, k: int = 10, chunk: int | None = None, dtype: torch.dtype = torch.float64,
               backend: str | None = None) -> float:
    """Mutual k-NN alignment (Huh et al. 2024) of ``x (n, p)`` and ``y (n, q)``: a float in [0, 1].

    Both matrices go through :func:`clamp_normalize`; the score is ``mean_i |N_k^x(i) ∩ N_k^y(i)| / k``
    with neighbours by inner product, self excluded (:func:`knn_indices`, ``chunk`` and ``backend`` as
    there). The preprocessing runs in ``dtype`` (float64 by default; float32 halves its memory), the
    search screens in float32 and decides in float64 either way.
    Not differentiable: a metric only (see ``losses.soft_mutual_knn`` for a smooth relative). A
    constant input (all neighbours tied) gives NaN and a warning, like CKA.
    """
    sets = _neighbour_sets(x, y, k, chunk, dtype, "mutual k-NN", backend)
    if sets is None:
        return float("nan")
    return float(knn_overlap(*sets).double().mean() / k)


def jaccard_knn(x, y, k: int = 10, chunk: int | None = None, dtype: torch.dtype = torch.float64,
                backend: str | None = None) -> float:
    """Jaccard k-NN overlap (ReSi, Klabunde et al. 2023) of ``x (n, p)`` and ``y (n, q)``: a float in [0, 1].

    ``mean_i |N_k^x(i) ∩ N_k^y(i)| / |N_k^x(i) ∪ N_k^y(i)|``, i.e. ``c_i / (2k − c_i)`` with ``c_i`` the shared
    neighbours; the same neighbour sets as :func:`mutual_knn` (:func:`clamp_normalize`, inner product, self
    excluded, :func:`knn_indices`). 1 for identical neighbourhoods. NaN and a warning for a constant input.
    """
    sets = _neighbour_sets(x, y, k, chunk, dtype, "jaccard k-NN", backend)
    if sets is None:
        return float("nan")
    c = knn_overlap(*sets).double()
    return float((c / (2 * k - c)).mean())
