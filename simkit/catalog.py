"""The catalogue of similarity measures: every property of a measure that other code reads, in one place.

Torch-free and in the base layer (the CLI's help and ``simkit report`` read it without importing torch). Everything that used
to keep its own list reads this table: the accumulator's routing (``stream``: which streaming strategy
computes the measure in each mode), the default null rule (``cheap_null``), the settings recorded in
``meta.settings`` (``settings``), the report's colour ranges, "best match" direction and notes, the
``--metric`` help and the README's table of measures (``tests/test_catalog.py`` checks that table
against this one).

To add a measure: a row here, its function in ``simkit.metrics``, and its strategy's ``compute`` branch
(see DEVELOPING.md, "Adding a measure").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: the streaming strategies (one module each under ``simkit.metrics.streaming``)
STRATEGIES = ("gram", "features", "folds", "stored")


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
    cheap_null: True when a permutation null costs next to nothing (it permutes per-batch Grams), so
        ``null=None`` runs one in minibatch mode.
    settings: the fields of :class:`~simkit.metrics.settings.CompareSettings` that change its values.
    note: one line for reports and help (empty: nothing beyond its range to say).
    """

    name: str
    range_text: str
    lo: float | None
    hi: float | None
    similarity: bool
    directional: bool
    stream: tuple[str, str]
    gram: str | None = None
    cheap_null: bool = False
    settings: tuple[str, ...] = ()
    note: str = ""


_HALF_PI = math.pi / 2
_COVARIANCE = ("features", "features")
_STORED = ("stored", "stored")
_CCA = ("cca_eps",)

MEASURES: dict[str, Measure] = {m.name: m for m in (
    Measure("linear_cka", "[0, 1]", 0.0, 1.0, True, False, ("gram", "features"), gram="biased", cheap_null=True),
    Measure("unbiased_cka", "≈ [0, 1] (may be < 0 for small n)", 0.0, 1.0, True, False, ("gram", "features"),
            gram="unbiased", cheap_null=True),
    Measure("rbf_cka", "[0, 1]", 0.0, 1.0, True, False, ("gram", "stored"), gram="rbf", cheap_null=True,
            settings=("rbf_factor",)),
    Measure("mutual_knn", "[0, 1]", 0.0, 1.0, True, False, _STORED, settings=("knn_k",)),
    Measure("jaccard_knn", "[0, 1]", 0.0, 1.0, True, False, _STORED, settings=("knn_k",)),
    Measure("procrustes", "[0, 1]", 0.0, 1.0, True, False, _COVARIANCE),
    Measure("procrustes_angle", "[0, π/2], 0 = same shape", 0.0, _HALF_PI, False, False, _COVARIANCE,
            note="procrustes_angle is an angular distance in [0, π/2]: 0 is identical up to rotation and "
                 "scale; best matches are the smallest values."),
    Measure("cca", "[0, 1]", 0.0, 1.0, True, False, _COVARIANCE, settings=_CCA),
    Measure("svcca", "[0, 1]", 0.0, 1.0, True, False, _COVARIANCE, settings=("svcca_keep", *_CCA)),
    Measure("pwcca", "[0, 1]", 0.0, 1.0, True, False, _COVARIANCE, settings=_CCA,
            note="pwcca weights the canonical correlations by the narrower layer of each pair (the layer of A "
                 "when both are equally wide, so then it is not symmetric)."),
    Measure("shape_metric", "[0, π/2], a metric (triangle inequality)", 0.0, _HALF_PI, False, False, _COVARIANCE,
            settings=("shape_alpha", *_CCA),
            note="shape_metric is netrep's angular shape distance in [0, π/2] (lower is more similar); best "
                 "matches are the smallest values."),
    Measure("rsa", "[−1, 1]", -1.0, 1.0, True, False, _STORED, settings=("rsa_distance", "rsa_compare"),
            note="rsa compares the layers' dissimilarity matrices over all samples; its value is in [-1, 1]."),
    Measure("ridge_r2", "(−∞, 1], 0 = the training mean", None, 1.0, True, True, ("folds", "folds"),
            settings=("ridge_lambda", "ridge_folds"),
            note="ridge_r2 is directional: each row (a layer of A) predicts a column (a layer of B) by "
                 "cross-validated ridge regression, so the matrix is not symmetric; swap the models for the "
                 "other direction. 1 is a perfect prediction, 0 no better than the mean, negative worse."),
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


def strategy(name: str, mode: str) -> str:
    """The streaming strategy that computes ``name`` in ``mode`` (``minibatch`` or ``exact``) when its sums
    fit the memory budget and no permutation null is asked for."""
    minibatch, exact = MEASURES[name].stream
    return minibatch if mode == "minibatch" else exact


def cheap_null(metrics: tuple[str, ...] | list[str], mode: str) -> bool:
    """True when a permutation null of every one of ``metrics`` costs next to nothing in ``mode``."""
    return mode == "minibatch" and all(MEASURES[m].cheap_null for m in metrics)


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
