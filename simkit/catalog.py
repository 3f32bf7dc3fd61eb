"""The catalogue of similarity measures: every property of a measure that other code reads, in one place.

Torch-free and in the base layer (the CLI's help and ``simkit report`` read it without importing torch). Everything that used
to keep its own list reads this table: the accumulator's routing (``stream``: which streaming strategy
computes the measure in each mode), the default null rule (``cheap_null``), the settings recorded in
``meta.settings`` (``settings``), the report's colour ranges, "best match" direction and notes, the
``--metric`` help and the site's table of measures, docs/measures.md (``tests/base/test_catalog.py`` checks that table
against this one).

To add a measure: a row here (with its ``stored_family`` and ``invariances``), its function in
``simkit.metrics``, and its strategy's ``compute`` branch (see docs/contributing.md, "Add a similarity measure").
A user's own measure joins the table at run time (:func:`register_measure`, or a package's entry point in
the group ``simkit.measures``, loaded once when the table is first read: :mod:`simkit.plugins`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from simkit.errors import SimkitError
from simkit.options import Choice, Declaration, Integer, Real, option

#: the streaming strategies (one module each under ``simkit.metrics.streaming``)
STRATEGIES = ("gram", "features", "folds", "stored")
#: how a measure's chance level is found by default (:class:`Measure`'s ``chance``)
CHANCE_KINDS = ("null", "closed", "sampled")
#: permutations of a cheap null (``chance`` ``null``): about 1 % of a minibatch run (docs/chance-levels.md)
DEFAULT_NULL = 10
#: permutations behind a ``sampled`` chance level: an estimate of the chance level, not a test at 5 %
DEFAULT_SAMPLED_NULL = 5
#: "beats chance" with a null of at least this many permutations: above its 95th percentile (below the
#: 5th for a distance); with fewer draws or a closed-form chance level: beyond CHANCE_MARGIN of the range
TESTED_NULL = 10
CHANCE_MARGIN = 0.05
#: "large": at least this fraction of the measure's range beyond its chance level
LARGE_EFFECT = 0.2
#: the transformations of one side's activations a measure may be invariant to (``Measure.invariances``):
#: ``X·Q`` (Q orthogonal), ``c·X``, ``X + 1vᵀ``, ``X·W`` (W invertible), ``X·P`` (P a permutation of units)
INVARIANCES = ("rotation", "isotropic_scale", "shift", "invertible_linear", "permutation")
#: what a plug-in measure's function receives per layer (:func:`register_measure`)
PLUGIN_INPUTS = ("features", "gram", "rdm")


@dataclass(frozen=True)
class Measure:
    """One similarity measure.

    name: the ``--metric`` / ``metrics=`` name.
    range_text: its range as the measures table (docs/measures.md) writes it.
    lo, hi: the bounds of its values (``None``: unbounded on that side), the report's colour range.
    similarity: True when higher means more similar, False for a distance (best match = minimum).
    directional: True when the (A, B) matrix is not symmetric by construction (rows predict columns).
    stream: ``(minibatch strategy, exact strategy)``, each one of :data:`STRATEGIES`; the accumulator
        falls back to ``stored`` when the sums exceed the memory budget or a permutation null is asked.
    gram: the Gram kind of a CKA measure on the minibatch path (``biased``, ``unbiased``, ``rbf``).
    chance: ``(minibatch, exact)``: how its chance level is found by default (``null=None``), one of
        :data:`CHANCE_KINDS`: ``null`` a permutation null of :data:`DEFAULT_NULL` draws that costs next to
        nothing (it permutes per-batch Grams); ``closed`` the exact expectation under a random permutation
        of B's samples in closed form (no extra work); ``sampled`` :data:`DEFAULT_SAMPLED_NULL`
        permutations of the stored activations (their cost per measure: docs/chance-levels.md).
    settings: the fields of :class:`~simkit.metrics.settings.CompareSettings` that change its values.
    note: one line for reports and help (empty: nothing beyond its range to say).
    stored_family: how the ``stored`` strategy computes it from the stored activations (its path is
        ``stored-<family>``, its function ``simkit.metrics.streaming.stored.FAMILIES[family]``): ``gram``
        (centred Gram rows), ``knn`` (one neighbour search), ``cov`` (each layer's spectrum), ``folds``
        (cross-validated ridge), ``rdm`` (dissimilarity matrices), ``pairwise`` (each layer prepared once,
        then every pair: :mod:`simkit.metrics.pairs`), ``plugin`` (a registered function, per pair).
    invariances: the transformations of either side (:data:`INVARIANCES`) that leave its value unchanged
        at the default settings (``tests/metrics/test_invariances.py`` checks each, and that every other
        one changes it on some draw).
    function, input_kind: a plug-in's function and what it receives (:data:`PLUGIN_INPUTS`); None for
        the built-in measures.
    """

    name: str
    range_text: str
    lo: float | None
    hi: float | None
    similarity: bool
    directional: bool
    stream: tuple[str, str]
    gram: str | None = None
    chance: tuple[str, str] = ("sampled", "sampled")
    settings: tuple[str, ...] = ()
    note: str = ""
    stored_family: str = field(kw_only=True)
    invariances: tuple[str, ...] = field(default=(), kw_only=True)
    function: Callable[..., Any] | None = field(default=None, kw_only=True, compare=False)
    input_kind: str = field(default="features", kw_only=True)


_HALF_PI = math.pi / 2
_COVARIANCE = ("features", "features")
_STORED = ("stored", "stored")
_CCA = ("cca_eps",)
#: rotations (hence permutations of units), isotropic scaling and shifts
_SHAPE = ("rotation", "isotropic_scale", "shift", "permutation")
#: what survives Huh et al.'s k-NN preprocessing (an elementwise clamp, unit rows) and per-sample correlation distances
_SCALE_AND_UNITS = ("isotropic_scale", "permutation")

_BUILT_IN: tuple[Measure, ...] = (
    Measure("linear_cka", "[0, 1]", 0.0, 1.0, True, False, ("gram", "features"), gram="biased",
            chance=("null", "closed"), stored_family="gram", invariances=_SHAPE),
    Measure("unbiased_cka", "≈ [0, 1] (may be < 0 for small n)", 0.0, 1.0, True, False, ("gram", "features"),
            gram="unbiased", chance=("null", "closed"), stored_family="gram", invariances=_SHAPE),
    Measure("rbf_cka", "[0, 1]", 0.0, 1.0, True, False, ("gram", "stored"), gram="rbf", chance=("null", "sampled"),
            settings=("rbf_factor",), stored_family="gram", invariances=_SHAPE),
    Measure("mutual_knn", "[0, 1]", 0.0, 1.0, True, False, _STORED, settings=("knn_k",), stored_family="knn",
            invariances=_SCALE_AND_UNITS),
    Measure("jaccard_knn", "[0, 1]", 0.0, 1.0, True, False, _STORED, settings=("knn_k",), stored_family="knn",
            invariances=_SCALE_AND_UNITS),
    Measure("procrustes", "[0, 1]", 0.0, 1.0, True, False, _COVARIANCE, stored_family="cov", invariances=_SHAPE),
    Measure("procrustes_angle", "[0, π/2], 0 = same shape", 0.0, _HALF_PI, False, False, _COVARIANCE,
            note="procrustes_angle is an angular distance in [0, π/2]: 0 is identical up to rotation and "
                 "scale; best matches are the smallest values.", stored_family="cov", invariances=_SHAPE),
    Measure("cca", "[0, 1]", 0.0, 1.0, True, False, _COVARIANCE, chance=("closed", "closed"), settings=_CCA,
            stored_family="cov", invariances=(*_SHAPE, "invertible_linear")),
    Measure("svcca", "[0, 1]", 0.0, 1.0, True, False, _COVARIANCE, settings=("svcca_keep", *_CCA),
            stored_family="cov", invariances=_SHAPE),
    Measure("pwcca", "[0, 1]", 0.0, 1.0, True, False, _COVARIANCE, settings=_CCA,
            note="pwcca weights the canonical correlations by the narrower layer of each pair (the layer of A "
                 "when both are equally wide, so then it is not symmetric).", stored_family="cov",
            invariances=("isotropic_scale", "shift", "permutation")),
    Measure("shape_metric", "[0, π/2], a metric (triangle inequality)", 0.0, _HALF_PI, False, False, _COVARIANCE,
            settings=("shape_alpha", *_CCA),
            note="shape_metric is netrep's angular shape distance in [0, π/2] (lower is more similar); best "
                 "matches are the smallest values.", stored_family="cov", invariances=_SHAPE),
    Measure("rsa", "[−1, 1]", -1.0, 1.0, True, False, _STORED, settings=("rsa_distance", "rsa_compare"),
            note="rsa compares the layers' dissimilarity matrices over all samples; its value is in [-1, 1].",
            stored_family="rdm", invariances=_SCALE_AND_UNITS),
    Measure("ridge_r2", "(−∞, 1], 0 = the training mean", None, 1.0, True, True, ("folds", "folds"),
            settings=("ridge_lambda", "ridge_folds"),
            note="ridge_r2 is directional: each row (a layer of A) predicts a column (a layer of B) by "
                 "cross-validated ridge regression, so the matrix is not symmetric; swap the models for the "
                 "other direction. 1 is a perfect prediction, 0 no better than the mean, negative worse.",
            stored_family="folds", invariances=_SHAPE),
    Measure("cknna", "≈ [0, 1] (may be < 0 or > 1)", 0.0, None, True, False, _STORED, settings=("knn_k",),
            note="cknna is CKA (unbiased HSIC) restricted to the pairs of samples that are k nearest neighbours "
                 "in both layers (Huh et al. 2024); its self terms keep each layer's own neighbour pairs, so, as "
                 "in platonic-rep, it is not bounded by 1.", stored_family="pairwise", invariances=_SCALE_AND_UNITS),
    Measure("cycle_knn", "[0, 1]", 0.0, 1.0, True, True, _STORED, settings=("knn_k",),
            note="cycle_knn is directional: the fraction of samples found again among the row layer's k "
                 "neighbours of their k neighbours in the column layer (Huh et al. 2024); swap the models for "
                 "the other direction.", stored_family="pairwise", invariances=_SCALE_AND_UNITS),
    Measure("distance_correlation", "[0, 1] (bias-corrected: may be < 0 for small n)", 0.0, 1.0, True, False,
            _STORED, settings=("dcor_estimator",), stored_family="pairwise", invariances=_SHAPE),
    Measure("information_imbalance", "[0, 2), 0 = rows predict columns, ≈ 1 = chance", 0.0, 2.0, False, True,
            _STORED, note="information_imbalance is directional: Δ(A→B), how well each row layer's nearest "
            "neighbours predict the column layer's (Glielmo et al. 2022); 0 is a perfect prediction, about 1 "
            "none; best matches are the smallest values; swap the models for Δ(B→A).",
            stored_family="pairwise", invariances=_SHAPE),
    Measure("bures_similarity", "[0, 1]", 0.0, 1.0, True, False, _STORED, settings=("rsa_distance",),
            note="bures_similarity is the normalised Bures similarity of the layers' second-moment matrices "
                 "−½·H·D·H, D each layer's dissimilarities (--rsa-distance; euclidean squared, as "
                 "rsatoolbox's), so with euclidean it equals procrustes.", stored_family="pairwise",
            invariances=_SCALE_AND_UNITS),
)

#: the entry-point group of plug-in measures: each entry point names a function of no arguments that calls
#: :func:`register_measure` (``[project.entry-points."simkit.measures"] toy = "toy_pkg:register"``)
ENTRY_POINT_GROUP = "simkit.measures"
_PLUGINS_LOADED: list[bool] = []   # not empty once the entry points were read (once per process)


class Catalogue(dict[str, Measure]):
    """The measures by name: the built-in rows, then the plug-ins. Its first read loads the plug-ins of the
    installed packages (:func:`load_entry_points`), so a plug-in is in every list that reads the table
    (``--metric`` and its help, validation, routing, reports)."""

    def _ready(self) -> None:
        if not _PLUGINS_LOADED:
            load_entry_points()

    def __getitem__(self, name: str) -> Measure:
        self._ready()
        return super().__getitem__(name)

    def __contains__(self, name: object) -> bool:
        self._ready()
        return super().__contains__(name)

    def __iter__(self) -> Iterator[str]:
        self._ready()
        return super().__iter__()

    def __len__(self) -> int:
        self._ready()
        return super().__len__()

    def get(self, name: str, default: Any = None) -> Any:
        self._ready()
        return super().get(name, default)

    def values(self) -> Any:
        self._ready()
        return super().values()

    def items(self) -> Any:
        self._ready()
        return super().items()


class MeasureNames(Sequence[str]):
    """Every measure's name in catalogue order, read live (a plug-in registered later is in it)."""

    def __len__(self) -> int:
        return len(MEASURES)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        return tuple(MEASURES)[index]

    def __contains__(self, name: object) -> bool:
        return name in MEASURES

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(MEASURES))

    def __repr__(self) -> str:
        return repr(tuple(MEASURES))


MEASURES: Catalogue = Catalogue({m.name: m for m in _BUILT_IN})

# unbiased_cka first: in minibatch mode it is Nguyen et al.'s estimator (unbiased HSIC_1 per batch), and the
# report leads with the first metric; linear_cka (biased HSIC) is kept beside it for comparison
DEFAULT_METRICS = ("unbiased_cka", "linear_cka")
#: every measure's name, in the catalogue's order (the order of ``--metric``'s help), plug-ins last
METRICS: Sequence[str] = MeasureNames()
#: the built-in measures (docs/measures.md's table lists exactly these)
BUILT_IN_METRICS: tuple[str, ...] = tuple(m.name for m in _BUILT_IN)
#: the Gram kind of each minibatch CKA measure
GRAM_KINDS: dict[str, str] = {m.name: m.gram for m in _BUILT_IN if m.gram}
#: the measures computed from each side's covariance spectrum (``simkit.metrics.shape``)
COVARIANCE_MEASURES: tuple[str, ...] = tuple(m.name for m in _BUILT_IN if m.stream == _COVARIANCE)
#: the measures that share one neighbour search
KNN_MEASURES: tuple[str, ...] = ("mutual_knn", "jaccard_knn")


#: the measures' own settings, each declared once (default, constraint, help): the rows name the ones that
#: change their values (``settings``), ``CompareSettings`` has a field for each (``measure_setting``)
RSA_DISTANCES = ("correlation", "euclidean", "cosine")
RSA_COMPARES = ("spearman", "pearson", "kendall_tau_a")
DCOR_ESTIMATORS = ("bias_corrected", "plain")
MEASURE_SETTINGS: dict[str, Any] = {
    "rbf_factor": option(1.0, Real(gt=0), "rbf_cka bandwidth: this factor times the median pairwise distance."),
    "knn_k": option(10, Integer(ge=1), "Neighbours per sample for mutual_knn and jaccard_knn."),
    "shape_alpha": option(0.5, Real(ge=0, le=1), "shape_metric regularisation in [0, 1]: 0 = CCA, 1 = Procrustes "
                          "(netrep's alpha)."),
    "cca_eps": option(0.0, Real(ge=0), "Ridge for cca, svcca, pwcca, shape_metric, relative to the mean covariance "
                      "eigenvalue; 0 = none (NaN when a layer has >= n-1 dimensions)."),
    "svcca_keep": option(0.99, Real(gt=0, le=1), "svcca: keep the top principal components explaining this "
                         "fraction of variance."),
    "ridge_lambda": option(1e-2, Real(ge=0), "ridge_r2 ridge, relative to the mean eigenvalue of A's training "
                           "covariance (0 = least squares)."),
    "ridge_folds": option(5, Integer(ge=2), "ridge_r2 cross-validation folds (sample i in fold i mod k). ridge_r2 "
                          "is directional: rows (A) predict columns (B)."),
    "rsa_distance": option("correlation", Choice(RSA_DISTANCES), "rsa and bures_similarity: dissimilarity "
                           "between two samples' activations."),
    "rsa_compare": option("spearman", Choice(RSA_COMPARES), "rsa: how two RDMs' upper triangles are compared."),
    "dcor_estimator": option("bias_corrected", Choice(DCOR_ESTIMATORS), "distance_correlation: bias_corrected "
                             "(Székely & Rizzo's squared dCor from U-centred distances, ≈ 0 for independent "
                             "data) or plain (dCor, biased upwards in high dimension)."),
}


def measure_setting(name: str) -> Any:
    """The dataclass field of measure setting ``name``, as :data:`MEASURE_SETTINGS` declares it."""
    return MEASURE_SETTINGS[name]


def measure_setting_declaration(name: str) -> Declaration:
    """The declaration (constraint, help) of measure setting ``name``."""
    return MEASURE_SETTINGS[name].metadata["simkit_option"]


def null_help() -> str:
    """The ``--null`` help, from the catalogue's chance rules (so it cannot drift from them)."""
    def names(mode: str, kind: str) -> str:
        chosen = [m for m in METRICS if chance_kind(m, mode) == kind]
        return ", ".join(chosen) if chosen else "none"

    return ("Permutations of B's samples for a null band, for every measure (0 = none). Default: each measure's "
            f"chance level as the catalogue says: a cheap null of {DEFAULT_NULL} permutations for "
            f"{names('minibatch', 'null')} in minibatch mode; a closed form (no permutations) for "
            f"{names('exact', 'closed')} in exact mode (cca only without --cca-eps); "
            f"{DEFAULT_SAMPLED_NULL} permutations of the stored activations for the others.")


def strategy(name: str, mode: str) -> str:
    """The streaming strategy that computes ``name`` in ``mode`` (``minibatch`` or ``exact``) when its sums
    fit the memory budget and no permutation null is asked for."""
    minibatch, exact = MEASURES[name].stream
    return minibatch if mode == "minibatch" else exact


def chance_kind(name: str, mode: str, cca_eps: float = 0.0) -> str:
    """How ``name``'s chance level is found by default in ``mode`` (one of :data:`CHANCE_KINDS`); the
    closed form of ``cca`` holds without a ridge only (``cca_eps`` = 0)."""
    minibatch, exact = MEASURES[name].chance
    kind = minibatch if mode == "minibatch" else exact
    return "sampled" if kind == "closed" and name == "cca" and cca_eps > 0 else kind


def default_permutations(name: str, mode: str, cca_eps: float = 0.0) -> int:
    """The permutations ``null=None`` gives ``name``: :data:`DEFAULT_NULL` for a cheap null, none for a
    closed form, :data:`DEFAULT_SAMPLED_NULL` otherwise."""
    kind = chance_kind(name, mode, cca_eps)
    return {"null": DEFAULT_NULL, "closed": 0, "sampled": DEFAULT_SAMPLED_NULL}[kind]


def used_by(setting: str) -> tuple[str, ...]:
    """The measures whose values ``setting`` changes."""
    return tuple(m.name for m in MEASURES.values() if setting in m.settings)


def metric_help() -> str:
    """The measures for the ``--metric`` help, in catalogue order."""
    return ", ".join(METRICS)


def colour_bounds(name: str) -> tuple[float | None, float | None]:
    """The colour range of ``name``'s heatmaps: its bounds when both are finite and it has no sign to
    show (``rsa`` and unknown names: ``(None, None)``, the data's range)."""
    measure = MEASURES.get(name)
    if measure is None or measure.lo is None or measure.hi is None or measure.lo < 0:
        return None, None
    return measure.lo, measure.hi


def range_width(name: str) -> float:
    """The width of ``name``'s range (1 for a measure unbounded below, such as ``ridge_r2``, whose
    meaningful span is [0, 1])."""
    measure = MEASURES[name]
    if measure.lo is None or measure.hi is None:
        return 1.0
    return measure.hi - measure.lo


def beats_chance_rule(name: str, permutations: int) -> str:
    """The rule :func:`simkit.engine.assemble` applies for ``beats_chance``, in words (reports state it)."""
    side = "above its 95th percentile" if MEASURES[name].similarity else "below its 5th percentile"
    if permutations >= TESTED_NULL:
        return f"{side} of a {permutations}-permutation null"
    margin = CHANCE_MARGIN * range_width(name)
    word = "above" if MEASURES[name].similarity else "below"
    return f"more than {margin:.3g} {word} its chance level ({CHANCE_MARGIN:.0%} of the range)"


# ------------------------------------------------------------------------------------------ plug-ins

#: a plug-in's name: what ``--metric`` and the measures table's pattern accept
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def register_measure(name: str, fn: Callable[..., Any], *, similarity: bool = True,
                     range: tuple[float | None, float | None] = (0.0, 1.0),
                     directional: bool = False, invariances: Sequence[str] = (), input: str = "features",
                     note: str = "") -> Measure:
    """Add the user's measure ``name`` to the catalogue: from then on it is a ``metrics=`` / ``--metric``
    name with the stored path in both modes, a chance level from permutations of B's samples, ``ci``
    by bootstrap, heatmaps, the study and the CLI.

    fn: called once per layer pair (and per permutation) with two float64 torch tensors, ``(n, p)`` and
    ``(n, q)`` (``input="features"``), the ``(n, n)`` Grams ``X·Xᵀ``, ``Y·Yᵀ`` of the column-centred
    activations (``"gram"``) or the ``(n, n)`` dissimilarity matrices under ``rsa_distance`` (``"rdm"``);
    returns a real scalar (a float or a one-element tensor). similarity: True when higher means more
    similar. range: its bounds ``(lo, hi)`` (None: unbounded), the report's colour range. directional:
    True when fn(x, y) ≠ fn(y, x) (rows predict columns). invariances: out of :data:`INVARIANCES`.
    A built-in name is refused; registering a plug-in's name again replaces it. Returns its row.
    """
    _check_plugin(name, fn, range, invariances, input)
    lo, hi = (None if v is None else float(v) for v in range)
    text = f"[{_bound(lo, '−∞')}, {_bound(hi, '∞')}]"
    row = Measure(name, text, lo, hi, bool(similarity), bool(directional), _STORED,
                  settings=("rsa_distance",) if input == "rdm" else (),
                  note=note or f"{name} is a plug-in measure ({getattr(fn, '__module__', '?')}."
                               f"{getattr(fn, '__qualname__', type(fn).__name__)}).",
                  stored_family="plugin", invariances=tuple(invariances), function=fn, input_kind=input)
    dict.__setitem__(MEASURES, name, row)
    return row


def _bound(value: float | None, infinite: str) -> str:
    return infinite if value is None else f"{value:g}"


def _check_plugin(name: Any, fn: Any, bounds: Any, invariances: Sequence[str], kind: str) -> None:
    """The one-line refusals of :func:`register_measure`, each naming the measure."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SimkitError(f"measure name {name!r} is not a lower-case identifier; register it as e.g. 'my_measure'")
    built_in = dict.get(MEASURES, name)
    if built_in is not None and built_in.function is None:
        raise SimkitError(f"measure {name!r} is a built-in measure of simkit; register yours under another name")
    if not callable(fn):
        raise SimkitError(f"measure {name!r}: `fn` must be a function of two tensors, got {type(fn).__name__}")
    lo, hi = bounds if isinstance(bounds, tuple | list) and len(bounds) == 2 else (1, 0)
    if (lo is not None and hi is not None and not float(lo) < float(hi)):
        raise SimkitError(f"measure {name!r}: `range` must be (lo, hi) with lo < hi (None: unbounded), got {bounds!r}")
    unknown = [v for v in invariances if v not in INVARIANCES]
    if unknown or isinstance(invariances, str):
        raise SimkitError(f"measure {name!r}: unknown invariances {unknown or invariances!r}; valid: "
                          f"{', '.join(INVARIANCES)}")
    if kind not in PLUGIN_INPUTS:
        raise SimkitError(f"measure {name!r}: `input` must be one of {', '.join(PLUGIN_INPUTS)}, got {kind!r}")


def unregister_measure(name: str) -> None:
    """Remove plug-in measure ``name`` from the catalogue (a built-in one is refused)."""
    row = dict.get(MEASURES, name)
    if row is None or row.function is None:
        raise SimkitError(f"measure {name!r} is not a registered plug-in; nothing to remove")
    dict.__delitem__(MEASURES, name)


def load_entry_points() -> list[str]:
    """Load the plug-ins of the installed packages: call each entry point of the group
    :data:`ENTRY_POINT_GROUP` (a function that calls :func:`register_measure`). Runs on the catalogue's
    first read; call it again after installing a package in a running process. A plug-in that fails to load
    is skipped with a warning naming it (a broken package must not break every command). Returns the
    names of the entry points loaded."""
    import warnings
    from importlib.metadata import entry_points

    _PLUGINS_LOADED.append(True)
    loaded = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            point.load()()
            loaded.append(point.name)
        except Exception as error:  # any failure of a third-party package: skip it, say so
            reason = " ".join(str(error).split()) or type(error).__name__
            warnings.warn(f"simkit: plug-in measure {point.name!r} ({point.value}) was not loaded: {reason}",
                          RuntimeWarning, stacklevel=2)
    return loaded
