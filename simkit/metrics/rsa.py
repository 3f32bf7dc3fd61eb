"""Representational similarity analysis (Kriegeskorte et al. 2008; rsatoolbox's defaults).

Each layer's representational dissimilarity matrix (RDM) over the ``n`` samples, ``rsa_distance``:
``correlation`` (``1 − Pearson r`` between two samples' activation vectors), ``euclidean`` or ``cosine``
(``1 − cos``); two RDMs are compared on their upper triangles (``m = n(n−1)/2`` entries) by
``rsa_compare``: ``spearman`` (Pearson of average ranks), ``pearson`` or ``kendall_tau_a``
(``(concordant − discordant) / (m(m−1)/2)``, ties count 0; O(m log² m) per pair). Range [−1, 1], 1 for
identical RDMs (``kendall_tau_a`` with tied distances stays below 1). Invariant to anything that keeps
the RDM (rotations, and for correlation/cosine distance per-sample scaling; isotropic scaling for all
three) and, with ``spearman``/``kendall_tau_a``, to monotone maps of the distances.

Memory is ``O(n²)`` per layer: the upper triangles are built in row blocks and each layer keeps one
float64 vector of ``m`` entries. :func:`rsa_bytes` is the peak of the all-pairs computation and
:func:`rsa_max_n` the largest ``n`` a memory budget allows; above it :class:`SimkitError` says so.
An RDM is undefined (NaN, warning) when a sample's vector is constant (correlation) or zero (cosine).
"""

from __future__ import annotations

import torch
from torch import Tensor

from simkit.errors import SimkitError
from simkit.metrics._checks import CONSTANT_RTOL, as_matrix, check_same_n
from simkit.metrics.budget import over_budget
from simkit.metrics.settings import check_setting

#: memory budget of the one-shot :func:`rsa` (the accumulators use their ``memory_budget_bytes``)
DEFAULT_BUDGET = 2**30
_BLOCK = 2**22  # entries per row block of distances


def rsa_bytes(n: int, layers: int, null: bool = False) -> int:
    """Peak bytes of RSA over ``layers`` layers in all: one float64 upper triangle per layer, the rank
    workspace, and with a null one full ``n × n`` matrix to permute."""
    m = n * (n - 1) // 2
    return 8 * m * (layers + 3) + (8 * n * n if null else 0)


def rsa_max_n(budget: int, layers: int, null: bool = False) -> int:
    """The largest ``n`` with :func:`rsa_bytes` within ``budget``."""
    lo, hi = 2, 2
    while rsa_bytes(hi, layers, null) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if rsa_bytes(mid, layers, null) <= budget else (lo, mid)
    return lo


def check_rsa_n(n: int, layers: int, budget: int, null: bool = False) -> None:
    """Raise when ``n`` samples of RSA over ``layers`` layers exceed ``budget`` bytes (or n < 3)."""
    if n < 3:
        raise SimkitError(f"rsa needs at least 3 samples (2 dissimilarities), got {n}; use more samples (`n`)")
    need = rsa_bytes(n, layers, null)
    if need > budget:
        raise over_budget(f"rsa keeps one RDM (n(n-1)/2 distances) per layer: n={n} over {layers} layers needs",
                          need, budget, most_n=rsa_max_n(budget, layers, null))


def rdm_embedding(x: Tensor, distance: str) -> Tensor | None:
    """The samples ``z (n, p)`` float64 whose Euclidean geometry gives the RDM of ``x (n, p)``: unit rows,
    centred first for ``correlation`` (then ``1 − r = ½‖z_i − z_j‖²``), unit rows for ``cosine``, ``x``
    column-centred for ``euclidean``; None when undefined (a constant sample vector for ``correlation``,
    a zero one for ``cosine``)."""
    x = x.double()
    if distance == "euclidean":
        return x - x.mean(0)
    if distance == "correlation":
        z = x - x.mean(1, keepdim=True)
        bad = (z * z).sum(1) <= CONSTANT_RTOL * (x * x).sum(1)
    else:
        z = x
        bad = (x * x).sum(1) == 0
    if bool(bad.any()):
        return None
    return z / z.norm(dim=1, keepdim=True)


def rdm_upper(x: Tensor, distance: str) -> Tensor | None:
    """Upper triangle (``i < j``, row-major, ``(n(n−1)/2,)`` float64) of the RDM of ``x (n, p)``; None when
    undefined (a constant sample vector for ``correlation``, a zero one for ``cosine``)."""
    n = len(x)
    z = rdm_embedding(x, distance)
    if z is None:
        return None
    sq = (z * z).sum(1)
    step = max(1, _BLOCK // max(1, n))
    parts = []
    for start in range(0, n - 1, step):
        stop = min(n - 1, start + step)
        g = z[start:stop] @ z.T
        rows = torch.arange(start, stop, device=x.device)
        if distance == "euclidean":
            d = (sq[rows, None] + sq[None, :] - 2 * g).clamp_min(0).sqrt()
        else:
            d = 1 - g
        upper = torch.arange(n, device=x.device)[None, :] > rows[:, None]
        parts.append(d[upper])
    return torch.cat(parts) if parts else z.new_zeros(0)  # fewer than 2 samples: no pairs


def average_ranks(v: Tensor) -> Tensor:
    """1-based ranks of ``v (m,)`` with ties given their average rank (scipy's ``rankdata``), float64."""
    ordered, order = v.sort()  # any order within ties: they share their average rank
    _, inverse, counts = torch.unique_consecutive(ordered, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    mean_rank = ends - (counts.double() - 1) / 2
    out = torch.empty(len(v), dtype=torch.float64, device=v.device)
    out[order] = mean_rank[inverse]
    return out


def standardise(v: Tensor) -> Tensor | None:
    """``v`` centred and scaled to unit norm (so inner products are Pearson r); None when constant."""
    c = v - v.mean()
    norm = c.norm()
    if not bool(norm > 0) or bool(norm * norm <= CONSTANT_RTOL * (v * v).sum()):
        return None
    return c / norm


def _tie_pairs(counts: Tensor) -> int:
    c = counts.long()
    return int((c * (c - 1) // 2).sum())


def _inversions(v: Tensor) -> int:
    """Pairs ``i < j`` with ``v_i > v_j`` of an int64 vector with values in ``[0, m)``: bottom-up merge
    counts, every level vectorised (``O(m log² m)``)."""
    m = len(v)
    pos = torch.arange(m, device=v.device)
    total, width = 0, 1
    while width < m:
        block = pos // (2 * width)
        left = (pos % (2 * width)) < width
        key = block * m + v                       # runs of `width` are sorted: left keys sorted globally
        left_keys, right_keys = key[left], key[~left]
        not_greater = torch.searchsorted(left_keys, right_keys, right=True)
        block_end = torch.searchsorted(left_keys, (block[~left] + 1) * m)
        total += int((block_end - not_greater).sum())
        v = key.sort().values - block * m         # merge: sort every block of 2·width
        width *= 2
    return total


def kendall_tau_a(a: Tensor, b: Tensor) -> float:
    """Kendall's τ_a of two vectors ``(m,)``: ``(concordant − discordant) / (m(m−1)/2)``, ties count 0."""
    m = len(a)
    ra = torch.unique(a, return_inverse=True)[1]
    rb = torch.unique(b, return_inverse=True)[1]
    order = (ra * m + rb).argsort()
    joint = (ra * m + rb)[order]
    tot = m * (m - 1) // 2
    x_tie = _tie_pairs(torch.unique(ra, return_counts=True)[1])
    y_tie = _tie_pairs(torch.unique(rb, return_counts=True)[1])
    both = _tie_pairs(torch.unique_consecutive(joint, return_counts=True)[1])
    discordant = _inversions(rb[order])
    return (tot - x_tie - y_tie + both - 2 * discordant) / tot


def prepared(v: Tensor, compare: str) -> Tensor | None:
    """An RDM's upper triangle as the comparison uses it: standardised ranks (spearman), standardised
    values (pearson), raw values (kendall_tau_a); None when constant (the comparison is undefined)."""
    if compare == "spearman":
        return standardise(average_ranks(v))
    if compare == "pearson":
        return standardise(v)
    return v if standardise(v) is not None else None


def rsa(x, y, rsa_distance: str = "correlation", rsa_compare: str = "spearman") -> float:
    """RSA of ``x (n, p)`` and ``y (n, q)``: the two RDMs (``rsa_distance``) compared by ``rsa_compare``.

    Returns a float in [−1, 1]; NaN + warning when an RDM is undefined or constant. Refuses an ``n`` whose
    RDMs exceed :data:`DEFAULT_BUDGET` (module docstring).
    """
    import warnings

    distance = check_setting("rsa_distance", rsa_distance)
    compare = check_setting("rsa_compare", rsa_compare)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    if xt.dim() >= 1 and yt.dim() >= 1:
        check_same_n(xt.shape[0], yt.shape[0])
    xt, yt = as_matrix(xt, "x"), as_matrix(yt, "y")
    check_rsa_n(len(xt), 2, DEFAULT_BUDGET)
    vs = []
    for name, t in (("x", xt), ("y", yt)):
        v = rdm_upper(t, distance)
        p = prepared(v, compare) if v is not None else None
        if p is None:
            warnings.warn(f"rsa is undefined for `{name}`: {undefined_reason(distance, v is None)}; returning NaN",
                          RuntimeWarning, stacklevel=2)
            return float("nan")
        vs.append(p)
    if compare == "kendall_tau_a":
        return kendall_tau_a(vs[0], vs[1])
    return float(vs[0] @ vs[1])


def undefined_reason(distance: str, rdm_missing: bool) -> str:
    """Why a layer's RSA value is NaN: its RDM is undefined under ``distance`` (and the fix), or constant."""
    if not rdm_missing:
        return "its RDM is constant (all dissimilarities equal)"
    what = "constant across features" if distance == "correlation" else "zero"
    return f"with rsa_distance={distance} its RDM needs no sample vector {what}; try rsa_distance=euclidean"


def rdm(x, rsa_distance: str = "correlation") -> Tensor:
    """The full RDM ``(n, n)`` float64 of ``x (n, p)`` (zero diagonal); NaN-filled, with a warning, when undefined."""
    import warnings

    distance = check_setting("rsa_distance", rsa_distance)
    xt = as_matrix(x, "x")
    n = len(xt)
    out = torch.zeros(n, n, dtype=torch.float64)
    v = rdm_upper(xt, distance)
    if v is None:
        warnings.warn(f"the RDM of `x` is undefined: {undefined_reason(distance, True)}; returning NaN",
                      RuntimeWarning, stacklevel=2)
    iu = torch.triu_indices(n, n, 1)
    out[iu[0], iu[1]] = v if v is not None else float("nan")
    return out + out.T
