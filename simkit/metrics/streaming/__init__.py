"""Streaming all-pairs similarity accumulators: every layer of A against every layer of B, batch by batch.

One call builds the accumulator the engine feeds (spec §0.1–0.3)::

    acc = make_accumulator(CompareSettings(metrics=["linear_cka", "unbiased_cka"]), dims_a, dims_b)
    for index, (acts_a, acts_b) in batches:  # acts_a: list of (b, p_i) tensors, acts_b: list of (b, q_j)
        acc.update(acts_a, acts_b, batch_index=index)
    # under torchrun the engine combines the ranks here (simkit.engine; see "Distributed" below)
    acc.compute()  # {metric: {"value": (La, Lb), ["null": (K, La, Lb), "null_mean", "null_p95"]}}
    acc.describe() # {metric: {"mode", "path", "n", ...}} for result.meta

How each metric is computed (``path`` in :meth:`Accumulator.describe`), one module per strategy:
``minibatch.py`` (per-batch Gram HSIC streams), ``features.py`` (exact feature-space sums),
``stored.py`` (stored activations: exact Gram rows, RBF, k-NN, the exact null), ``common.py`` (layer
names for warnings and errors, batch checks, the null draws), ``state.py`` (the states each part declares:
``sum``, ``shifted_sum`` with its shift, ``cat`` for stored rows). Every estimator step
is written once, in :mod:`simkit.metrics.cka` (HSIC_1 from its terms, centring and U-centring, the one
chunked median, the RBF kernel, the CKA ratio with its zero-denominator rule), and the one constant
rule in :mod:`simkit.metrics._checks` (:func:`~simkit.metrics._checks.constant_columns`,
:func:`~simkit.metrics._checks.is_constant`); the paths only stream the sums those functions need.

* ``minibatch`` mode, ``linear_cka`` / ``unbiased_cka`` / ``rbf_cka`` — path ``"gram"`` (Nguyen et al.
  2021). Per batch each layer's Gram ``K = x xᵀ`` is computed ONCE, in the activations' dtype
  (:mod:`simkit.metrics.gram`: a chunked symmetric product on the CPU; a layer whose features are
  dominated by their mean is computed from features shifted by the batch's first row — HSIC is
  unchanged by a shift), then moved to float64 and centred (``HKH``, biased HSIC, for ``linear_cka``
  and ``rbf_cka``) or U-centred (HSIC_1, for ``unbiased_cka``). The flattened Grams of all layers are
  stacked as ``(L, b²)`` rows and every pair's HSIC comes from one matrix product.
  Per batch HSIC is normalised by ``(b−1)²`` (biased) or ``b(b−3)`` (HSIC_1), so batches of unequal size
  are averaged as HSIC values; the three streams are summed and the ratio is taken at the end.
  ``rbf_cka``: per-batch RBF Grams with the batch's median pairwise distance (pairs ``i < j``) times
  ``rbf_factor``; a zero bandwidth uses the ``σ → 0`` limit ``K = [d = 0]``.
  Small batches: a batch with ``b < 2`` is skipped by every metric and one with ``b < 4`` by
  ``unbiased_cka`` (HSIC_1 needs 4 samples); the counts are in ``describe()`` and a warning is issued.
  If a metric gets no batch at all, :meth:`compute` raises :class:`SimkitError`.
* ``exact`` mode, ``linear_cka`` / ``unbiased_cka`` — path ``"features"``: feature-space sums streamed
  over batches, memory independent of ``n``. All layers of A are concatenated into one ``(b, P)``
  matrix, all of B into ``(b, Q)``, and the cross-product ``XᵀY`` (P×Q) and its move in float64 to a
  fixed reference shift per column (the first batch's mean, a rank-2 term) are added to the float64 sum
  by ONE float64 matmul per batch ``[X̃ᵀ U] [Ỹ; V]`` on batch-centred features (so every product depends
  on its batch alone, and the P×Q sum is read and written once per batch). HSIC is unchanged by a constant shift, and the shift removes the cancellation
  that large feature means would cause (the quartic terms lose ``(mean/std)⁴`` digits without it).
  With the per-layer self products, column sums, row-norm sums, ``Σ_r x_r‖y_r‖²`` and ``Σ‖x_r‖²‖y_r‖²``,
  the biased HSIC ``‖X_cᵀY_c‖²`` and the unbiased ``n(n−3)·HSIC_1`` (spec §0.2 feature-space form,
  expanded about the exact global mean) follow exactly at the end. Needs about
  ``8·P·Q + 20·(Σp_i² + Σq_j²)`` bytes (:func:`feature_path_bytes`); when that exceeds
  ``memory_budget_bytes`` the metric falls back to path ``"stored-gram"``.
* path ``"stored-gram"`` (exact ``rbf_cka``, exact CKA beyond the memory budget, and every exact CKA
  metric when a permutation null is asked for): the activations are stored (in their dtype, normally
  float32: ``n·(P+Q)·itemsize`` bytes) up to ``max_stored_n`` samples — beyond that :class:`SimkitError`
  tells the user to use ``mode="minibatch"`` or ``reduce="mean"``. At the end the centred (or
  U-centred, or centred RBF) Gram rows are produced in blocks of rows that take a quarter of the budget,
  so memory is ``O((La+Lb)·rows·n)``; when the whole Grams fit, each is made once (one ``X̃X̃ᵀ`` per layer
  serves linear and unbiased CKA together). Without a null, linear and unbiased CKA get the feature
  path's closed-form chance level. ``rbf_cka`` also needs one ``n × n`` distance matrix per layer for the
  exact median.
* ``mutual_knn`` (both modes) — path ``"stored-knn"``: activations stored as above, each layer's exact
  k nearest neighbours computed once (``simkit.metrics.knn``, Huh et al. preprocessing), every pair's
  score from the neighbour sets. Always computed on all the data, also in minibatch mode.

* ``procrustes``, ``procrustes_angle``, ``cca``, ``svcca``, ``pwcca``, ``shape_metric`` (both modes; always
  exact, on all samples) — path ``"features"`` when the feature-space sums fit ``memory_budget_bytes``
  and no null is asked for: they need only the centred self blocks ``X̃ᵀX̃``, ``ỸᵀỸ`` and the cross sum
  ``X̃ᵀỸ`` that exact CKA streams, so with exact CKA they share its one product per batch. At the end each
  layer's covariance is eigendecomposed once and every pair costs two products and one SVD of
  ``p_i × q_j`` (:mod:`simkit.metrics.streaming.shapes`, :mod:`simkit.metrics.shape`). Otherwise path
  ``"stored-cov"``: each layer's spectrum from its stored samples (``n × min(n, p)`` float64 per layer,
  via the ``n × n`` Gram when ``p > n``), the null permuting B's rows of those bases.
* ``ridge_r2`` (both modes, exact) — path ``"folds"``: per-fold moments streamed (sample ``g`` in fold
  ``g mod ridge_folds``, ``g`` its global position, from ``row_offset``), about ``8·k·(P·Q + Σp_i²)`` bytes
  (:func:`~simkit.metrics.streaming.folds.fold_path_bytes`), taken when the number of samples is not
  known (``expected_n``) or they would not fit the budget when stored (:func:`stored_samples_bytes`,
  at most ``max_stored_n``); when they fit, beyond the budget or with a null, path
  ``"stored-folds"`` (the same estimator on stored samples, one A layer at a time: its fold factorisations
  made once for the value and every permutation of a null; a wide layer in sample space,
  :class:`~simkit.metrics.predictivity.SampleFolds`). Directional: A's
  layers (rows) predict B's (columns).
* ``rsa`` (both modes) — path ``"stored-rdm"``: one RDM upper triangle per layer from the stored
  samples, in row blocks; ``n`` is limited to what ``memory_budget_bytes`` allows
  (:func:`simkit.metrics.rsa.rsa_max_n`, in ``describe()["rsa"]["max_n"]``), above it a
  :class:`SimkitError` says the limit.
* ``jaccard_knn`` — path ``"stored-knn"`` with ``mutual_knn`` (the neighbour sets are searched once for both).

Permutation null (``null=K > 0``): the metric recomputed with B's samples shuffled K times, reported
as ``null`` (K, La, Lb), ``null_mean`` and ``null_p95`` (95th percentile, linear interpolation).
Minibatch mode permutes B's centred Grams within each batch (centring commutes with permutations), with
the permutations of batch ``i`` drawn from ``(seed, i)``, ``i`` the batch's global position
(``batch_index``; default: the number of earlier :meth:`~Accumulator.update` calls, right in one
process; the engine passes the global index under torchrun), so the draws do not depend on the number
of processes. Exact
mode needs the stored activations (``n·(P+Q)·itemsize`` bytes) and costs K extra Gram passes over B's
layers (``K·n²·ΣQ`` multiply-adds).

Constant layers: CKA is undefined; the pairs involving them are NaN and a ``RuntimeWarning`` names the
layer (``names_a`` / ``names_b``). Non-finite activations raise :class:`SimkitError` naming the layer, in
:meth:`update`, at no extra pass over the features: from the Gram's trace (minibatch), the column sums
(feature path), or one sum per layer (stored paths).

Distributed (done by the engine; nothing here imports ``torch.distributed``): every part declares its
states (:mod:`simkit.metrics.streaming.state`) and the accumulator reaches them alone, whatever the part:
:meth:`~Accumulator.state` lists every float64 sum; adding the states of two accumulators fed with
disjoint batches gives the state of one fed with all of them, provided they use the same reference shifts (minibatch sums have none; the
feature path takes its shifts from the first batch it sees, so they are first made common:
:meth:`~Accumulator.shifts` of rank 0 broadcast, then :meth:`~Accumulator.rebase`, exact in float64).
Stored paths (:attr:`~Accumulator.needs_gather`) hold activations, not sums: every rank's
:meth:`~Accumulator.stored_payload` is all-gathered and handed to :meth:`~Accumulator.load_stored`,
which puts them back in global batch order. So, on every rank::

    acc.to(device)
    shifts = acc.shifts(); broadcast(shifts, src=0); acc.rebase(shifts)   # when shifts is not []
    for t in acc.state(): all_reduce(t)                                   # SUM
    if acc.needs_gather: acc.load_stored(all_gather_object(acc.stored_payload()), device)

Every product depends on its batch alone, so 1 and N processes agree to float64 rounding.
:meth:`Accumulator.merge` combines two accumulators in one process the same way.
"""


from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from simkit.catalog import GRAM_KINDS, METRICS, STRATEGIES, strategy
from simkit.errors import SimkitError
from simkit.metrics.settings import MODES, CompareSettings
from simkit.metrics.streaming.common import (
    Names,
    Part,
    PhaseProgress,
    Values,
    check_batch,
    exchangeable_share,
)
from simkit.metrics.streaming.features import FeaturePart, feature_path_bytes
from simkit.metrics.streaming.folds import FoldPart, fold_path_bytes
from simkit.metrics.streaming.minibatch import GramMemo, MinibatchPart
from simkit.metrics.streaming.pvalues import (
    Draws,
    check_groups_cover,
    describe_p_values,
    group_codes,
    with_p_values,
)
from simkit.metrics.streaming.state import State, StoredPayload
from simkit.metrics.streaming.stored import StoredPart
from simkit.settings.memory import budget_source, memory_budget

__all__ = ["GRAM_KINDS", "METRICS", "MODES", "Accumulator", "feature_path_bytes", "fold_path_bytes",
           "make_accumulator"]


class Accumulator:
    """All chosen metrics over all layer pairs, fed batch by batch (see the module docstring).

    Every operation beyond feeding and computing (moving, merging, re-basing, saving and loading) goes
    through the parts' declared states (:mod:`simkit.metrics.streaming.state`), in part order."""

    def __init__(self, parts: Sequence[Part], metrics: list[str], dims_a: list[int], dims_b: list[int], *,
                 p_values: bool = False, groups: Tensor | None = None):
        self.parts, self.metrics, self.dims_a, self.dims_b = list(parts), metrics, dims_a, dims_b
        self.p_values, self.groups = p_values, groups   # a p-value per cell; the samples' group codes
        self.calls = 0
        self.rows = 0

    @property
    def states(self) -> list[State]:
        """Every part's declared states, in part order."""
        return [st for part in self.parts for st in part.states]

    @property
    def needs_gather(self) -> bool:
        """True when some metric holds stored activations (ranks exchange :meth:`stored_payload`)."""
        return any(st.gathered for st in self.states)

    def update(self, acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], batch_index: int | None = None,
               row_offset: int | None = None) -> None:
        """Add one batch: ``acts_a`` L_a tensors ``(b, p_i)``, ``acts_b`` L_b tensors ``(b, q_j)``, same rows.

        ``batch_index``: the batch's global position (seeds the minibatch null, orders stored samples).
        Default: the number of earlier calls (the position in one process; under torchrun the caller
        passes the global index). ``row_offset``: the global position of the batch's first sample (the
        folds of ``ridge_r2``); default: the rows of earlier calls (right in one process, in order).
        """
        b = check_batch(acts_a, acts_b, self.dims_a, self.dims_b)
        if batch_index is None:
            batch_index = self.calls
        offset = self.rows if row_offset is None else int(row_offset)
        check_groups_cover(self.groups, offset, b)
        self.calls += 1
        self.rows += b
        for part in self.parts:
            part.update(acts_a, acts_b, b, int(batch_index), offset)

    def to(self, device: torch.device | str) -> Accumulator:
        """Move every state to ``device`` (e.g. an accumulator that saw no batch, before an NCCL all_reduce)."""
        for st in self.states:
            st.to(torch.device(device))
        return self

    def state(self) -> list[Tensor]:
        """Every float64 sum (the live tensors): adding them in place across ranks combines the ranks."""
        return [t for st in self.states for t in st.summed()]

    def shifts(self) -> list[Tensor]:
        """The reference shifts (float64 tensors) of the shifted sums (two per such state: the feature and
        fold paths', in part order); ``[]`` without one."""
        return [t for st in self.states for t in st.shifts()]

    def rebase(self, shifts: Sequence[Tensor]) -> None:
        """Re-reference the shifted sums to ``shifts`` (as returned by :meth:`shifts`, e.g. rank 0's)."""
        expected = sum(st.shift_count for st in self.states)
        if len(shifts) != expected:
            raise SimkitError(f"`shifts` must be shifts() of an accumulator built with the same arguments "
                              f"({expected} tensors), got {len(shifts)}")
        start = 0
        for st in self.states:
            st.rebase(shifts[start:start + st.shift_count])
            start += st.shift_count

    def stored_payload(self) -> list[StoredPayload]:
        """This process's stored samples (picklable, tensors on the CPU, with their global batch indices),
        for :meth:`load_stored` on every rank; ``[]`` when no metric stores activations."""
        return [st.payload() for st in self.states if st.gathered]

    def load_stored(self, payloads: Sequence[object], device: torch.device | str | None = None) -> None:
        """Replace the stored samples with those of all ``payloads`` (each one :meth:`stored_payload`, e.g.
        of every rank, this one's included), merged in global batch order, on ``device``."""
        gathered = [st for st in self.states if st.gathered]
        lists = [list(p) for p in payloads if isinstance(p, list | tuple)]
        if len(lists) != len(payloads) or any(len(p) != len(gathered) for p in lists):
            raise SimkitError("`payloads` must be stored_payload() results of accumulators built with the "
                              "same arguments")
        for k, st in enumerate(gathered):
            st.load([p[k] for p in lists], device)

    def merge(self, other: Accumulator) -> Accumulator:
        """Fold in ``other`` (built with the same arguments, fed other batches): every declared state merges
        (sums add, shifted sums add once re-based to this one's shifts, stored rows append).

        With ``ridge_r2`` the batches of both must have been given their global ``row_offset``."""
        for mine, theirs in zip(self.states, other.states, strict=True):
            mine.merge(theirs)
        self.rows += other.rows
        return self

    def compute(self, progress: PhaseProgress | None = None) -> Values:
        """``{metric: {"value": (La, Lb)[, "null": (K, La, Lb), "null_mean", "null_p95"]}}`` in float64.

        ``progress(phase, advance, total)`` hears of the long steps of the stored paths (each neighbour
        search, each permutation of a null); None: silent."""
        out: Values = {}
        for part in self.parts:
            out.update(part.compute(progress))
        out = {m: out[m] for m in self.metrics}
        return with_p_values(out, self.metrics) if self.p_values else out

    def describe(self) -> dict[str, dict[str, Any]]:
        """How each metric was computed: ``{metric: {"mode", "path", "n", ...}}``."""
        out: dict[str, dict[str, Any]] = {}
        for part in self.parts:
            out.update(part.describe())
        out = {m: out[m] for m in self.metrics}
        return describe_p_values(out) if self.p_values else out


def make_accumulator(settings: CompareSettings, dims_a: Sequence[int], dims_b: Sequence[int], *,
                     names_a: Sequence[str] | None = None, names_b: Sequence[str] | None = None,
                     max_stored_n: int = 50_000, groups: Sequence[Any] | Tensor | None = None,
                     blocks: Tensor | None = None, memo_b: GramMemo | None = None,
                     expected_n: int | None = None) -> Accumulator:
    """An accumulator of ``settings.metrics`` for layers of widths ``dims_a`` (model A) × ``dims_b`` (model B).

    settings: :class:`~simkit.metrics.settings.CompareSettings` (validated here unless it already is): the
    mode (``"exact"`` full-data values, or ``"minibatch"``, Nguyen et al.'s averaged HSIC streams; the
    measures other than CKA are always full-data), the null (K permutations of B's samples, 0: none), its
    seed, the memory budget and the measures' own settings. names_*: layer names used in warnings and
    errors (default ``A[i]``, ``B[j]``). groups: one group label per sample in data order (the labels of
    ``settings.groups``): every permutation moves a sample only within its group. With ``settings.p_values``
    every value gets a ``p_value`` (:mod:`simkit.metrics.streaming.pvalues`). blocks: ``(rows,)`` int64, the
    sequence or image each row (a token, a position) comes from, in data order: every permutation moves whole
    blocks onto blocks of the same size and a bootstrap resamples whole blocks
    (:func:`~simkit.metrics.streaming.common.block_perms`). memo_b: a
    :class:`~simkit.metrics.streaming.minibatch.GramMemo` when B's activations and batches are the same at
    every use (a monitor's fixed reference): the minibatch path then computes B's Grams once. expected_n:
    the samples the accumulator will be fed, when known: ``ridge_r2`` stores them (faster) when they fit
    the memory budget and ``max_stored_n``, and streams its fold sums otherwise or when ``n`` is not known.
    Paths and their memory: module docstring.
    """
    if not isinstance(settings, CompareSettings):
        raise SimkitError(f"`settings` must be a CompareSettings, got {type(settings).__name__}")
    settings = settings.validate()
    dims_a, dims_b = [int(d) for d in dims_a], [int(d) for d in dims_b]
    if not dims_a or not dims_b or min(dims_a + dims_b) < 1:
        raise SimkitError(f"every model needs at least one layer of width >= 1, got {dims_a} and {dims_b}")
    names = Names(names_a, names_b, len(dims_a), len(dims_b))
    codes = group_codes(groups)
    if blocks is not None:
        if codes is not None:
            raise SimkitError("`groups` and `blocks` cannot restrict one null together; give one of them")
        blocks = torch.as_tensor(blocks, dtype=torch.int64).cpu()
    stored_n = None if expected_n is None else int(expected_n)
    parts = _parts(settings, dims_a, dims_b, names, int(max_stored_n), codes, blocks, memo_b, stored_n)
    return Accumulator(parts, list(settings.metrics), dims_a, dims_b, p_values=bool(settings.p_values),
                       groups=codes)


def stored_samples_bytes(dims_a: Sequence[int], dims_b: Sequence[int], n: int, itemsize: int = 4) -> int:
    """Bytes of ``n`` stored float32 samples of every layer of both models."""
    return itemsize * int(n) * (sum(dims_a) + sum(dims_b))


def _ridge_stores(dims_a: Sequence[int], dims_b: Sequence[int], expected_n: int | None, max_stored_n: int,
                  budget: int) -> bool:
    """Whether ``ridge_r2`` stores its samples instead of streaming its fold sums: when their number is
    known, at most ``max_stored_n``, and they fit the budget (the stored fold solves are the faster path;
    the streamed sums keep memory flat in n, so an unknown n streams)."""
    if expected_n is None or expected_n > max_stored_n:
        return False
    return stored_samples_bytes(dims_a, dims_b, expected_n) <= budget


def _stored_reason(name: str, settings: CompareSettings, needed: int, what: str, draws: int, budget: int,
                   expected_n: int | None = None) -> str:
    """Why ``name`` takes the stored path: its own nature, a permutation null, the memory budget, or (the
    fold sums of ``ridge_r2``) stored samples that fit it: the stored fold solves are the faster path."""
    if strategy(name, settings.mode) == "stored":
        return _STORED_REASONS.get(name, "it needs all samples at once")
    if draws:
        return "a permutation null needs stored activations"
    if settings.ci is not None:
        return "a bootstrap interval needs stored activations"
    source = f"memory_budget_bytes={budget} ({budget_source(settings.memory_budget_bytes)})"
    if needed > budget:
        return f"{what} need {needed} bytes > {source}"
    return (f"its {expected_n} samples fit {source} when stored, and the stored fold solves are faster than "
            f"streaming {what}")


_STORED_REASONS = {"mutual_knn": "k-NN needs all samples", "jaccard_knn": "k-NN needs all samples",
                   "rsa": "RDMs need all samples", "rbf_cka": "RBF kernels need all samples",
                   "cknna": "k-NN needs all samples", "cycle_knn": "k-NN needs all samples",
                   "distance_correlation": "distance matrices need all samples",
                   "information_imbalance": "distance ranks need all samples",
                   "bures_similarity": "second-moment matrices need all samples"}


def _parts(settings: CompareSettings, dims_a: list[int], dims_b: list[int], names: Names,
           max_stored_n: int, groups: Tensor | None = None, blocks: Tensor | None = None,
           memo_b: GramMemo | None = None, expected_n: int | None = None) -> list[Part]:
    """The strategies of an accumulator: each metric goes to the strategy the catalogue names for its mode
    (``simkit.catalog``), or to the stored one when its sums exceed the budget or a null is asked, and
    ``ridge_r2`` when its ``expected_n`` samples fit the budget (:func:`_ridge_stores`)."""
    draws = Draws(settings, len(dims_a) * len(dims_b), groups is not None or blocks is not None)
    if blocks is not None and any(draws.of(name) for name in settings.metrics):
        check_exchangeable(blocks)
    routed: dict[str, list[str]] = {name: [] for name in STRATEGIES}
    reasons: dict[str, str] = {}
    budget = memory_budget(settings.memory_budget_bytes)
    sizes = {"features": (feature_path_bytes(dims_a, dims_b), "the feature-space sums"),
             "folds": (fold_path_bytes(dims_a, dims_b, settings.ridge_folds), "the per-fold sums")}
    samples_fit = _ridge_stores(dims_a, dims_b, expected_n, max_stored_n, budget)
    for name in settings.metrics:
        where = strategy(name, settings.mode)
        needed, what = sizes.get(where, (0, ""))
        if where in sizes and (draws.of(name) or settings.ci is not None or needed > budget
                               or (where == "folds" and samples_fit)):
            where = "stored"
        if where == "stored":
            reasons[name] = _stored_reason(name, settings, needed, what, draws.of(name), budget, expected_n)
        routed[where].append(name)
    parts: list[Part] = []
    if routed["gram"]:
        first = routed["gram"][0]
        parts.append(MinibatchPart(routed["gram"], dims_a, dims_b, draws.of(first), settings.seed,
                                   settings.rbf_factor, names, settings.ci, settings.ci_resamples,
                                   moments=draws.moment_matched(first), groups=groups, blocks=blocks,
                                   memo_b=memo_b))
    if routed["features"]:
        parts.append(FeaturePart(routed["features"], dims_a, dims_b, names, settings, settings.mode))
    if routed["folds"]:
        parts.append(FoldPart(dims_a, dims_b, names, settings, settings.mode))
    if routed["stored"]:
        parts.append(StoredPart(routed["stored"], settings.mode, dims_a, dims_b,
                                draws.stored(routed["stored"]), settings.seed,
                                settings.rbf_factor, settings.knn_k, budget, max_stored_n, names, reasons,
                                settings, moments=bool(settings.p_values) and groups is None and blocks is None,
                                own_null=draws.own(routed["stored"]), groups=groups, blocks=blocks))
    return parts


#: the least share of rows in blocks that another block of the same size can replace (``check_exchangeable``)
LEAST_EXCHANGEABLE = 0.5


def check_exchangeable(blocks: Tensor) -> None:
    """A SimkitError when fewer than :data:`LEAST_EXCHANGEABLE` of the rows sit in blocks (sequences) that
    share their length with another block: a block permutation (:func:`~.common.block_perms`) could not move
    them, so the null would be close to the observed value."""
    share = exchangeable_share(blocks)
    if share < LEAST_EXCHANGEABLE:
        raise SimkitError(f"only {share:.0%} of the tokens sit in sequences that share their length with another "
                          "sequence, and a null permutes whole sequences of equal length only; pad or truncate "
                          "every sequence to one length (e.g. `max_length` of the data, at most the shortest "
                          "text's tokens), or set `null` 0")
