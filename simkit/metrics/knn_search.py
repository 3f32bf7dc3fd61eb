"""The exact k-NN search behind :func:`simkit.metrics.knn.knn_indices`: a float32 screen, a float64 decision.

For ``x (n, p)`` and every row ``i``, the ``k`` rows ``j ≠ i`` of largest ``x_i·x_j`` (ties: the lower
index first), computed in three steps:

1. **Screen** (float32, the expensive ``n²·p`` part): each row's ``m = min(n − 1, k + 2)`` largest
   float32 inner products and the ``m``-th of them, the *floor*. Every row outside the candidates has a
   float32 product ``≤ floor`` (whatever order ties come in). Two backends:

   * ``"torch"``: square tiles of the upper block triangle only (``x xᵀ`` is symmetric, so half the
     products), each tile's top-m merged into both its rows' and its columns' running candidates;
   * ``"faiss"``: faiss-cpu's exact flat inner-product index (``IndexFlatIP``), when installed
     (``pip install 'simkit[fast]'``); CPU tensors only.

2. **Decide** (float64, ``n·m·p``): the candidates' products recomputed in float64 and ranked by
   (value descending, index ascending); the first ``k`` are the neighbours.

3. **Check**: a float32 product is within ``γ·‖x_i‖·‖x_j‖`` of the exact one
   (``γ = (p + 4)·u / (1 − (p + 4)·u)``, ``u = 2⁻²⁴``, or ``2⁻¹¹`` where CUDA matmuls may use TF32: the
   classical bound for any summation order, input rounding to float32 included). A row whose k-th
   float64 value exceeds ``floor + (γ + 3·γ₆₄)·‖x_i‖·max‖x_j‖`` provably has no neighbour outside its
   candidates, and no row outside can even tie with the k-th. Every other row (ties at the boundary,
   duplicate points, zero rows) is recomputed by the plain exact path: one float64 block of rows against
   all rows, top-k with the same tie rule (:func:`exact_rows`).

So the neighbour sets are those of float64 inner products for float32 and float64 inputs alike, and do
not depend on the backend, the tile size, the thread count or the device (equal float64 values are ties
broken by index; different float64 routines may round the last bit differently, so only products that
are exact, e.g. small-integer data, give guaranteed equal values).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from simkit.errors import SimkitError

#: Rows (and columns) of one screening tile: a ``TILE × TILE`` float32 block is held at a time.
TILE = 2048
#: The smallest tile used (a smaller ``chunk`` is raised to it: tiny tiles only add per-tile overhead).
MIN_TILE = 32
#: Candidates kept per row beyond ``k`` (a wider screen makes the float64 check fail less often, at the
#: price of a slower top-m in every tile).
SCREEN_EXTRA = 2
#: Similarity entries per block of the exact path (rows × n) and of the float64 decision (rows × m × p).
BLOCK_ELEMENTS = 2**22
BACKENDS = ("auto", "torch", "faiss")

Progress = Callable[[int], None] | None


def faiss_available() -> bool:
    """True when the optional faiss-cpu package imports."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """``"torch"`` or ``"faiss"`` for ``backend`` (None/"auto": torch, the faster on the CPUs measured in
    ``benchmarks/bench_knn.py``, also the only one on a GPU); faiss asked for but missing is an error."""
    backend = backend or "auto"
    if backend not in BACKENDS:
        raise SimkitError(f"unknown k-NN `backend` {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "faiss":
        if device.type != "cpu":
            raise SimkitError("the faiss k-NN `backend` runs on the CPU only; use backend='torch' on "
                              f"{device.type} tensors")
        if not faiss_available():
            raise SimkitError("the faiss k-NN `backend` needs faiss-cpu, which is not installed; "
                              "pip install 'simkit[fast]' (or faiss-cpu), or use backend='torch'")
        return "faiss"
    return "torch"


def screen_size(k: int, n: int) -> int:
    """Candidates per row of the float32 screen: ``min(n − 1, k + SCREEN_EXTRA)``."""
    return min(n - 1, k + SCREEN_EXTRA)


def _unit_roundoff(device: torch.device) -> float:
    if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return 2.0**-11
    return 2.0**-24


def _merge(vals: Tensor, idx: Tensor, rows: slice, s: Tensor, first_col: int, m: int) -> None:
    """Merge the top-``m`` of each row of a tile ``s`` (its columns start at ``first_col``) into the running
    candidates ``vals``/``idx`` of ``rows``, in place."""
    v, j = s.topk(min(m, s.shape[1]), dim=1, sorted=False)
    both_v = torch.cat([vals[rows], v], 1)
    both_i = torch.cat([idx[rows], j + first_col], 1)
    keep_v, pos = both_v.topk(m, dim=1, sorted=False)
    vals[rows] = keep_v
    idx[rows] = both_i.gather(1, pos)


def screen_torch(x32: Tensor, m: int, tile: int, progress: Progress = None) -> tuple[Tensor, Tensor]:
    """Top-``m`` float32 inner products of each row of ``x32 (n, p)``, self excluded, from the upper block
    triangle of tiles: ``(floor (n,) float32, candidates (n, m) int64)``, unordered."""
    n = len(x32)
    vals = torch.full((n, m), -torch.inf, dtype=x32.dtype, device=x32.device)
    idx = torch.zeros(n, m, dtype=torch.long, device=x32.device)
    for i0 in range(0, n, tile):
        rows = slice(i0, min(n, i0 + tile))
        xi = x32[rows]
        for j0 in range(i0, n, tile):
            cols = slice(j0, min(n, j0 + tile))
            s = xi @ x32[cols].T
            if j0 == i0:
                s.fill_diagonal_(-torch.inf)
            _merge(vals, idx, rows, s, j0, m)
            if j0 != i0:  # the same products serve the columns' rows (a copy: top-k along rows is faster)
                _merge(vals, idx, cols, s.T.contiguous(), i0, m)
        if progress is not None:
            progress(rows.stop - rows.start)
    return vals.amin(1), idx


def screen_faiss(x32: Tensor, m: int, progress: Progress = None) -> tuple[Tensor, Tensor]:
    """Top-``m + 1`` float32 inner products of each row of ``x32 (n, p)`` from faiss's exact flat index
    (the row itself may be among them): ``(floor (n,) float32, candidates (n, m + 1) int64)``."""
    import faiss
    import numpy as np

    faiss.omp_set_num_threads(torch.get_num_threads())
    arr = np.ascontiguousarray(x32.numpy())
    index = faiss.IndexFlatIP(arr.shape[1])
    index.add(arr)
    n = len(arr)
    floor = torch.empty(n, dtype=torch.float32)
    cand = torch.empty(n, m + 1, dtype=torch.long)
    step = 4096
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        d, i = index.search(arr[r0:r1], m + 1)
        floor[r0:r1] = torch.from_numpy(d[:, -1])
        cand[r0:r1] = torch.from_numpy(i)
        if progress is not None:
            progress(r1 - r0)
    return floor, cand


def order_rows(values: Tensor, cand: Tensor) -> tuple[Tensor, Tensor]:
    """Sort each row's ``cand (c, m)`` by ``values (c, m)`` descending, ties by ascending index."""
    cand, pos = cand.sort(1)
    values = values.gather(1, pos)
    values, pos = values.sort(dim=1, descending=True, stable=True)
    return values, cand.gather(1, pos)


def decide(x: Tensor, floor: Tensor, cand: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The float64 decision and check (module docstring) for ``x (n, p)``, the screen's ``floor (n,)`` and
    ``cand (n, m)``: ``(neighbours (n, k) int64, proven (n,) bool)``; unproven rows must be redone."""
    n, p = x.shape
    u = _unit_roundoff(x.device)
    gamma32 = (p + 4) * u / (1 - (p + 4) * u)
    gamma64 = (p + 4) * 2.0**-53 / (1 - (p + 4) * 2.0**-53)
    norms = torch.linalg.vector_norm(x, dim=1, dtype=torch.float64)
    margin = (gamma32 + 3 * gamma64) * norms * norms.max()
    out = torch.empty(n, k, dtype=torch.long, device=x.device)
    proven = torch.empty(n, dtype=torch.bool, device=x.device)
    step = max(1, BLOCK_ELEMENTS // (cand.shape[1] * p))
    for r0 in range(0, n, step):
        r = slice(r0, min(n, r0 + step))
        c = cand[r]
        v = torch.bmm(x[c].double(), x[r].double()[:, :, None]).squeeze(2)   # (rows, m) float64
        v = v.masked_fill(c == torch.arange(r.start, r.stop, device=x.device)[:, None], -torch.inf)
        v, c = order_rows(v, c)
        out[r] = c[:, :k]
        proven[r] = v[:, k - 1] > floor[r].double() + margin[r]
    return out, proven


def fix_boundary_ties(s: Tensor, idx: Tensor, bad: Tensor, k: int) -> Tensor:
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


def topk_block(s: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-``k`` of each row of a similarity block ``s (c, n)``, ties to the lower index, best first.

    Self-similarities must already be ``-inf``. Returns ``(values, indices)``, both ``(c, k)``.
    """
    # one extra place reveals a tie across the boundary: the (k+1)-th value equals the k-th (the
    # self entry, -inf, cannot tie with finite values, and k <= n - 1 leaves room for it)
    vals, idx = s.topk(min(k + 1, s.shape[1]), dim=1, sorted=True)
    bad = vals[:, k] == vals[:, k - 1] if vals.shape[1] > k else torch.zeros(len(s), dtype=torch.bool, device=s.device)
    idx = fix_boundary_ties(s, idx[:, :k], bad, k)
    return order_rows(s.gather(1, idx), idx)


def exact_rows(x: Tensor, rows: Tensor, k: int) -> Tensor:
    """The plain exact path for ``rows (r,)`` of ``x (n, p)``: float64 products against every row, self
    excluded, top-k with the tie rule → ``(r, k)`` int64. Blocks of rows hold ``≤ BLOCK_ELEMENTS`` entries."""
    n = len(x)
    xd = x.double()
    out = torch.empty(len(rows), k, dtype=torch.long, device=x.device)
    step = max(1, BLOCK_ELEMENTS // n)
    for b0 in range(0, len(rows), step):
        r = rows[b0:b0 + step]
        s = xd[r] @ xd.T
        s[torch.arange(len(r), device=x.device), r] = -torch.inf
        out[b0:b0 + step] = topk_block(s, k)[1]
    return out


def search(x: Tensor, k: int, tile: int | None = None, backend: str | None = None,
           progress: Progress = None) -> Tensor:
    """Exact top-``k`` neighbours of the rows of ``x (n, p)`` (floating, finite, ``1 ≤ k ≤ n − 1``) by inner
    product, self excluded: ``(n, k)`` int64, most similar first (module docstring). ``progress(rows)`` is
    called as rows of the screen finish (``n`` in all)."""
    n = len(x)
    which = resolve_backend(backend, x.device)
    m = screen_size(k, n)
    tile = max(MIN_TILE, int(tile or TILE))
    if m == n - 1 or n <= 2 * tile:  # small: the exact path on every row costs no more
        out = exact_rows(x, torch.arange(n, device=x.device), k)
        if progress is not None:
            progress(n)
        return out
    x32 = x.detach().float().contiguous()
    if which == "faiss":
        floor, cand = screen_faiss(x32.cpu(), m, progress)
    else:
        floor, cand = screen_torch(x32, m, tile, progress)
    del x32
    out, proven = decide(x, floor, cand, k)
    redo = torch.nonzero(~proven).flatten()
    if len(redo):
        out[redo] = exact_rows(x, redo, k)
    return out
