"""One line of what a run found, for the terminal: ``compare`` (two models), a study (many models) and
``capture`` (what was stored).

Built from the report's own pieces (:mod:`simkit.report.compare`: the lead metric, the cells at matching
relative depth, the chance levels; :mod:`simkit.report.study`: the chance levels of a study, self-pairs
never counted), so the line and the report agree. A pair of models is named most similar only when it
beats its chance level.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from simkit.catalog import LARGE_EFFECT, MEASURES
from simkit.report.compare import chance_counts, chance_table, depth_diagonal, lead_metric
from simkit.report.pvalues import best_of, best_words, decision_words
from simkit.report.study import off_diagonal, study_chance


def _f(value: float) -> str:
    return "n/a" if value != value else f"{value:.3f}"


def _similar_first(metric: str) -> int:
    """+1 when higher values of ``metric`` mean more similar, −1 for a distance."""
    return 1 if metric not in MEASURES or MEASURES[metric].similarity else -1


def _metrics(result, table: str) -> list[str]:
    summary = result.summary
    known = list(dict.fromkeys(result.tables[table]["metric"]))
    return list(summary.get("metrics") or ([summary["metric"]] if summary.get("metric") else known))




def compare_headline(result) -> str:
    """The lead metric's mean at matching relative depth (the diagonal; with a single layer on a side,
    over every pair) beside the mean elsewhere, and how many layer pairs beat their chance level."""
    metric = lead_metric(_metrics(result, "similarity"))
    frame = result.matrix(metric)
    values = frame.to_numpy(dtype=float, na_value=np.nan)
    if not np.isfinite(values).any():
        return f"every {metric} value is undefined (NaN)"
    rows, cols = values.shape
    if min(rows, cols) > 1:
        on, off = depth_diagonal(frame)
        text = f"{metric} averages {_f(on)} at matching relative depth ({_f(off)} elsewhere)"
    else:
        text = f"{metric} averages {_f(float(np.nanmean(values)))} over {rows} × {cols} layer pairs"
    info = chance_table(result, metric)
    if info is None:
        return text + "; not checked against chance (rerun with --null 10)"
    beats, large, total = chance_counts(metric, values, info)
    decision, best = decision_words(result.summary), best_of(result.summary, metric)
    if decision is not None:  # a run with p-values: the corrected count and the best pair's max-corrected p
        tail = f"; most similar pair {best_words(best)}" if best else ""
        return (text + f"; {beats} of {total} layer pairs beat chance ({decision}), {large} of them by a large "
                f"margin{tail}")
    return (text + f"; {beats} of {total} layer pairs beat their chance level, {large} of them by a large margin "
            f"(≥ {LARGE_EFFECT:.0%} of the range)")


def study_headline(result) -> str:
    """The most similar pair of different models among those that beat their chance level (the lead
    metric), or that none does; how many pairs of different models beat chance."""
    metric = lead_metric(_metrics(result, "study"))
    full = result.matrix(metric)
    frame = off_diagonal(full)
    values = frame.to_numpy(dtype=float, na_value=np.nan)
    models = len(frame)
    if not np.isfinite(values).any():
        return f"no {metric} value between two different models is defined (NaN)"
    info = study_chance(result, metric, full)
    if info is None:
        return (f"{metric} between {models} different models averages {_f(float(np.nanmean(values)))}; not "
                "checked against chance, so no pair is named most similar")
    beats, large, total = chance_counts(metric, values, info)
    best = best_of(result.summary, metric)
    if best is not None:
        return _study_tested(metric, models, best, (beats, large, total), decision_words(result.summary))
    winners = np.where(info["beats"] & np.isfinite(values) & np.logical_not(info["skip"]),
                       values * _similar_first(metric), -np.inf)
    if beats == 0:
        return (f"no pair of different models beats its chance level ({metric}, {models} models, highest "
                f"{_f(float(np.nanmax(values)))})")
    i, j = np.unravel_index(np.argmax(winners), winners.shape)
    return (f"most similar pair: {frame.index[i]} and {frame.columns[j]} ({metric} {_f(values[i, j])}, chance "
            f"level {_f(float(info['chance'][i, j]))}); {beats} of {total} pairs of different models beat chance, "
            f"{large} by a large margin")


def _study_tested(metric: str, models: int, best: dict[str, Any], counts: tuple[int, int, int],
                  decision: str | None) -> str:
    """A study's line with p-values: the most similar pair named only when it beats the null of the best
    pair (the maximum over pairs of different models under each permutation)."""
    beats, large, total = counts
    tally = f"{beats} of {total} pairs of different models beat chance ({decision}), {large} by a large margin"
    if not best.get("beats_max_null"):
        return (f"no pair of different models beats the null of the best pair ({metric}, {models} models, highest "
                f"{best_words(best)}); {tally}")
    return f"most similar pair: {best_words(best)} ({metric}); {tally}"


def result_headline(result) -> str | None:
    """:func:`compare_headline` or :func:`study_headline` for ``result``'s kind; None for other kinds."""
    if result.kind == "compare":
        return compare_headline(result)
    if result.kind == "study":
        return study_headline(result)
    return None


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} GB"


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the cache directory ``path``."""
    return json.loads((path / "manifest.json").read_text())


def capture_headline(manifest: dict[str, Any], path: Path) -> str:
    """What a capture stored: samples × layers of which model (and weights) on which data, the layers'
    widths, the dtype, and the shards' size on disk."""
    layers = manifest.get("layers") or []
    dims = [int(layer["dim"]) for layer in layers if "dim" in layer]
    shards = manifest.get("shards") or []
    nbytes = sum((path / shard["file"]).stat().st_size for shard in shards if (path / shard["file"]).is_file())
    weights = f" ({manifest['weights']})" if manifest.get("weights") else ""
    widths = (f"width {dims[0]}" if len(set(dims)) == 1 else f"widths {min(dims)}–{max(dims)}") if dims else ""
    return (f"stored {manifest.get('n', '?')} samples × {len(layers)} layer{'s' if len(layers) != 1 else ''} of "
            f"{manifest.get('model', '?')}{weights} on {manifest.get('data', '?')} ({widths + ', ' if widths else ''}"
            f"{manifest.get('dtype', '?')}): {_size(nbytes)} in {len(shards)} shard{'s' if len(shards) != 1 else ''}"
            f" in {path}")
