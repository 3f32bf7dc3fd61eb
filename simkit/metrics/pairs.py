"""Measures computed pair by pair from each layer prepared once: ``cknna``, ``cycle_knn`` (Huh et al. 2024,
platonic-rep), ``distance_correlation`` (Székely et al. 2007; bias-corrected: Székely & Rizzo 2014),
``information_imbalance`` (Glielmo et al. 2022) and ``bures_similarity`` (the normalised Bures similarity of
rsatoolbox; Harvey et al. 2023), and the same shape for a user's plug-in (:class:`PluginPair`).

Each is a :class:`PairMeasure`: ``prepare(x, side)`` makes what a layer ``x (n, p)`` contributes (once per
layer, ``side`` ``"a"`` or ``"b"`` for the directional ones), ``permuted(prep, perm)`` the same for the
samples reordered by ``perm`` (B's side of a permutation null), ``pair(prep_a, prep_b)`` the value (a
0-d float64 tensor). The one-shot functions below and the stored strategy's ``pairwise`` and ``plugin``
families (:mod:`simkit.metrics.streaming.pairwise`) use the same three steps, so every path agrees.

Neighbours: :func:`~simkit.metrics.knn.clamp_normalize` then :func:`~simkit.metrics.knn.knn_indices` (inner
product, self excluded, ties to the lower index), as ``mutual_knn``. Distances: exact float64 Euclidean
distances (``torch.cdist`` without the Gram shortcut).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from simkit.errors import SimkitError
from simkit.metrics._checks import as_matrix, check_k, check_min_n, check_same_n, is_constant, warn_undefined
from simkit.metrics.cka import center_gram, cka_ratio, hsic1_from_terms, u_center_gram
from simkit.metrics.knn import clamp_normalize, knn_indices
from simkit.metrics.rsa import rdm_embedding, rdm_upper
from simkit.metrics.settings import MeasureSettings, check_setting


class PairMeasure(Protocol):
    """A measure computed pair by pair from layers prepared once (module docstring)."""

    name: str
    minimum_n: int

    def prepare(self, x: Tensor, side: str) -> Any: ...

    def permuted(self, prep: Any, perm: Tensor) -> Any: ...

    def pair(self, prep_a: Any, prep_b: Any) -> Tensor: ...

    def layer_bytes(self, n: int, width: int) -> int: ...


def _distances(x: Tensor) -> Tensor:
    """Exact Euclidean distances ``(n, n)`` float64 of the rows of ``x (n, p)`` (no Gram shortcut)."""
    xd = x.double()
    return torch.cdist(xd, xd, compute_mode="donot_use_mm_for_euclid_dist")


def _reorder(matrix: Tensor, perm: Tensor) -> Tensor:
    """``matrix[π][:, π]`` of a ``(n, n)`` matrix: the samples reordered by ``perm``."""
    return matrix[perm][:, perm]


# ------------------------------------------------------------------------------------------ neighbours


class Neighbours(NamedTuple):
    """A layer's k nearest neighbours ``indices (n, k)`` and their kernel values ``kernel (n, k)`` (the inner
    products of the preprocessed rows, platonic-rep's ``K = X Xᵀ``)."""

    indices: Tensor
    kernel: Tensor


def neighbours(x: Tensor, k: int) -> Neighbours:
    """:class:`Neighbours` of ``x (n, p)`` after Huh et al.'s preprocessing (as ``mutual_knn``)."""
    z = clamp_normalize(x.double())
    indices = knn_indices(z, k)
    return Neighbours(indices, (z[:, None, :] * z[indices]).sum(-1))


def permuted_neighbours(nb: Neighbours, perm: Tensor) -> Neighbours:
    """The neighbours of the samples reordered by ``perm``: row ``i`` is sample ``π(i)``, whose neighbour
    ``s`` is now sample ``π⁻¹(s)``."""
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(len(perm), device=perm.device)
    return Neighbours(inverse[nb.indices[perm]], nb.kernel[perm])


def knn_hsic(a: Neighbours, b: Neighbours) -> Tensor:
    """Unbiased HSIC_1 of the kernels ``K``, ``L`` kept on the pairs ``(i, j)`` that are neighbours in both
    (platonic-rep's ``hsic_unbiased(mask·K, mask·L)``), from the ``n·k`` edges alone: 0-d float64."""
    n, k = a.indices.shape
    match = a.indices[:, :, None] == b.indices[:, None, :]                  # (n, k, k): A's edge s is B's edge t
    shared = match.any(2)
    k_vals = a.kernel * shared                                          # K on the shared edges, else 0
    l_vals = (match * b.kernel[:, None, :]).sum(2)                      # L on the shared edges, else 0
    col_k = torch.zeros(n, dtype=torch.float64, device=k_vals.device).index_add_(0, a.indices.flatten(),
                                                                             k_vals.flatten())
    rows = torch.arange(n, device=a.indices.device)[:, None].expand(n, k)
    codes = (rows * n + a.indices)[shared]
    reverse = (a.indices * n + rows)[shared]
    both = torch.isin(reverse, codes)                                   # (i, j) and (j, i) both kept
    trace = (k_vals[shared] * l_vals[shared])[both].sum()
    return hsic1_from_terms(n, trace, k_vals.sum(), l_vals.sum(), (col_k * l_vals.sum(1)).sum())


class Cknna:
    """CKNNA (Huh et al. 2024): unbiased CKA of the kernels kept on the mutual k-NN pairs."""

    name, minimum_n = "cknna", 4

    def __init__(self, k: int):
        self.k = int(k)

    def prepare(self, x: Tensor, side: str) -> tuple[Neighbours, Tensor]:
        nb = neighbours(x, self.k)
        return nb, knn_hsic(nb, nb)

    def permuted(self, prep: tuple[Neighbours, Tensor], perm: Tensor) -> tuple[Neighbours, Tensor]:
        return permuted_neighbours(prep[0], perm), prep[1]

    def pair(self, prep_a: tuple[Neighbours, Tensor], prep_b: tuple[Neighbours, Tensor]) -> Tensor:
        return cka_ratio(knn_hsic(prep_a[0], prep_b[0]), prep_a[1], prep_b[1], warn=False, bounded=False)

    def layer_bytes(self, n: int, width: int) -> int:
        return 16 * n * self.k


class CycleKnn:
    """Cycle k-NN (platonic-rep): the fraction of samples ``i`` that are among A's ``k`` neighbours of one
    of their ``k`` neighbours in B (``knn_A[knn_B]``)."""

    name, minimum_n = "cycle_knn", 2

    def __init__(self, k: int):
        self.k = int(k)

    def prepare(self, x: Tensor, side: str) -> Tensor:
        return neighbours(x, self.k).indices

    def permuted(self, prep: Tensor, perm: Tensor) -> Tensor:
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(len(perm), device=perm.device)
        return inverse[prep[perm]]

    def pair(self, prep_a: Tensor, prep_b: Tensor) -> Tensor:
        n = len(prep_a)
        found = prep_a[prep_b] == torch.arange(n, device=prep_a.device)[:, None, None]   # (n, k, k)
        return found.flatten(1).any(1).double().mean()

    def layer_bytes(self, n: int, width: int) -> int:
        return 8 * n * self.k


# ------------------------------------------------------------------------------------------ distances


class DistanceCorrelation:
    """Distance correlation (Székely et al. 2007): the CKA ratio of the double-centred distance matrices
    (``plain``: dCor, the square root of that V-statistic ratio) or of the U-centred ones
    (``bias_corrected``: Székely & Rizzo's squared dCor*, ≈ 0 for independent data, may be < 0)."""

    name = "distance_correlation"

    def __init__(self, estimator: str):
        self.plain = estimator == "plain"
        self.minimum_n = 2 if self.plain else 4

    def prepare(self, x: Tensor, side: str) -> tuple[Tensor, Tensor]:
        d = _distances(x)
        centred = center_gram(d) if self.plain else u_center_gram(d)
        return centred, (centred * centred).sum()

    def permuted(self, prep: tuple[Tensor, Tensor], perm: Tensor) -> tuple[Tensor, Tensor]:
        return _reorder(prep[0], perm), prep[1]

    def pair(self, prep_a: tuple[Tensor, Tensor], prep_b: tuple[Tensor, Tensor]) -> Tensor:
        ratio = cka_ratio((prep_a[0] * prep_b[0]).sum(), prep_a[1], prep_b[1], warn=False)
        return ratio.clamp_min(0).sqrt() if self.plain else ratio

    def layer_bytes(self, n: int, width: int) -> int:
        return 8 * n * n


class InformationImbalance:
    """Information imbalance Δ(A→B) (Glielmo et al. 2022): ``(2/n)·mean_i r_B(i, j_A(i))``, ``j_A(i)`` the
    nearest neighbour of ``i`` in A (Euclidean, ties to the lower index) and ``r_B(i, j)`` the rank of ``j``
    among ``i``'s distances in B (1 = nearest; ties share the lowest rank). 0: A's neighbours are B's
    nearest; about 1: A says nothing about B's neighbourhoods. Directional."""

    name, minimum_n = "information_imbalance", 3

    def prepare(self, x: Tensor, side: str) -> Tensor:
        d = _distances(x)
        d.fill_diagonal_(math.inf)
        if side == "a":
            return d.argmin(1)                     # the first minimum: ties to the lower index
        ordered = d.sort(1).values
        return torch.searchsorted(ordered, d).to(torch.int32) + 1

    def permuted(self, prep: Tensor, perm: Tensor) -> Tensor:
        return _reorder(prep, perm)

    def pair(self, prep_a: Tensor, prep_b: Tensor) -> Tensor:
        n = len(prep_a)
        ranks = prep_b[torch.arange(n, device=prep_a.device), prep_a].double()
        return 2.0 * ranks.mean() / n

    def layer_bytes(self, n: int, width: int) -> int:
        return 4 * n * n


class BuresSimilarity:
    """The normalised Bures similarity (NBS; rsatoolbox's ``compare_bures_similarity``) of the layers'
    second-moment matrices ``G = −½·H·D·H``, ``D`` the dissimilarities under ``rsa_distance`` (squared for
    ``euclidean``, as rsatoolbox's RDMs): ``tr((G_a^½ G_b G_a^½)^½) / sqrt(tr G_a · tr G_b)``. ``G`` is the
    Gram of the centred :func:`~simkit.metrics.rsa.rdm_embedding`, so NBS is ``‖E_aᵀE_b‖_* / (‖E_a‖_F‖E_b‖_F)``
    with ``E`` that embedding (or its ``n × n`` spectral basis when it is wider than ``n``); with
    ``euclidean`` it is ``procrustes`` (Harvey et al. 2023)."""

    name, minimum_n = "bures_similarity", 2

    def __init__(self, distance: str):
        self.distance = distance
        self.undefined = f"a sample vector is constant or zero under {distance} distance"

    def prepare(self, x: Tensor, side: str) -> tuple[Tensor, Tensor] | None:
        z = rdm_embedding(x, self.distance)
        if z is None:
            return None
        e = z - z.mean(0)
        if e.shape[1] > e.shape[0]:   # the same nuclear norms from the n × n Gram's basis E = U·√λ
            lam, vec = torch.linalg.eigh(e @ e.T)
            e = vec * lam.clamp_min(0).sqrt()
        return e, (e * e).sum()

    def permuted(self, prep: tuple[Tensor, Tensor] | None, perm: Tensor) -> tuple[Tensor, Tensor] | None:
        return None if prep is None else (prep[0][perm], prep[1])

    def pair(self, prep_a: tuple[Tensor, Tensor] | None, prep_b: tuple[Tensor, Tensor] | None) -> Tensor:
        if prep_a is None or prep_b is None:
            return torch.tensor(math.nan, dtype=torch.float64)
        fidelity = torch.linalg.svdvals(prep_a[0].T @ prep_b[0]).sum()
        return cka_ratio(fidelity, prep_a[1], prep_b[1], warn=False)

    def layer_bytes(self, n: int, width: int) -> int:
        return 8 * n * min(n, width)


# ------------------------------------------------------------------------------------------ plug-ins


class PluginPair:
    """A registered measure (``simkit.register_measure``): its function called per pair on the float64
    activations, their centred Grams or their RDMs (``input``); a non-scalar or non-finite value, or an
    exception, is a one-line :class:`SimkitError` naming the measure."""

    minimum_n = 2

    def __init__(self, name: str, fn: Callable[..., Any], input_kind: str, distance: str):
        self.name, self.fn, self.input_kind, self.distance = name, fn, input_kind, distance

    def prepare(self, x: Tensor, side: str) -> Tensor | None:
        xd = x.double()
        if self.input_kind == "features":
            return xd
        if self.input_kind == "gram":
            xc = xd - xd.mean(0)
            return xc @ xc.T
        upper = rdm_upper(xd, self.distance)
        if upper is None:
            return None
        full = torch.zeros(len(xd), len(xd), dtype=torch.float64, device=xd.device)
        i, j = torch.triu_indices(len(xd), len(xd), 1, device=xd.device)
        full[i, j] = upper
        return full + full.T

    def permuted(self, prep: Tensor | None, perm: Tensor) -> Tensor | None:
        if prep is None:
            return None
        return prep[perm] if self.input_kind == "features" else _reorder(prep, perm)

    def pair(self, prep_a: Tensor | None, prep_b: Tensor | None) -> Tensor:
        if prep_a is None or prep_b is None:
            return torch.tensor(math.nan, dtype=torch.float64)
        try:
            value = self.fn(prep_a.clone(), prep_b.clone())
        except Exception as error:  # the user's code: any failure becomes one line naming the measure
            reason = " ".join(str(error).split()) or "no message"
            raise SimkitError(f"measure {self.name!r} raised {type(error).__name__}: {reason}; fix the "
                              f"function registered as {self.name!r}") from error
        return torch.tensor(plugin_scalar(self.name, value), dtype=torch.float64)

    def layer_bytes(self, n: int, width: int) -> int:
        return 0 if self.input_kind == "features" else 8 * n * n


def plugin_scalar(name: str, value: Any) -> float:
    """The float of what plug-in measure ``name`` returned: a real number or a 0-d tensor/array, finite."""
    if isinstance(value, Tensor | np.ndarray | np.generic) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        shape = tuple(getattr(value, "shape", ()))
        what = f"a {type(value).__name__} of shape {shape}" if shape else f"a {type(value).__name__}"
        raise SimkitError(f"measure {name!r} returned {what}, not a scalar; return a float or a 0-d tensor")
    out = float(value)
    if not math.isfinite(out):
        raise SimkitError(f"measure {name!r} returned {out}; it must return a finite number for every pair of "
                          "layers (and every permutation of B's samples)")
    return out


# ------------------------------------------------------------------------------------------ the table


def _knn_k(settings: MeasureSettings) -> int:
    return int(settings.knn_k)


#: every built-in pairwise measure (the catalogue's ``stored_family`` ``pairwise``) → its builder
PAIR_MEASURES: dict[str, Callable[[MeasureSettings], PairMeasure]] = {
    "cknna": lambda st: Cknna(_knn_k(st)),
    "cycle_knn": lambda st: CycleKnn(_knn_k(st)),
    "distance_correlation": lambda st: DistanceCorrelation(st.dcor_estimator),
    "information_imbalance": lambda st: InformationImbalance(),
    "bures_similarity": lambda st: BuresSimilarity(st.rsa_distance),
}


def check_pair_n(measure: PairMeasure, n: int, k: int | None = None) -> None:
    """Raise when ``n`` samples are too few for ``measure`` (and its ``k`` neighbours)."""
    check_min_n(n, measure.minimum_n, measure.name)
    if k is not None:
        check_k(k, n)


def _one_shot(measure: PairMeasure, x: Any, y: Any, k: int | None = None) -> float:
    """``measure`` of ``x (n, p)``, ``y (n, q)`` as a float; NaN and a warning for a constant input."""
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    if xt.dim() >= 1 and yt.dim() >= 1:
        check_same_n(xt.shape[0], yt.shape[0])
    xt, yt = as_matrix(xt, "x"), as_matrix(yt, "y")
    check_pair_n(measure, len(xt), k)
    for label, t in (("x", xt), ("y", yt)):
        if is_constant(t):
            warn_undefined(f"{label} is constant: every example has the same activation", 4, measure.name)
            return math.nan
    value = float(measure.pair(measure.prepare(xt, "a"), measure.prepare(yt, "b")))
    if math.isnan(value):
        warn_undefined(getattr(measure, "undefined", "a kernel without variance"), 4, measure.name)
    return value


def cknna(x, y, k: int = 10) -> float:
    """CKNNA (Huh et al. 2024) of ``x (n, p)`` and ``y (n, q)``, ``n ≥ 4``: unbiased linear CKA of the
    kernels of the preprocessed rows (:func:`~simkit.metrics.knn.clamp_normalize`) kept on the pairs that
    are ``k`` nearest neighbours in both; ≈ [0, 1], may be < 0. platonic-rep adds 1e-6 to its denominator;
    simkit does not (a non-positive one gives NaN)."""
    k = check_setting("knn_k", k)
    return _one_shot(Cknna(k), x, y, k)


def cycle_knn(x, y, k: int = 10) -> float:
    """Cycle k-NN (platonic-rep) of ``x (n, p)`` and ``y (n, q)``: the fraction of samples found again among
    ``x``'s ``k`` neighbours of their ``k`` neighbours in ``y``; [0, 1], directional."""
    k = check_setting("knn_k", k)
    return _one_shot(CycleKnn(k), x, y, k)


def distance_correlation(x, y, dcor_estimator: str = "bias_corrected") -> float:
    """Distance correlation of ``x (n, p)`` and ``y (n, q)``: ``bias_corrected`` (the default, ``n ≥ 4``):
    squared dCor* from U-centred distances, as ``dcor.u_distance_correlation_sqr``; ``plain``: dCor, as
    ``dcor.distance_correlation``."""
    estimator = check_setting("dcor_estimator", dcor_estimator)
    return _one_shot(DistanceCorrelation(estimator), x, y)


def information_imbalance(x, y) -> float:
    """Information imbalance Δ(x→y) (Glielmo et al. 2022) of ``x (n, p)``, ``y (n, q)``, ``n ≥ 3``: in
    [0, 2), 0 when ``x``'s nearest neighbours are ``y``'s, about 1 when ``x`` says nothing of ``y``."""
    return _one_shot(InformationImbalance(), x, y)


def bures_similarity(x, y, rsa_distance: str = "correlation") -> float:
    """Normalised Bures similarity of ``x (n, p)`` and ``y (n, q)`` (:class:`BuresSimilarity`): in [0, 1];
    ``rsa_distance`` ``euclidean`` gives ``procrustes``. NaN and a warning where the RDM is undefined."""
    return _one_shot(BuresSimilarity(check_setting("rsa_distance", rsa_distance)), x, y)
