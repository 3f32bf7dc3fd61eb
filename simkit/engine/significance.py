"""The tests of a comparison with ``p_values``: the columns of each measure's grid and the record in the summary.

Each measure's cells are one family (a study's: the pairs of different models): the p-values the
accumulator gave (:mod:`simkit.metrics.streaming.pvalues`) are corrected across it
(:func:`simkit.metrics.inference.correct`, ``settings.correction``), ``beats_chance`` becomes the corrected
decision at :data:`~simkit.settings.pvalues.ALPHA`, ``calibrated`` is ``(v − τ)/(best − τ)`` clipped at 0
beside ``chance`` (τ the critical threshold at α from the permutation draws,
:func:`simkit.metrics.inference.critical_value`), and the best cell gets its max-corrected p-value from the permutation draws
(:func:`simkit.metrics.inference.best_pair`). ``summary["p_values"]`` records the rule, each measure's
method, permutations, smallest reachable p-value, significant count and best pair.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from simkit.catalog import MEASURES
from simkit.metrics.inference import best_pair, calibrated, correct, critical_value
from simkit.settings.pvalues import ALPHA


def family(shape: tuple[int, ...], skip_diagonal: bool) -> np.ndarray:
    """The cells tested together: every cell, or (a study) every pair of different models."""
    keep = np.ones(shape, dtype=bool)
    if skip_diagonal:
        np.fill_diagonal(keep, False)
    return keep


def best_value(metric: str) -> float | None:
    """The measure's most similar value: its upper bound, its lower bound for a distance (None: unbounded)."""
    measure = MEASURES[metric]
    return measure.hi if measure.similarity else measure.lo


def p_value_columns(metric: str, arrays: Mapping[str, np.ndarray], correction: str,
                    skip_diagonal: bool = False) -> dict[str, np.ndarray]:
    """``calibrated``, ``beats_chance`` (the corrected p-value at most ALPHA), ``p_value`` and ``p_corrected``
    of one measure's cells (NaN outside the family)."""
    value = np.asarray(arrays["value"], dtype=np.float64)
    keep = family(value.shape, skip_diagonal)
    p = np.where(keep, np.asarray(arrays["p_value"], dtype=np.float64), np.nan)
    corrected = correct(p, correction, keep)
    with np.errstate(invalid="ignore"):
        beats = np.isfinite(corrected) & (corrected <= ALPHA)
    similar = MEASURES[metric].similarity
    tau = critical_value(value, arrays["null"], similar) if "null" in arrays else None
    score = calibrated(value, tau, best_value(metric), similar) if tau is not None else np.full(value.shape, np.nan)
    return {"calibrated": score, "beats_chance": beats, "p_value": p, "p_corrected": corrected}


def ordered(columns: dict[str, np.ndarray], tests: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``columns`` (null_mean, null_p95, chance, beats_chance, ...) with the test columns in place:
    ``calibrated`` beside ``chance``, then the corrected ``beats_chance``, ``p_value``, ``p_corrected``."""
    out: dict[str, np.ndarray] = {}
    for name, array in columns.items():
        if name == "beats_chance":
            continue
        out[name] = array
        if name == "chance":
            out.update(tests)
    if "chance" not in columns:
        out.update(tests)
    return out


def _method(described: Mapping[str, Any]) -> str:
    """``pearson3`` (a fit of the permutation moments) or ``permutations`` (counted draws), from ``describe()``."""
    return "pearson3" if str(described.get("p_value", "")).startswith("Pearson") else "permutations"


def _best(metric: str, arrays: Mapping[str, np.ndarray], labels: tuple[Sequence[str], Sequence[str]],
          keys: tuple[str, str], skip_diagonal: bool) -> dict[str, Any] | None:
    """The best cell of ``metric`` among the family, named, with its max-corrected p-value."""
    value = np.asarray(arrays["value"], dtype=np.float64)
    found = best_pair(value, arrays.get("null"), MEASURES[metric].similarity, family(value.shape, skip_diagonal))
    if found is None:
        return None
    p_max = found["p_max"]
    return {keys[0]: str(labels[0][found["row"]]), keys[1]: str(labels[1][found["col"]]), "value": found["value"],
            "p_max": p_max, "permutations": found["permutations"],
            "beats_max_null": p_max is not None and p_max <= ALPHA}


def p_value_summary(values: Mapping[str, Mapping[str, np.ndarray]], method: Mapping[str, Mapping[str, Any]],
                    frame: Any, labels: tuple[Sequence[str], Sequence[str]], correction: str, groups: int | None,
                    *, keys: tuple[str, str] = ("layer_a", "layer_b"), skip_diagonal: bool = False) -> dict[str, Any]:
    """``summary["p_values"]``: the level, the correction, the number of groups permutations kept (None:
    free permutations) and per measure its method, permutations, smallest reachable p-value, tested cells,
    significant cells (the corrected decision) and best pair (``p_max``: its max-corrected p-value)."""
    per_metric = {}
    for metric, arrays in values.items():
        rows = frame[frame["metric"] == metric]
        described = method.get(metric, {})
        per_metric[metric] = {
            "method": _method(described), "permutations": int(described.get("null") or 0),
            "smallest_p": described.get("smallest_p"), "cells": int(rows["p_corrected"].notna().sum()),
            "significant": int(rows["beats_chance"].astype(bool).sum()),
            "best": _best(metric, arrays, labels, keys, skip_diagonal)}
    return {"alpha": ALPHA, "correction": correction, "groups": groups, "metrics": per_metric}
