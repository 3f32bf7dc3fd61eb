"""The catalogue of similarity measures: every property of a measure that other code reads, in one place.

Torch-free and in the base layer (the CLI's help and ``simkit report`` read it without importing torch). Everything that used
to keep its own list reads this table: the accumulator's routing (``stream``: which streaming strategy
computes the measure in each mode), the default null rule (``cheap_null``), the settings recorded in
``meta.settings`` (``settings``), the report's colour ranges, "best match" direction and notes, the
``--metric`` help and the README's table of measures (``tests/base/test_catalog.py`` checks that table
against this one).

To add a measure: a row here (with its ``stored_family``), its function in ``simkit.metrics``, and its
strategy's ``compute`` branch (see DEVELOPING.md, "Add a similarity measure").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from simkit.options import Choice, Declaration, Integer, Real, option

#: the streaming strategies (one module each under ``simkit.metrics.streaming``)
STRATEGIES = ("gram", "features", "folds", "stored")
#: how a measure's chance level is found by default (:class:`Measure`'s ``chance``)
CHANCE_KINDS = ("null", "closed", "sampled")
#: permutations of a cheap null (``chance`` ``null``): about 1 % of a minibatch run (README)
DEFAULT_NULL = 10
#: permutations behind a ``sampled`` chance level: an estimate of the chance level, not a test at 5 %
DEFAULT_SAMPLED_NULL = 5
#: "beats chance" with a null of at least this many permutations: above its 95th percentile (below the
#: 5th for a distance); with fewer draws or a closed-form chance level: beyond CHANCE_MARGIN of the range
TESTED_NULL = 10
CHANCE_MARGIN = 0.05
#: "large": at least this fraction of the measure's range beyond its chance level
LARGE_EFFECT = 0.2


@dataclass(frozen=True)
class Measure:
    """One similarity measure.

    name: the ``--metric`` / ``metrics=`` name.
    range_text: its range as the README's table writes it.
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
        permutations of the stored activations (their cost per measure: README).
    settings: the fields of :class:`~simkit.metrics.settings.CompareSettings` that change its values.
    note: one line for reports and help (empty: nothing beyond its range to say).
    stored_family: how the ``stored`` strategy computes it from the stored activations (its path is
        ``stored-<family>``, its function ``simkit.metrics.streaming.stored.FAMILIES[family]``): ``gram``
        (centred Gram rows), ``knn`` (one neighbour search), ``cov`` (each layer's spectrum), ``folds``
        (cross-validated ridge), ``rdm`` (dissimilarity matrices).
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


_HALF_PI = math.pi / 2
_COVARIANCE = ("features", "features")
_STORED = ("stored", "stored")
_CCA = ("cca_eps",)

MEASURES: dict[str, Measure] = {m.name: m for m in (
    Measure("linear_cka", "[0, 1]", 0.0, 1.0, True, False, ("gram", "features"), gram="biased",
            chance=("null", "closed"), stored_family="gram"),
    Measure("unbiased_cka", "≈ [0, 1] (may be < 0 for small n)", 0.0, 1.0, True, False, ("gram", "features"),
            gram="unbiased", chance=("null", "closed"), stored_family="gram"),
    Measure("rbf_cka", "[0, 1]", 0.0, 1.0, True, False, ("gram", "stored"), gram="rbf", chance=("null", "sampled"),
            settings=("rbf_factor",), stored_family="gram"),
    Measure("mutual_knn", "[0, 1]", 0.0, 1.0, True, False, _STORED, settings=("knn_k",), stored_family="knn"),
    Measure("jaccard_knn", "[0, 1]", 0.0, 1.0, True, False, _STORED, settings=("knn_k",), stored_family="knn"),
    Measure("procrustes", "[0, 1]", 0.0, 1.0, True, False, _COVARIANCE, stored_family="cov"),
    Measure("procrustes_angle", "[0, π/2], 0 = same shape", 0.0, _HALF_PI, False, False, _COVARIANCE,
            note="procrustes_angle is an angular distance in [0, π/2]: 0 is identical up to rotation and "
                 "scale; best matches are the smallest values.", stored_family="cov"),
    Measure("cca", "[0, 1]", 0.0, 1.0, True, False, _COVARIANCE, chance=("closed", "closed"), settings=_CCA,
            stored_family="cov"),
    Measure("svcca", "[0, 1]", 0.0, 1.0, True, False, _COVARIANCE, settings=("svcca_keep", *_CCA),
            stored_family="cov"),
    Measure("pwcca", "[0, 1]", 0.0, 1.0, True, False, _COVARIANCE, settings=_CCA,
            note="pwcca weights the canonical correlations by the narrower layer of each pair (the layer of A "
                 "when both are equally wide, so then it is not symmetric).", stored_family="cov"),
    Measure("shape_metric", "[0, π/2], a metric (triangle inequality)", 0.0, _HALF_PI, False, False, _COVARIANCE,
            settings=("shape_alpha", *_CCA),
            note="shape_metric is netrep's angular shape distance in [0, π/2] (lower is more similar); best "
                 "matches are the smallest values.", stored_family="cov"),
    Measure("rsa", "[−1, 1]", -1.0, 1.0, True, False, _STORED, settings=("rsa_distance", "rsa_compare"),
            note="rsa compares the layers' dissimilarity matrices over all samples; its value is in [-1, 1].",
            stored_family="rdm"),
    Measure("ridge_r2", "(−∞, 1], 0 = the training mean", None, 1.0, True, True, ("folds", "folds"),
            settings=("ridge_lambda", "ridge_folds"),
            note="ridge_r2 is directional: each row (a layer of A) predicts a column (a layer of B) by "
                 "cross-validated ridge regression, so the matrix is not symmetric; swap the models for the "
                 "other direction. 1 is a perfect prediction, 0 no better than the mean, negative worse.",
            stored_family="folds"),
)}

# unbiased_cka first: in minibatch mode it is Nguyen et al.'s estimator (unbiased HSIC_1 per batch), and the
# report leads with the first metric; linear_cka (biased HSIC) is kept beside it for comparison
DEFAULT_METRICS = ("unbiased_cka", "linear_cka")
#: every measure's name, in the catalogue's order (the order of ``--metric``'s help)
METRICS: tuple[str, ...] = tuple(MEASURES)
#: the Gram kind of each minibatch CKA measure
GRAM_KINDS: dict[str, str] = {m.name: m.gram for m in MEASURES.values() if m.gram}
#: the measures computed from each side's covariance spectrum (``simkit.metrics.shape``)
COVARIANCE_MEASURES: tuple[str, ...] = tuple(m.name for m in MEASURES.values() if m.stream == _COVARIANCE)
#: the measures that share one neighbour search
KNN_MEASURES: tuple[str, ...] = ("mutual_knn", "jaccard_knn")


#: the measures' own settings, each declared once (default, constraint, help): the rows name the ones that
#: change their values (``settings``), ``CompareSettings`` has a field for each (``measure_setting``)
RSA_DISTANCES = ("correlation", "euclidean", "cosine")
RSA_COMPARES = ("spearman", "pearson", "kendall_tau_a")
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
    "rsa_distance": option("correlation", Choice(RSA_DISTANCES), "rsa: dissimilarity between two samples' "
                           "activations."),
    "rsa_compare": option("spearman", Choice(RSA_COMPARES), "rsa: how two RDMs' upper triangles are compared."),
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
