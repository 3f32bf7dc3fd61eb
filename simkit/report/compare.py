"""Report context of a ``compare`` result: summary, one heatmap per metric, best matches, null band, values.

Reads only the result's tables (``similarity``, ``layers``), ``summary`` and ``matrix(metric)``;
computes nothing new beyond picking maxima and counting for display.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from simkit.catalog import LARGE_EFFECT, MEASURES, TESTED_NULL, beats_chance_rule, colour_bounds, range_width
from simkit.report.figures import ChanceMarks, heatmap_svg, html_table, line_plot
from simkit.report.pvalues import best_sentence, floor_cautions, p_values_words, test_rows, test_rule


def _is_distance(metric: str) -> bool:
    """True for a distance (lower is more similar: best match = minimum; the null's p95 is no threshold)."""
    return metric in MEASURES and not MEASURES[metric].similarity


_SUMMARY_LABELS = {
    "model_a": "model A", "weights_a": "weights of A", "model_b": "model B", "weights_b": "weights of B",
    "data": "data", "n": "samples (n)", "mode": "mode",
    "metrics": "metrics", "n_layers_a": "layers of A", "n_layers_b": "layers of B",
    "batch_size": "batch size", "seconds": "seconds", "warnings": "warnings", "p_values": "p-values",
}


def summary_rows(summary: dict[str, Any], labels: dict[str, str]) -> list[tuple[str, str]]:
    """(label, text) pairs: the keys of ``labels`` first, in that order, then any other summary keys."""
    rows = []
    for key, label in labels.items():
        if key in summary:
            rows.append((label, _text(summary[key])))
    rows.extend((key, _text(value)) for key, value in summary.items() if key not in labels)
    return rows


def _text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, float):
        return "n/a" if value != value else f"{value:.4g}"
    return str(value)


def colour_range(metric: str, values: np.ndarray) -> tuple[float | None, float | None]:
    """The catalogue's range for bounded metrics (stretched to include any value outside it); the data
    range otherwise."""
    lo, hi = colour_bounds(metric)
    if lo is None or hi is None:
        return None, None
    finite = values[np.isfinite(values)]
    if not finite.size:
        return lo, hi
    return min(lo, float(finite.min())), max(hi, float(finite.max()))


def null_matrix(result, metric: str, column: str) -> pd.DataFrame | None:
    """(L_a, L_b) frame of ``column`` (null_mean or null_p95) for ``metric``; None when no null was run."""
    table = result.tables["similarity"]
    if column not in table.columns or table.loc[table["metric"] == metric, column].isna().all():
        return None
    return result.matrix(metric, column)


def best_matches(matrices: dict[str, pd.DataFrame], nulls: dict[str, pd.DataFrame | None]) -> list[dict]:
    """For each layer of A: per metric the layer of B with the highest value (NaNs ignored; the lowest for
    the angular distances, whose null p95 is not a threshold and is not shown as one).

    Returns rows ``{"layer_a": str, "cells": [{"layer_b", "value", "null_p95", "above_null"}, ...]}``
    with one cell per metric, in the order of ``matrices``.
    """
    first = next(iter(matrices.values()))
    rows = []
    for i, layer_a in enumerate(first.index):
        cells = []
        for metric, frame in matrices.items():
            row = frame.iloc[i].to_numpy(dtype=float, na_value=np.nan)
            if not np.isfinite(row).any():
                cells.append({"layer_b": "n/a", "value": float("nan"), "null_p95": None, "above_null": None})
                continue
            distance = _is_distance(metric)
            j = int(np.nanargmin(row) if distance else np.nanargmax(row))
            null = None if distance else nulls.get(metric)
            p95 = float(null.iloc[i, j]) if null is not None else None
            above = None if p95 is None or p95 != p95 else bool(row[j] > p95)
            cells.append({"layer_b": str(frame.columns[j]), "value": float(row[j]), "null_p95": p95,
                          "above_null": above})
        rows.append({"layer_a": str(layer_a), "cells": cells})
    return rows


def null_band(table: pd.DataFrame, metrics: list[str]) -> list[dict]:
    """Per metric: mean null mean, mean and max null p95, and how many pairs exceed their own p95."""
    if "null_p95" not in table.columns or table["null_p95"].isna().all():
        return []
    out = []
    for metric in metrics:
        rows = table[table["metric"] == metric]
        finite = rows[np.isfinite(rows["value"]) & np.isfinite(rows["null_p95"])]
        out.append({
            "metric": metric,
            "null_mean": float(rows["null_mean"].mean()) if "null_mean" in rows else float("nan"),
            "null_p95_mean": float(rows["null_p95"].mean()),
            "null_p95_max": float(rows["null_p95"].max()),
            # a distance is similar when small: its count above the p95 would mislead, so none is given
            "above": None if _is_distance(metric) else int((finite["value"] > finite["null_p95"]).sum()),
            "pairs": len(rows),
        })
    return out


def best_match_plot(rows: list[dict], metrics: list[str], null_means: dict[str, pd.DataFrame | None],
                    nulls: dict[str, pd.DataFrame | None]):
    """Line plot of each metric's best value per layer of A, with the null mean–p95 band of that pair."""
    layers = [r["layer_a"] for r in rows]
    series, bands = {}, {}
    for k, metric in enumerate(metrics):
        series[metric] = [r["cells"][k]["value"] for r in rows]
        mean, p95 = null_means.get(metric), nulls.get(metric)
        if mean is None or p95 is None:
            continue
        lo, hi = [], []
        for r in rows:
            b = r["cells"][k]["layer_b"]
            found = b in p95.columns
            lo.append(float(mean.loc[r["layer_a"], b]) if found else np.nan)
            hi.append(float(p95.loc[r["layer_a"], b]) if found else np.nan)
        bands[metric] = (lo, hi)
    return line_plot(layers, series, title="Best match in B for each layer of A",
                     xlabel="layer of A", ylabel="similarity", bands=bands or None)


# ------------------------------------------------------------------------------------ findings, cautions
# What the report says first (base.html.j2 shows them before anything else): sentences from the summary
# and the similarity table only (maxima, means and counts for display, never a new metric).

_BIASED = {"linear_cka": "linear_cka", "rbf_cka": "rbf_cka"}  # per-batch biased HSIC in minibatch mode


def lead_metric(metrics: list[str]) -> str:
    """The metric the findings lead with: unbiased_cka when present (Nguyen et al.'s minibatch
    estimator; nearly free of the small-sample bias), else the first."""
    return "unbiased_cka" if "unbiased_cka" in metrics else metrics[0]


def _f(value: float) -> str:
    return "n/a" if value != value else f"{value:.3f}"


def _named(summary: dict[str, Any], side: str) -> str:
    """"spec (its weights)" for the findings: a reader must know whether the models are trained."""
    name, weights = summary.get(f"model_{side}", side.upper()), summary.get(f"weights_{side}")
    return f"{name} ({weights})" if weights else str(name)


def _peak_chance(info: dict[str, Any] | None, i: int, j: int) -> str:
    """", beats chance" or ", not beyond chance (chance level c)" for the named peak pair; "" unknown."""
    if info is None or not np.isfinite(info["chance"][i, j]):
        return ""
    if info["beats"][i, j]:
        return ", beats chance"
    return f", not beyond chance: its chance level is {_f(float(info['chance'][i, j]))}"


def chance_table(result, metric: str) -> dict[str, Any] | None:
    """The chance level, beats-chance flags (L_a, L_b) and the rule of ``metric`` from the similarity
    table; None for a result without chance levels."""
    table = result.tables["similarity"]
    if "chance" not in table.columns or table.loc[table["metric"] == metric, "chance"].isna().all():
        return None
    return chance_info(metric, result.matrix(metric, "chance").to_numpy(dtype=float, na_value=np.nan),
                       result.matrix(metric, "beats_chance").to_numpy(dtype=float, na_value=0.0),
                       result.meta.get("settings", {}).get("null"), rule=test_rule(result.summary, metric))


def chance_info(metric: str, chance: np.ndarray, beats: np.ndarray, null: Any,
                skip_diagonal: bool = False, rule: str | None = None) -> dict[str, Any]:
    """What the findings and heatmaps need of ``metric``'s chance levels (R, C): the levels, the flags as
    booleans, the cells not counted (each model with itself, ``skip_diagonal``), the rule in words and,
    for a tested null, how many cells pass by chance alone. ``null``: ``meta.settings["null"]`` (the
    permutations per metric; a number in older results). ``rule``: the corrected test that decided the
    flags of a run with p-values (``simkit.report.pvalues.test_rule``), which bounds the false positives."""
    draws = int(null.get(metric, 0) if isinstance(null, dict) else null or 0)
    skip = np.eye(*chance.shape) > 0 if skip_diagonal else np.zeros(chance.shape, dtype=bool)
    info: dict[str, Any] = {"chance": chance, "beats": np.nan_to_num(beats) > 0, "skip": skip,
                            "rule": rule or beats_chance_rule(metric, draws)}
    if draws >= TESTED_NULL and rule is None:
        info["false_positives"] = float((np.isfinite(chance) & np.logical_not(skip)).sum()) / (draws + 1)
    return info


def depth_diagonal(frame: pd.DataFrame) -> tuple[float, float]:
    """Mean of the cells at matching relative depth (row i ↔ column round(i·(C−1)/(R−1))) and of all others."""
    values = frame.to_numpy(dtype=float, na_value=np.nan)
    r, c = values.shape
    on = np.zeros_like(values, dtype=bool)
    for i in range(r):
        on[i, round(i * (c - 1) / (r - 1)) if r > 1 else 0] = True
    inside, outside = values[on], values[~on]
    mean = lambda v: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")  # noqa: E731
    return mean(inside), mean(outside)


def findings(summary: dict[str, Any], matrices: dict[str, pd.DataFrame], band: list[dict],
             reductions: str, chance_tables: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """The lead metric's level and where it peaks (and whether that pair beats chance), the depth
    diagonal, then one sentence per measure against its chance level (or the null band of an older
    result without chance levels)."""
    if not matrices:
        return []
    metric = lead_metric(list(matrices))
    frame = matrices[metric]
    values = frame.to_numpy(dtype=float, na_value=np.nan)
    if not np.isfinite(values).any():
        return [f"Every {metric} value is undefined (NaN): the chosen layers are constant on this data."]
    i, j = np.unravel_index(np.nanargmax(values) if not _is_distance(metric) else np.nanargmin(values),
                            values.shape)
    word = "lowest" if _is_distance(metric) else "highest"
    out = [f"{metric} between {_named(summary, 'a')} and {_named(summary, 'b')} on "
           f"{summary.get('data', 'the data')} (n = {summary.get('n', '?')}, {summary.get('mode', '?')} mode"
           f"{', ' + reductions if reductions else ''}) averages {_f(float(np.nanmean(values)))} over "
           f"{values.shape[0]} × {values.shape[1]} layer pairs, from {_f(float(np.nanmin(values)))} to "
           f"{_f(float(np.nanmax(values)))}; {word}: {frame.index[i]} × {frame.columns[j]} ({_f(values[i, j])}"
           f"{_peak_chance((chance_tables or {}).get(metric), int(i), int(j))})."]
    if min(values.shape) > 1:
        on, off = depth_diagonal(frame)
        out.append(f"At matching relative depth (the diagonal) the mean is {_f(on)}, elsewhere {_f(off)}.")
    chance = chance_sentences(matrices, chance_tables or {})
    if chance:
        return out + chance
    row = next((r for r in band if r["metric"] == metric), None)
    if row is not None and row["above"] is not None:
        k = summary.get("null") or ""
        gap = float(np.nanmean(values)) - row["null_mean"]
        shuffles = f"{k} shuffles of B's samples" if k else "B's samples shuffled"
        out.append(f"Against a permutation null ({shuffles}) {row['above']} of {row['pairs']} pairs exceed "
                   "their null's 95th percentile; the "
                   f"mean value lies {abs(gap):.3f} {'above' if gap >= 0 else 'below'} the null mean "
                   f"({_f(row['null_mean'])}).")
    return out


def counted_cells(values: np.ndarray, info: dict[str, Any]) -> np.ndarray:
    """The cells counted against chance: a value and a chance level, self-pairs of a study left out."""
    return np.isfinite(values) & np.isfinite(info["chance"]) & np.logical_not(info["skip"])


def chance_counts(metric: str, values: np.ndarray, info: dict[str, Any]) -> tuple[int, int, int]:
    """(cells that beat chance, those that beat it by a large margin — at least LARGE_EFFECT of the
    measure's range beyond it —, cells counted) of ``values`` against ``info`` (:func:`chance_info`)."""
    keep = counted_cells(values, info)
    beats = info["beats"][keep].astype(bool)
    gap = (values - info["chance"])[keep] * (1 if MEASURES[metric].similarity else -1)
    return int(beats.sum()), int(np.sum(beats & (gap >= LARGE_EFFECT * range_width(metric)))), int(keep.sum())


def chance_sentences(matrices: dict[str, pd.DataFrame], tables: dict[str, dict[str, Any]]) -> list[str]:
    """One sentence per measure against its chance level: how many pairs beat chance (the rule stated),
    how many of those by a large margin, and the mean value beside the mean chance level. Self-pairs of a
    study are not counted (``tables[metric]["skip"]``)."""
    out = []
    for metric, frame in matrices.items():
        info = tables.get(metric)
        if info is None:
            continue
        values = frame.to_numpy(dtype=float, na_value=np.nan)
        count, large, total = chance_counts(metric, values, info)
        if not total:
            continue
        keep = counted_cells(values, info)
        mean_v, mean_c = float(np.mean(values[keep])), float(np.mean(info["chance"][keep]))
        text = (f"{metric}: {count} of {total} pairs beat chance ({info['rule']}), {large} of them by a large "
                f"margin (at least {LARGE_EFFECT:.0%} of the range beyond chance); mean {_f(mean_v)} against a "
                f"chance level of {_f(mean_c)}.")
        expected = info.get("false_positives")
        if count == 0:
            text += " No evidence of similarity beyond what unrelated samples give."
        elif expected is not None and count <= expected:
            text += f" That is no more than the about {expected:.1f} pairs chance alone lets through."
        out.append(text)
    return out


def samples_words(samples: Any) -> str | None:
    """How activations' samples were aligned, in words (``summary["samples"]``: matched by ID, with each
    side's rows and the rows dropped; or by position); None for a result without it."""
    if not isinstance(samples, dict):
        return None
    sides = [key[5:] for key in samples if key.startswith("rows_")]
    named = [side.upper() if len(side) == 1 else side for side in sides]
    if samples.get("aligned_by") == "position":
        return f"Samples aligned by position: {samples.get('matched', '?')} rows on every side (no sample IDs)."
    rows = ", ".join(f"{name} {samples[f'rows_{side}']}" for name, side in zip(named, sides, strict=True))
    dropped = ", ".join(f"{name} {samples.get(f'dropped_{side}', '?')}" for name, side in zip(named, sides, strict=True))
    return (f"Samples matched by ID: {samples.get('matched', '?')} present on every side (rows: {rows}; dropped: "
            f"{dropped}).")


def source_sentences(summary: dict[str, Any]) -> list[str]:
    """What the findings say of the inputs beyond models and data: how activations were aligned, the dtype
    models ran in (``--dtype``) and what a sample is (``--samples``: ``summary["sample_unit"]``)."""
    out = [words] if (words := samples_words(summary.get("samples"))) else []
    if summary.get("dtype"):
        out.append(f"The models ran in {summary['dtype']} (--dtype); their activations were summed in float64.")
    unit = summary.get("sample_unit")
    if isinstance(unit, dict) and unit.get("text"):
        out.append(f"Samples are {unit['text']} (--samples); chance levels and intervals permute and resample "
                   "whole sequences or images, never single tokens.")
    return out


def with_sources(sentences: list[str], summary: dict[str, Any]) -> list[str]:
    """``sentences`` with :func:`source_sentences` after the first."""
    return sentences[:1] + source_sentences(summary) + sentences[1:]


def cautions(summary: dict[str, Any], meta: dict[str, Any], matrices: dict[str, pd.DataFrame],
             band: list[dict], table: pd.DataFrame, chances: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """What to distrust: biased CKA at a small batch, values that are mostly bias or within the null band,
    no null at all, undefined values, flattened token sequences."""
    out: list[str] = []
    within: list[str] = []
    mode = summary.get("mode")
    batch = summary.get("batch_size") or meta.get("settings", {}).get("batch_size", "?")
    by_metric = {r["metric"]: r for r in band}
    for metric, frame in matrices.items():
        cells = frame.to_numpy(dtype=float, na_value=np.nan)
        mean = float(np.nanmean(cells)) if np.isfinite(cells).any() else float("nan")
        row = by_metric.get(metric)
        if mode == "minibatch" and metric in _BIASED:
            text = (f"{metric} in minibatch mode averages biased HSIC over batches of {batch} samples: its bias "
                    "is set by the batch size, not by n, and does not shrink with more data; unbiased_cka "
                    "(unbiased HSIC per batch, Nguyen et al.) does not have it.")
            if row is not None and mean == mean:
                text += (f" Here its null mean is {_f(row['null_mean'])} against a mean value of {_f(mean)}"
                         + (", so these values are mostly estimator bias." if row["null_mean"] > 0.5 * mean
                            else "."))
            out.append(text)
        elif row is not None and row["above"] is not None and mean == mean and mean > 0 \
                and row["null_mean"] > 0.5 * mean:
            out.append(f"{metric}: the null mean ({_f(row['null_mean'])}) is more than half the mean value "
                       f"({_f(mean)}): most of each value is what unrelated samples would give.")
        if chances and metric in chances:
            continue  # the findings give each measure's count against its chance level
        if row is not None and row["above"] is not None and row["above"] < row["pairs"]:
            within.append(f"{row['pairs'] - row['above']} of {row['pairs']} {metric} pairs are not above their "
                          "null's 95th percentile (dotted in the heatmap): no evidence of similarity there.")
    out += within  # after every bias note: the bias is the larger error
    if not band and not chances:
        out.append("No permutation null was run, so nothing here is checked against chance: rerun with "
                   "--null 10 (the library's null=10).")
    missing = int(table["value"].isna().sum())
    warned = [str(w) for w in summary.get("warnings") or []]
    if missing:
        cause = ("the warnings below say why" if warned else
                 "a constant layer, or a measure that needs more samples than the layer has dimensions")
        out.append(f"{missing} of {len(table)} values are undefined (NaN; hatched): {cause}.")
    out += [f"warning: {w}" for w in warned]
    out += floor_cautions(summary)
    reduce = meta.get("settings", {}).get("reduce")
    if str(summary.get("data", "")).startswith("text:") and reduce == "flatten":
        out.append("Token sequences were flattened (--reduce flatten): padding positions and sentence length "
                   "can dominate the similarity; the default (auto) takes the mask-aware mean over tokens.")
    if isinstance(summary.get("n"), int) and summary["n"] < 100:
        out.append(f"Only n = {summary['n']} samples: every estimate here is noisy.")
    return out


def chance_marks(result, metric: str, info: dict[str, Any] | None) -> ChanceMarks | None:
    """The heatmap's chance marks of ``metric`` (and its interval on hover, when one was computed)."""
    if info is None:
        return None
    table = result.tables["similarity"]
    ci = "ci_low" in table.columns and not table.loc[table["metric"] == metric, "ci_low"].isna().all()
    low = result.matrix(metric, "ci_low").to_numpy(dtype=float, na_value=np.nan) if ci else None
    high = result.matrix(metric, "ci_high").to_numpy(dtype=float, na_value=np.nan) if ci else None
    return ChanceMarks(info["chance"], info["beats"], info["rule"], low, high)


def reductions_text(layers: pd.DataFrame | None) -> str:
    """'reduction: mean' (or 'reductions: flatten, mean') from the layers table; '' when unknown."""
    if layers is None or "reduction" not in layers.columns:
        return ""
    kinds = [str(v) for v in pd.unique(layers["reduction"].dropna()) if str(v)]
    return f"reduction{'s' if len(kinds) > 1 else ''}: {', '.join(kinds)}" if kinds else ""


def context(result) -> dict[str, Any]:
    """Everything ``compare.html.j2`` shows, prepared from ``result`` (a CompareResult)."""
    summary = result.summary
    table = result.tables["similarity"]
    metrics = list(summary.get("metrics") or pd.unique(table["metric"]))
    model_a, model_b = summary.get("model_a", "A"), summary.get("model_b", "B")
    matrices, nulls, null_means, heatmaps, chances = {}, {}, {}, [], {}
    for metric in metrics:
        frame = result.matrix(metric)
        matrices[metric] = frame
        null = nulls[metric] = null_matrix(result, metric, "null_p95")
        null_means[metric] = null_matrix(result, metric, "null_mean")
        info = chance_table(result, metric)
        if info is not None:
            chances[metric] = info
        if _is_distance(metric):  # a distance is significant below its null, not above p95
            null = None
        vmin, vmax = colour_range(metric, frame.to_numpy(dtype=float, na_value=np.nan))
        heatmaps.append({
            "metric": metric,
            "svg": heatmap_svg(frame, title=metric, vmin=vmin, vmax=vmax, null=null,
                               chance=chance_marks(result, metric, info),
                               xlabel=f"B: {model_b}", ylabel=f"A: {model_a}"),
        })
    best = best_matches(matrices, nulls) if matrices else []
    has_null = any(v is not None for v in nulls.values())
    layers = result.tables.get("layers")
    value_columns = [c for c in ("value", "chance", "calibrated", "null_mean", "null_p95", "p_value", "p_corrected",
                                 "ci_low", "ci_high") if c in table.columns]
    shown_columns = value_columns + (["beats_chance"] if "beats_chance" in table.columns else [])
    band = null_band(table, metrics)
    shown = {**summary, "null": result.meta.get("settings", {}).get("null")}
    found = findings(shown, matrices, band, reductions_text(layers), chances)
    tested = best_sentence(summary, lead_metric(metrics)) if metrics else None
    return {
        "findings": with_sources(found[:1] + ([tested] if tested else []) + found[1:], summary),
        "cautions": cautions(summary, result.meta, matrices, band, table, chances),
        "summary_rows": summary_rows({**summary, **({"samples": samples_words(summary["samples"])}
                                                    if "samples" in summary else {}),
                                      **({"sample_unit": summary["sample_unit"].get("text")}
                                         if isinstance(summary.get("sample_unit"), dict) else {}),
                                      **({"p_values": p_values_words(summary)} if "p_values" in summary else {})},
                                     _SUMMARY_LABELS),
        "tests": test_rows(summary),
        "model_a": model_a,
        "model_b": model_b,
        "weights_a": summary.get("weights_a"),
        "weights_b": summary.get("weights_b"),
        "metrics": metrics,
        "notes": [MEASURES[m].note for m in metrics if m in MEASURES and MEASURES[m].note],
        "heatmaps": heatmaps,
        "best": best,
        "best_plot": best_match_plot(best, metrics, null_means, nulls) if best else None,
        "has_null": has_null,
        "null_band": band,
        "layers": html_table(layers, numeric=["dim"], css_class="layers") if layers is not None else None,
        "values": html_table(table[["layer_a", "layer_b", "metric", *shown_columns]], numeric=value_columns,
                             css_class="values"),
        "n_values": len(table),
    }
