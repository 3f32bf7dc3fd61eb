"""Paths that store the activations: ``"stored-gram"`` (exact RBF CKA, exact linear CKA beyond the
memory budget or with a permutation null), ``"stored-knn"`` (mutual and Jaccard k-NN, both modes, one
neighbour search per layer for both), ``"stored-cov"`` (shape measures with a null or beyond the budget:
each layer's spectrum from its samples, :mod:`simkit.metrics.streaming.shapes`), ``"stored-folds"``
(``ridge_r2`` with a null or beyond the budget, :mod:`simkit.metrics.predictivity`) and ``"stored-rdm"``
(``rsa``: one RDM upper triangle per layer, :mod:`simkit.metrics.rsa`, up to the ``n`` its memory allows),
``"stored-pairwise"`` (``cknna``, ``cycle_knn``, ``distance_correlation``, ``information_imbalance``,
``bures_similarity``: each layer prepared once, then every pair, :mod:`.pairwise`) and ``"stored-plugin"``
(a registered measure's function per pair).
Each measure reaches its family through its catalogue row (``stored_family``, the key of :data:`FAMILIES`).

Gram rows are produced in blocks with :mod:`simkit.metrics.cka`'s pieces (the one distance formula,
median, RBF kernel, U-centring and ratio), as float64 products of float64 copies of the samples;
neighbours with :mod:`simkit.metrics.knn` after its preprocessing in float64 (as ``mutual_knn``'s
default). Every product and spectrum is float64, so the numerical rank is the one rule of float64 sums
(:func:`~simkit.metrics._checks.rank_rtol`), as in the functions and on the streamed paths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from simkit.catalog import GRAM_KINDS, KNN_MEASURES, MEASURES
from simkit.errors import SimkitError
from simkit.metrics._checks import is_constant
from simkit.metrics.budget import over_budget
from simkit.metrics.cka import (
    cka_ratio,
    median_of_distances,
    rbf_from_sq_distances,
    sq_distances,
    u_center_offsets,
    u_center_rows,
)
from simkit.metrics.knn import clamp_normalize, knn_indices
from simkit.metrics.predictivity import (
    SampleFolds,
    centred,
    centred_fold_moments,
    check_fold_samples,
    fold_solvers,
    residual_form,
    ridge_from_moments,
    sample_space_cheaper,
)
from simkit.metrics.rsa import check_rsa_n, kendall_tau_a, prepared, rdm_upper, undefined_reason
from simkit.metrics.settings import MeasureSettings
from simkit.metrics.shape import PROCRUSTES, Spectrum, spectrum_from_samples
from simkit.metrics.streaming.common import (
    Names,
    PhaseProgress,
    Values,
    bootstrap_rows,
    ci_summary,
    cka_chance,
    draw_perms,
    mask_constant,
    null_summary,
    own,
    perm_generator,
)
from simkit.metrics.streaming.folds import ridge_describe
from simkit.metrics.streaming.gram_moments import STORED_P_VALUE, GramTraces
from simkit.metrics.streaming.pairwise import compute_pairwise, compute_plugin, pairwise_notes, plugin_notes
from simkit.metrics.streaming.shapes import shape_notes, shape_settings, shape_values
from simkit.metrics.streaming.state import Rows, State

KNN = KNN_MEASURES  # the catalogue's measures that share one neighbour search


def _silent(phase: str, advance: int, total: int) -> None:
    """The progress report of a call that asked for none."""


class GramRows:
    """Rows of one layer's centred (``biased``), U-centred (``unbiased``) or centred RBF Gram, on demand.

    x: ``(n, p)`` stored activations. ``rows(idx)`` → ``(len(idx), n)`` float64; the whole ``n × n`` is
    made (once) only when ``chunk`` rows are all of them, i.e. when it fits the caller's block budget.
    The features are centred and multiplied in float64 (an ``n × p`` float64 copy per layer), as on the
    feature path and in the functions, so every path's Gram products are float64 products.
    """

    def __init__(self, x: Tensor, kind: str, factor: float, chunk: int, constant: bool,
                 shared: dict[tuple[str, int], Tensor] | None = None, key: tuple[str, int] = ("", 0)):
        self.kind, self.n, self.constant = kind, x.shape[0], constant
        self.full: Tensor | None = None   # the whole centred Gram, when one block holds it
        self.d2: Tensor | None = None     # every squared distance (rbf), when one block holds them
        self.product: Tensor | None = None   # the whole X̃X̃ᵀ, kept in ``shared[key]`` for the other CKA measure
        self.xc = centred64(x)
        if constant:
            return
        n = self.n
        if shared is not None:
            if key not in shared:
                shared[key] = self.xc @ self.xc.T
            self.product = shared[key]
        if kind == "unbiased":  # the U-centring offsets from the column sums of K̃ = K − diag(K)
            xc = self.xc
            rowsq = (xc * xc).sum(1)
            self.m = u_center_offsets(xc @ xc.sum(0) - rowsq, n)
        elif kind == "rbf":
            self.sq = (self.xc ** 2).sum(1)
            self.sigma = factor * float(median_of_distances(self._sqdist, n, chunk, x.device))
            if not self.sigma > 0:
                raise SimkitError("RBF bandwidth is 0: the median pairwise distance of a layer is 0 (most "
                                  "samples are duplicates); use linear CKA for this layer")
            if chunk >= n:  # one block holds the whole kernel: its exponentials once, centred in place
                self.full = kernel = self._rbf(torch.arange(n, device=x.device))
                self.row_mean = means = kernel.mean(1)
                self.grand = means.mean()
                kernel.sub_(means[:, None]).sub_(means[None, :]).add_(self.grand)
                self.d2 = None
                return
            means = torch.cat([self._rbf(torch.arange(s, min(n, s + chunk), device=x.device)).mean(1)
                               for s in range(0, n, chunk)])
            self.row_mean, self.grand = means, means.mean()
        if chunk >= n:  # one block holds the whole Gram: make it once (the null reads it permuted)
            self.full = self.product if kind == "biased" and self.product is not None else self.rows(
                torch.arange(n, device=x.device))
            self.d2 = None

    def _sqdist(self, idx: Tensor) -> Tensor:
        if self.d2 is None:  # the first call of a layer small enough for one block asks for every row
            d2 = sq_distances(self.xc[idx] @ self.xc.T, self.sq, idx)
            if len(idx) < self.n:
                return d2
            self.d2 = d2
        return self.d2[idx]

    def _rbf(self, idx: Tensor) -> Tensor:
        return rbf_from_sq_distances(self._sqdist(idx), self.sigma)

    def _products(self, idx: Tensor) -> Tensor:
        """Rows ``idx`` of ``X̃X̃ᵀ`` (float64): of the shared whole product when there is one."""
        if self.product is None:
            return self.xc[idx] @ self.xc.T
        return self.product if _every_row(idx, self.n) else self.product[idx]

    def trace(self) -> Tensor:
        """``tr(X̃X̃ᵀ) = ‖X̃‖²_F``, 0-d float64."""
        return (self.xc * self.xc).sum()

    def rows(self, idx: Tensor) -> Tensor:
        if self.full is not None:
            return self.full if _every_row(idx, self.n) else self.full[idx]
        if self.constant:
            return torch.zeros(len(idx), self.n, dtype=torch.float64, device=idx.device)
        if self.kind == "biased":
            return self._products(idx)
        if self.kind == "unbiased":
            return u_center_rows(self._products(idx), self.m, idx)
        return self._rbf(idx) - self.row_mean[idx, None] - self.row_mean[None, :] + self.grand


def centred64(x: Tensor) -> Tensor:
    """``x (n, p)`` in float64, each column centred on its mean."""
    xd = x.double()
    return xd - xd.mean(0)


def _every_row(idx: Tensor, n: int) -> bool:
    """Whether ``idx`` is ``0, 1, …, n − 1`` (a whole Gram is then returned as it is, not copied)."""
    return len(idx) == n and bool((idx == torch.arange(n, device=idx.device)).all())


def _join_bases(spectra: list[Spectrum]) -> tuple[Tensor, list[int]]:
    """The bases of ``spectra`` side by side, ``(n, Σ r_j)``, and their widths; each spectrum's ``basis``
    becomes a view into it (no second copy is kept)."""
    widths = [s.basis.shape[1] for s in spectra]
    joined = torch.cat([s.basis for s in spectra], 1)
    for s, part in zip(spectra, torch.split(joined, widths, 1), strict=True):
        s.basis = part
    return joined, widths


def _whole_gram_null(grams_a: Tensor, grams_b: Tensor, perms: Tensor, null: Tensor) -> None:
    """``null[k] (La, Lb)`` = ``Σ_ij K_ij L_{π(i)π(j)}`` for every permutation ``π = perms[k]`` from whole
    flattened Grams ``grams_a (La, n²)``, ``grams_b (Lb, n²)``: the Grams are made once (a permutation of
    B's samples only re-indexes them), and each draw gathers the side with fewer layers once, by one flat
    index (``Σ_ij K_ij L_{π(i)π(j)} = Σ_kl K_{π⁻¹(k)π⁻¹(l)} L_kl``), then takes one product."""
    n = perms.shape[1]
    on_a = grams_a.shape[0] < grams_b.shape[0]
    for k, pk in enumerate(perms):
        order = torch.empty_like(pk).scatter_(0, pk, torch.arange(n, device=pk.device)) if on_a else pk
        flat = (order[:, None] * n + order[None, :]).flatten()
        if on_a:
            null[k] = grams_a.index_select(1, flat) @ grams_b.T
        else:
            null[k] = grams_a @ grams_b.index_select(1, flat).T


def _condensed_places(perm: Tensor, iu: Tensor, n: int) -> Tensor:
    """Where the entries ``(π(i), π(j))``, ``i < j`` in the order of ``iu (2, m)``, sit in an upper triangle
    stored row by row (``(n(n−1)/2,)`` entries): ``(m,)`` int64 (a distance matrix is symmetric)."""
    a, b = perm[iu[0]], perm[iu[1]]
    lo, hi = torch.minimum(a, b), torch.maximum(a, b)
    return lo * n - lo * (lo + 1) // 2 + hi - lo - 1


class Samples(NamedTuple):
    """What every family computes from: all stored samples per layer (global batch order), the null's
    permutations of B's samples (None: no null), and which layers are constant."""

    xa: list[Tensor]
    xb: list[Tensor]
    perms: Tensor | None
    const_a: Tensor
    const_b: Tensor


class StoredPart:
    """Metrics that need all activations at once: each measure's family (its catalogue row's
    ``stored_family``, :data:`FAMILIES`) computes it from the stored samples.

    Declared state: one ``cat`` (``self.rows``, :class:`~simkit.metrics.streaming.state.Rows`)."""

    def __init__(self, metrics: list[str], mode: str, dims_a: list[int], dims_b: list[int], null: int,
                 seed: int, rbf_factor: float, knn_k: int, memory_budget_bytes: int, max_stored_n: int,
                 names: Names, reasons: dict[str, str], settings: MeasureSettings | None = None, *,
                 moments: bool = False, own_null: dict[str, int] | None = None, groups: Tensor | None = None,
                 blocks: Tensor | None = None):
        self.metrics, self.mode, self.dims_a, self.dims_b = metrics, mode, dims_a, dims_b
        # p-values of the CKA family from their permutation moments (gram_moments); the permutations each
        # measure draws when fewer than ``null`` (the CKA family's null then serves its best pair only);
        # the samples' group codes (permutations within groups)
        self.moments, self.own_null, self.groups = moments, own_null or {}, groups
        self.blocks = blocks   # the rows' block ids (tokens of one sequence): the null and bootstrap keep blocks whole
        self.settings = settings or MeasureSettings()
        self.null, self.seed, self.rbf_factor, self.knn_k = null, seed, rbf_factor, knn_k
        self.budget, self.max_n, self.names, self.reasons = memory_budget_bytes, max_stored_n, names, reasons
        self.rows = Rows()
        self.states: list[State] = [self.rows]
        self.products: dict[tuple[str, int], Tensor] = {}   # X̃X̃ᵀ per layer during values(), for both CKAs
        self.report: PhaseProgress = _silent

    @property
    def n(self) -> int:
        """Samples stored."""
        return self.rows.n

    def update(self, acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], b: int, batch_index: int,
               offset: int = 0) -> None:
        if self.n + b > self.max_n:
            raise SimkitError(
                f"{', '.join(self.metrics)} in {self.mode} mode store all activations and n would exceed "
                f"`max_stored_n`={self.max_n}; use `mode`=minibatch (CKA metrics), `reduce`=mean, or a smaller `n`")
        self.names.check_finite(("a", torch.stack([a.detach().sum(dtype=torch.float64) for a in acts_a])),
                                ("b", torch.stack([t.detach().sum(dtype=torch.float64) for t in acts_b])))
        self.rows.append([own(a) for a in acts_a], [own(t) for t in acts_b], batch_index)

    def bootstrap(self, values: dict[str, np.ndarray], confidence: float, resamples: int, seed: int,
                  progress: PhaseProgress | None = None) -> dict[str, dict[str, np.ndarray]]:
        """A bootstrap interval around ``values`` ({metric: (La, Lb)}, this part's values) of every metric of
        this part (:func:`~simkit.metrics.streaming.common.ci_summary`): ``resamples`` times, ``n`` samples
        drawn with replacement from the declared rows (the same rows of A and B, from a generator seeded by
        ``seed``), every metric recomputed on them (no null, warnings of the replicates silenced).
        ``{metric: {"ci_low", "ci_high"}}`` (La, Lb). Duplicated samples shrink distances, so the k-NN and
        RSA intervals are rough; see docs/chance-levels.md."""
        import warnings

        xa, xb = self._layers()
        generator = torch.Generator().manual_seed((int(seed) * 1_000_003 + 17) % (2**63 - 1))
        replicates: dict[str, list[np.ndarray]] = {m: [] for m in self.metrics}
        report = progress or _silent
        for _ in range(resamples):
            rows = bootstrap_rows(self.n, generator, self.blocks).to(xa[0].device)
            part = StoredPart(self.metrics, self.mode, self.dims_a, self.dims_b, 0, self.seed, self.rbf_factor,
                              self.knn_k, self.budget, self.max_n, self.names, self.reasons, self.settings)
            part.rows.hold([x[rows] for x in xa], [y[rows] for y in xb])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                drawn = part.values()
            for m in self.metrics:
                replicates[m].append(drawn[m]["value"])
            report(f"bootstrap interval ({resamples} resamples)", 1, resamples)
        return {m: ci_summary(values[m], np.stack(draws), confidence) for m, draws in replicates.items()}

    def _layers(self) -> tuple[list[Tensor], list[Tensor]]:
        """All stored samples per layer, in global batch order: ``[(n, p_i)]``, ``[(n, q_j)]``."""
        return self.rows.layers(len(self.dims_a), len(self.dims_b))

    def compute(self, progress: PhaseProgress | None = None) -> Values:
        """Every metric of this part, with its bootstrap interval when ``settings.ci`` asks for one;
        ``progress(phase, advance, total)`` hears of the neighbour searches, of every permutation of a null
        and of every bootstrap resample (None: silent)."""
        out = self.values(progress)
        ci = self.settings.ci
        if ci is not None:
            values = {m: out[m]["value"] for m in self.metrics}
            intervals = self.bootstrap(values, ci, self.settings.ci_resamples, self.seed, progress)
            for m, interval in intervals.items():
                out[m].update(interval)
        return out

    def values(self, progress: PhaseProgress | None = None) -> Values:
        """Every metric of this part, without an interval: the families that serve several measures at once
        (:data:`SHARED_FAMILIES`) first, then each other measure's family in the order of ``metrics``."""
        self.report = progress or _silent
        n = self.n
        if n == 0:
            raise SimkitError("no samples were given to the accumulator; check `data` and `n`")
        xa, xb = self._layers()
        self.names.check_finite(("a", torch.stack([x.double().sum() for x in xa])),
                                ("b", torch.stack([x.double().sum() for x in xb])))
        const_a = torch.tensor([is_constant(x) for x in xa], device=xa[0].device)
        const_b = torch.tensor([is_constant(x) for x in xb], device=xa[0].device)
        perms = None
        if self.null:
            grouped = None if self.groups is None else self.groups[:n]
            blocked = None if self.blocks is None else self.blocks[:n]
            perms = draw_perms(self.null, n, perm_generator(self.seed, -1), xa[0].device, grouped, blocked)
        samples = Samples(xa, xb, perms, const_a, const_b)
        self.products = {}
        results: dict[str, dict[str, Any]] = {}
        for family in SHARED_FAMILIES:
            measures = [m for m in self.metrics if MEASURES[m].stored_family == family]
            if measures:
                results.update(FAMILIES[family].compute(self, measures, samples))
        out = {}
        for m in self.metrics:
            if m not in results:  # a family that computes one measure at a time
                results.update(FAMILIES[MEASURES[m].stored_family].compute(self, [m], samples))
            self.names.warn_constant(m, const_a, const_b)
            # tensors, or the arrays of null_summary: numpy either way
            out[m] = {k: torch.as_tensor(v).cpu().numpy() for k, v in results[m].items()}
        self.products = {}
        return out

    def _chunk(self, layers: int) -> int:
        """Rows per block so that ``layers`` blocks of ``rows × n`` float64 use a quarter of the budget."""
        return max(1, min(self.n, self.budget // (4 * 8 * max(1, layers) * self.n)))

    def _gram(self, measures: list[str], samples: Samples) -> dict[str, dict[str, Any]]:
        """Family ``gram``: the CKA of one measure from centred (U-centred, RBF) Gram rows made in blocks."""
        (m,) = measures
        xa, xb, perms, const_a, const_b = samples
        n, kind, count = self.n, GRAM_KINDS[m], self.own_null.get(m, self.null)
        perms = perms[:count] if perms is not None else None
        least = 4 if kind == "unbiased" else 2
        if n < least:
            raise SimkitError(f"{m} needs at least {least} samples, got {n}; use more samples (`n`)")
        la, lb = len(xa), len(xb)
        chunk = self._chunk(la + lb)
        if kind == "rbf" and 16 * n * n > self.budget:
            raise over_budget(f"exact rbf_cka needs the median of all {n * (n - 1) // 2} pairwise distances",
                              16 * n * n, self.budget, first="`mode`=minibatch (rbf_cka streams there)")
        share = chunk >= n and kind != "rbf" and {"linear_cka", "unbiased_cka"} <= set(self.metrics)
        shared = self.products if share else None
        ga = [GramRows(x, kind, self.rbf_factor, chunk, bool(c), shared, ("a", i))
              for i, (x, c) in enumerate(zip(xa, const_a, strict=True))]
        gb = [GramRows(x, kind, self.rbf_factor, chunk, bool(c), shared, ("b", j))
              for j, (x, c) in enumerate(zip(xb, const_b, strict=True))]
        traces = GramTraces(ga, gb) if self.moments else None
        dev = xa[0].device
        cross = torch.zeros(la, lb, dtype=torch.float64, device=dev)
        self_a = torch.zeros(la, dtype=torch.float64, device=dev)
        self_b = torch.zeros(lb, dtype=torch.float64, device=dev)
        null = torch.zeros(count, la, lb, dtype=torch.float64, device=dev)
        for start in range(0, n, chunk):
            idx = torch.arange(start, min(n, start + chunk), device=dev)
            rows_a = torch.stack([g.rows(idx) for g in ga]).reshape(la, -1)
            rows_b = torch.stack([g.rows(idx) for g in gb]).reshape(lb, -1)
            cross.addmm_(rows_a, rows_b.T)
            self_a.add_((rows_a * rows_a).sum(1))
            self_b.add_((rows_b * rows_b).sum(1))
            if traces is not None:
                traces.add(rows_a, rows_b, idx)
            draws: Tensor | list[Tensor] = perms if perms is not None else []
            if len(idx) == n and perms is not None:  # every Gram whole: re-index the side with fewer layers
                _whole_gram_null(rows_a, rows_b, perms, null)
                draws = []
            for k, pk in enumerate(draws):  # B's Gram with samples permuted: L[π, π], rows idx
                rows_bk = torch.stack([g.rows(pk[idx])[:, pk] for g in gb]).reshape(lb, -1)
                null[k].addmm_(rows_a, rows_bk.T)
            if count:
                self.report(f"{m} null ({count} permutations, Gram rows)", len(idx), n)
        ratio_a, ratio_b = self_a[:, None], self_b[None, :]
        value = cka_ratio(cross, ratio_a, ratio_b, warn=False)
        result: dict[str, Any] = {"value": mask_constant(value, const_a, const_b)}
        if not count and kind != "rbf":  # no null: the closed form, as on the feature path
            nx, ny = (torch.stack([g.trace() for g in side]) for side in (ga, gb))
            chance = cka_chance(m, value, nx, ny, self_a, self_b, n)
            result["chance"] = mask_constant(chance, const_a, const_b)
        if count:
            result.update(null_summary(mask_constant(cka_ratio(null, ratio_a, ratio_b, warn=False),
                                                     const_a, const_b)))
        if traces is not None:
            result.update(traces.p_values(cross, self_a, self_b, const_a, const_b))
        return {m: result}

    def _knn(self, measures: list[str], samples: Samples) -> dict[str, dict[str, Any]]:
        """Family ``knn``: mutual and Jaccard k-NN of all pairs from each layer's neighbour sets (searched once for both), as
        sets of edge codes ``r·n + s``; per sample the shared count ``c`` gives ``c / k`` and ``c / (2k − c)``.

        A constant layer's neighbours are all ties: its pairs are NaN, as for CKA."""
        xa, xb, perms, const_a, const_b = samples
        n, k = self.n, self.knn_k
        if k > n - 1:
            which = " and ".join(m for m in KNN if m in self.metrics)
            raise SimkitError(f"{which} with k={k} needs at least {k + 1} samples, got {n}; "
                              "use more samples or a smaller `knn_k`")
        dev = xa[0].device
        rows = torch.arange(n, device=dev)[:, None]

        la, lb = len(xa), len(xb)
        searched = f"neighbour search ({n} samples, {la + lb} layers)"

        def neighbours(x: Tensor) -> Tensor:  # the preprocessing in float64, as mutual_knn's default
            return knn_indices(clamp_normalize(x.double()), k,
                               progress=lambda rows: self.report(searched, rows, (la + lb) * n))

        codes_a = torch.stack([(rows * n + neighbours(x)).flatten() for x in xa])  # (La, n·k)
        idx_b = [neighbours(x) for x in xb]
        layer_off = torch.arange(la, device=dev)[:, None] * (n * n)
        keys_a = (codes_a + layer_off).flatten()

        def overlap(nb: Tensor) -> tuple[Tensor, Tensor]:
            """Mutual and Jaccard scores of every A layer with one B neighbour set ``nb (n, k)`` → 2 × (La,)."""
            codes = (rows * n + nb).flatten()[None, :] + layer_off
            shared = torch.isin(codes.flatten(), keys_a).view(la, n, k).sum(2).double()   # (La, n)
            return shared.sum(1) / (n * k), (shared / (2 * k - shared)).mean(1)

        pairs = [overlap(nb) for nb in idx_b]
        out: dict[str, dict[str, Any]] = {}
        for pos, m in enumerate(KNN):
            value = torch.stack([p[pos] for p in pairs], 1)
            out[m] = {"value": mask_constant(value, const_a, const_b)}
        if self.null and perms is not None:
            null = torch.empty(2, self.null, la, lb, dtype=torch.float64, device=dev)
            for t in range(self.null):  # neighbours of Y[π]: π⁻¹ applied to Y's neighbours of π(i)
                pk = perms[t]
                inv = torch.empty_like(pk)
                inv[pk] = torch.arange(n, device=dev)
                for j, nb in enumerate(idx_b):
                    null[0, t, :, j], null[1, t, :, j] = overlap(inv[nb[pk]])
                self.report(f"k-NN null ({self.null} permutations)", 1, self.null)
            for pos, m in enumerate(KNN):
                out[m].update(null_summary(mask_constant(null[pos], const_a, const_b)))
        return out

    def _centred(self, xs: list[Tensor]) -> list[Tensor]:
        return [centred64(x) for x in xs]

    def _shapes(self, measures: list[str], samples: Samples) -> dict[str, dict[str, Any]]:
        """Family ``cov``: shape measures from each layer's spectrum of its stored samples (``E = X̃V``,
        ``(n, min(n, p))``)."""
        xa, xb, perms, const_a, const_b = samples
        n = self.n
        if n < 2:
            raise SimkitError(f"{', '.join(measures)} need at least 2 samples, got {n}; use more samples (`n`)")
        need = 8 * n * sum(min(n, d) for d in self.dims_a + self.dims_b)
        if need > self.budget:
            raise over_budget(f"{', '.join(measures)} on stored samples keep each layer's n x min(n, width) basis",
                              need, self.budget, first="`reduce`=mean, no `null` (then the covariances are "
                              "streamed if they fit)")
        pw = "pwcca" in measures
        bases = not set(measures) <= set(PROCRUSTES)   # Procrustes alone: the eigenvalues, E = X̃ itself
        spec_a = [spectrum_from_samples(x, pw, bases) for x in self._centred(xa)]
        spec_b = [spectrum_from_samples(y, pw, bases) for y in self._centred(xb)]
        joined, widths = _join_bases(spec_b)

        def run(order: Tensor | None, warn: bool) -> dict[str, Tensor]:
            # B's bases side by side, rows permuted once per draw: one product per A layer gives its T0 with
            # every B layer (each layer's spectrum is made once; a permutation changes the cross terms only)
            rows_b = joined if order is None else joined[order]
            return shape_values(measures, spec_a, spec_b,
                                lambda i: list(torch.split(spec_a[i].basis.T @ rows_b, widths, 1)),
                                n, self.settings, self.names, const_a, const_b, warn=warn,
                                null_draw=order is not None)

        values = run(None, True)
        out: dict[str, dict[str, Any]] = {m: {"value": values[m]} for m in measures}
        if self.null and perms is not None:
            phase = f"{', '.join(measures)} null ({self.null} permutations)"
            draws = []
            for pk in perms:
                draws.append(run(pk, False))
                self.report(phase, 1, self.null)
            for m in measures:
                out[m].update(null_summary(torch.stack([d[m] for d in draws])))
        return out

    def _ridge(self, measures: list[str], samples: Samples) -> dict[str, dict[str, Any]]:
        """Family ``folds``: ``ridge_r2`` of the stored samples, one A layer at a time (fold of sample ``i``: ``i mod ridge_folds``,
        ``i`` its global position). B's layers are centred once for every A layer; each A layer's fold
        factorisations are made once and serve the value and every permutation of a null (they depend on A's
        samples only): in sample space for a wide layer (:class:`~simkit.metrics.predictivity.SampleFolds`),
        from the per-fold moments otherwise (:func:`~simkit.metrics.predictivity.fold_solvers`)."""
        xa, xb, perms, const_a, const_b = samples
        st = self.settings
        check_fold_samples(self.n, st.ridge_folds)
        q = sum(self.dims_b)
        need = 8 * st.ridge_folds * max(d * (q + d) for d in self.dims_a)
        if need > self.budget:
            raise over_budget("ridge_r2 keeps per-fold moments", need, self.budget, first="`reduce`=mean")
        y = centred(xb)
        by_grams = perms is not None and self._ridge_null_by_grams()
        orders: list[Tensor | None] = [None, *(perms if self.null and perms is not None and not by_grams else [])]
        rows = [self._ridge_layer(x, y, orders) for x in xa]         # each (1 + null, Lb)
        values = torch.stack(rows, 1)                                 # (1 + null, La, Lb)
        if by_grams and perms is not None:
            values = torch.cat([values, self._ridge_null_grams(xa, xb, perms)])
        result: dict[str, Any] = {"value": mask_constant(values[0], const_a, const_b)}
        if len(values) > 1:
            result.update(null_summary(mask_constant(values[1:], const_a, const_b)))
        return {"ridge_r2": result}

    def _ridge_null_by_grams(self) -> bool:
        """Whether ``ridge_r2``'s null is cheaper from each layer's ``n × n`` form (:meth:`_ridge_null_grams`)
        than refitted per draw, and its forms and Grams fit the budget (counted in multiply-adds: a form costs
        about ``n³``, a draw ``La·Lb·n²``; refitting a draw costs each A layer's fit of every B feature)."""
        n, k, q, la, lb = self.n, self.settings.ridge_folds, sum(self.dims_b), len(self.dims_a), len(self.dims_b)
        held = n / k
        if 8 * n * n * (la + 1 + lb + min(la + 1, lb) + 1) > self.budget:
            return False
        refit = sum(min(held * (n - held), n * d + 3 * k * d * d) * q for d in self.dims_a)
        forms = sum(n ** 3 + k * d * d * n for d in self.dims_a) + n * n * q
        return forms + self.null * (la + 1) * lb * n * n < self.null * refit

    def _ridge_null_grams(self, xa: list[Tensor], xb: list[Tensor], perms: Tensor) -> Tensor:
        """``ridge_r2`` of every pair for every permutation of B's samples, ``(null, La, Lb)``: the summed held-out
        residuals are a quadratic form in B's samples, ``⟨Q_A, Y Yᵀ⟩``
        (:func:`~simkit.metrics.predictivity.residual_form`), and so is the held-out variance, so each A
        layer's form and each B layer's Gram are made once and every draw only re-indexes them."""
        st, n, la = self.settings, self.n, len(xa)
        forms = [residual_form(centred([x]), n, st.ridge_folds, st.ridge_lambda).flatten() for x in xa]
        forms.append(residual_form(None, n, st.ridge_folds, st.ridge_lambda).to(xa[0].device).flatten())
        grams = torch.stack([(yc @ yc.T).flatten() for yc in (centred([y]) for y in xb)])
        sums = torch.empty(len(perms), la + 1, len(xb), dtype=torch.float64, device=grams.device)
        _whole_gram_null(torch.stack(forms), grams, perms, sums)
        self.report(f"ridge_r2 null ({self.null} permutations)", self.null * la, self.null * la)
        sse, sst = sums[:, :la], sums[:, la:]
        return torch.where(sst > 0, 1 - sse / torch.where(sst > 0, sst, torch.ones_like(sst)),
                           torch.full_like(sse, float("nan")))

    def _ridge_layer(self, x: Tensor, y: Tensor, orders: list[Tensor | None]) -> Tensor:
        """R² ``(len(orders), Lb)`` of one A layer predicting B's centred samples ``y``, for each order of B's
        samples (None: as stored; a permutation: a draw of the null)."""
        st, n, d = self.settings, self.n, x.shape[1]
        xc = centred([x])
        out = []
        if sample_space_cheaper(n, d, st.ridge_folds) and 8 * n * n <= self.budget:
            folds = SampleFolds(xc, st.ridge_folds, st.ridge_lambda)
            for k, order in enumerate(orders):
                out.append(folds.r2(y if order is None else y[order], self.dims_b))
                if k:
                    self.report(f"ridge_r2 null ({self.null} permutations)", 1, self.null * len(self.dims_a))
            return torch.stack(out)
        solvers = None
        for k, order in enumerate(orders):
            moments = centred_fold_moments(xc, y if order is None else y[order], [d], self.dims_b, st.ridge_folds)
            if solvers is None:
                solvers = fold_solvers(moments, [d], st.ridge_lambda)
            out.append(ridge_from_moments(moments, [d], self.dims_b, st.ridge_lambda, solvers)[0])
            if k:
                self.report(f"ridge_r2 null ({self.null} permutations)", 1, self.null * len(self.dims_a))
        return torch.stack(out)

    def _rsa(self, measures: list[str], samples: Samples) -> dict[str, dict[str, Any]]:
        """Family ``rdm``: RSA of all pairs, one prepared RDM upper triangle per layer, Pearson/Spearman as
        one product."""
        import warnings

        xa, xb, perms, const_a, const_b = samples
        n, st = self.n, self.settings
        check_rsa_n(n, len(xa) + len(xb), self.budget, bool(self.null))
        dev = xa[0].device
        la, lb = len(xa), len(xb)
        ready: dict[str, list[Tensor | None]] = {"a": [], "b": []}
        for side, xs, names in (("a", xa, self.names.a), ("b", xb, self.names.b)):
            for k, x in enumerate(xs):
                v = rdm_upper(x, st.rsa_distance)
                p = prepared(v, st.rsa_compare) if v is not None else None
                if p is None and not bool((const_a if side == "a" else const_b)[k]):
                    warnings.warn(f"rsa is undefined for layer {names[k]}: {undefined_reason(st.rsa_distance, v is None)}"
                                  "; its pairs are NaN", RuntimeWarning, stacklevel=4)
                ready[side].append(p)
        iu = torch.triu_indices(n, n, 1, device=dev)

        def compare(va: list[Tensor | None], vb: list[Tensor | None]) -> Tensor:
            out = torch.full((la, lb), float("nan"), dtype=torch.float64, device=dev)
            for i, a in enumerate(va):
                for j, b in enumerate(vb):
                    if a is not None and b is not None:
                        out[i, j] = kendall_tau_a(a, b) if st.rsa_compare == "kendall_tau_a" else a @ b
            return out

        result: dict[str, Any] = {"value": mask_constant(compare(ready["a"], ready["b"]), const_a, const_b)}
        if self.null and perms is not None:
            null = self._rsa_null(ready["b"], perms, iu, lambda b: compare(ready["a"], [b])[:, 0], la)
            result.update(null_summary(mask_constant(null, const_a, const_b)))
        return {"rsa": result}

    def _rsa_null(self, ready_b: list[Tensor | None], perms: Tensor, iu: Tensor,
                  against_a: Callable[[Tensor], Tensor], la: int) -> Tensor:
        """RSA's null ``(null, La, Lb)``: B's prepared RDMs with samples permuted, entries ``(π(i), π(j))``,
        ``i < j``, read from the prepared upper triangles (ranks move with their entries), each draw's places
        found once for all B layers, a few draws at a time (their places take the ``n × n`` bytes the budget
        keeps for the null); ``against_a(b)`` compares one such RDM with every A layer → ``(La,)``."""
        n, lb = perms.shape[1], len(ready_b)
        null = torch.full((self.null, la, lb), float("nan"), dtype=torch.float64, device=perms.device)
        step = max(1, (n * n) // max(1, iu.shape[1]))
        for start in range(0, self.null, step):
            places = [_condensed_places(pk, iu, n) for pk in perms[start:start + step]]
            for j, b in enumerate(ready_b):
                for t, where in enumerate(places, start):
                    if b is not None:
                        null[t, :, j] = against_a(b[where])
                    self.report(f"rsa null ({self.null} permutations)", 1, self.null * lb)
        return null

    def describe(self) -> dict[str, dict[str, Any]]:
        """How each metric was computed: its family's path (``stored-<family>``), the stored bytes, why it is
        stored, its family's settings and notes, and the interval's rule when ``settings.ci`` asks for one."""
        out = {}
        stored = self.rows.nbytes()
        for m in self.metrics:
            family = MEASURES[m].stored_family
            out[m] = {"mode": self.mode, "path": f"stored-{family}", "n": self.n,
                      "null": self.own_null.get(m, self.null), "stored_bytes": stored, "reason": self.reasons.get(m, "")}
            out[m].update(FAMILIES[family].notes(self, m))
            if self.settings.ci is not None:
                out[m]["ci"] = (f"{self.settings.ci:.0%} interval: value ± z × the standard deviation of a "
                                f"bootstrap over samples, {self.settings.ci_resamples} resamples")
        return out

    def _gram_notes(self, m: str) -> dict[str, Any]:
        notes = {"hsic": "unbiased HSIC_1" if GRAM_KINDS[m] == "unbiased" else "biased HSIC",
                 "kernel": "rbf" if GRAM_KINDS[m] == "rbf" else "linear"}
        if self.moments:
            notes["p_value"] = STORED_P_VALUE
        if GRAM_KINDS[m] == "rbf":
            notes["bandwidth"] = f"{self.rbf_factor} x median pairwise distance over all samples"
        return notes

    def _knn_notes(self, m: str) -> dict[str, Any]:
        return {"k": self.knn_k, "note": "computed on all samples in either mode"}

    def _shape_notes(self, m: str) -> dict[str, Any]:
        return {"measure": shape_notes(m), **shape_settings([m], self.settings),
                "note": "exact, from each layer's spectrum of all stored samples (in either mode)"}

    def _ridge_notes(self, m: str) -> dict[str, Any]:
        return ridge_describe(self.settings)

    def _rsa_notes(self, m: str) -> dict[str, Any]:
        return {"rsa_distance": self.settings.rsa_distance, "rsa_compare": self.settings.rsa_compare,
                "max_n": self.max_rsa_n(), "note": "RDMs of all samples (in either mode); memory O(n^2) "
                "per layer, n limited by `memory_budget_bytes`"}

    def max_rsa_n(self) -> int:
        """The largest ``n`` RSA accepts for these layers and this budget (and ``max_stored_n``)."""
        from simkit.metrics.rsa import rsa_max_n

        return min(self.max_n, rsa_max_n(self.budget, len(self.dims_a) + len(self.dims_b), bool(self.null)))


class Family(NamedTuple):
    """How the stored strategy computes one family of measures: ``compute(part, measures, samples)`` →
    ``{measure: {"value", ["null", ...]}}`` (tensors or arrays), ``notes(part, measure)`` → its ``describe()``
    entries beyond the path."""

    compute: Callable[[StoredPart, list[str], Samples], dict[str, dict[str, Any]]]
    notes: Callable[[StoredPart, str], dict[str, Any]]


#: every catalogue ``stored_family`` → how it is computed and described
FAMILIES: dict[str, Family] = {
    "gram": Family(StoredPart._gram, StoredPart._gram_notes),
    "knn": Family(StoredPart._knn, StoredPart._knn_notes),
    "cov": Family(StoredPart._shapes, StoredPart._shape_notes),
    "folds": Family(StoredPart._ridge, StoredPart._ridge_notes),
    "rdm": Family(StoredPart._rsa, StoredPart._rsa_notes),
    "pairwise": Family(compute_pairwise, pairwise_notes),
    "plugin": Family(compute_plugin, plugin_notes),
}
#: the families that serve all their measures from one shared step (one neighbour search, each layer's
#: spectrum once): computed once for all of them, first; the others measure by measure
SHARED_FAMILIES = ("knn", "cov")
