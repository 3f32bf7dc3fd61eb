"""Report context of a ``study`` result (many models): one model × model heatmap per metric, then a
map (classical MDS) and a dendrogram of the models for the lead metric.

Reads only the ``study`` table (model_a, model_b, layer_a, layer_b, metric, value[, null_mean,
null_p95, chance, beats_chance]), the optional ``models``, ``embedding`` and ``linkage`` tables,
``summary`` (``models``, ``metric``, ``metrics``, ``pairing``, ``weights``) and ``matrix(metric)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from simkit.catalog import MEASURES
from simkit.report.compare import (
    cautions,
    chance_info,
    chance_sentences,
    colour_range,
    lead_metric,
    null_band,
    samples_words,
    summary_rows,
    with_sources,
)
from simkit.report.figures import ChanceMarks, heatmap_svg, html_table
from simkit.report.pvalues import best_of, best_sentence, p_values_words, test_rule
from simkit.report.study_figures import dendrogram_svg, embedding_svg

_SUMMARY_LABELS = {"models": "models", "weights": "weights", "metric": "metric", "metrics": "metrics",
                   "pairing": "layer pairing",
                   "data": "data", "n": "samples (n)", "mode": "mode", "seconds": "seconds"}


def null_p95(table: pd.DataFrame, metric: str, like: pd.DataFrame) -> pd.DataFrame | None:
    """(M, M) null 95th percentiles of ``metric`` ordered like ``like``; None when no null was run."""
    if "null_p95" not in table.columns:
        return None
    rows = table[table["metric"] == metric]
    if rows["null_p95"].isna().all():
        return None
    return rows.pivot(index="model_a", columns="model_b", values="null_p95").reindex(
        index=like.index, columns=like.columns)


def off_diagonal(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (M, M) with each model's similarity to itself blanked (NaN)."""
    values = frame.to_numpy(dtype=float, na_value=np.nan).copy()
    np.fill_diagonal(values, np.nan)
    return pd.DataFrame(values, index=frame.index, columns=frame.columns)


def study_matrix(table: pd.DataFrame, metric: str, column: str, like: pd.DataFrame) -> np.ndarray | None:
    """(M, M) ``column`` of ``metric`` ordered like ``like``; None when the table lacks it."""
    if column not in table.columns:
        return None
    rows = table[table["metric"] == metric]
    if rows[column].isna().all():
        return None
    wide = rows.pivot(index="model_a", columns="model_b", values=column).reindex(index=like.index,
                                                                                 columns=like.columns)
    return wide.to_numpy(dtype=float, na_value=np.nan)


def study_chance(result, metric: str, like: pd.DataFrame) -> dict[str, Any] | None:
    """``chance_info`` of ``metric``'s (M, M) cells, each model with itself never counted; None for a
    study without chance levels."""
    table = result.tables["study"]
    chance = study_matrix(table, metric, "chance", like)
    beats = study_matrix(table, metric, "beats_chance", like)
    if chance is None or beats is None:
        return None
    return chance_info(metric, chance, beats, result.meta.get("settings", {}).get("null"), skip_diagonal=True,
                       rule=test_rule(result.summary, metric))


def findings(summary: dict[str, Any], matrices: dict[str, pd.DataFrame], band: list[dict],
             chances: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """The most and least similar pair of different models (the most similar named only when it beats
    chance), the mean between different models, then one sentence per measure against its chance level
    (self-pairs never counted)."""
    if not matrices:
        return []
    metric = lead_metric(list(matrices))
    frame = off_diagonal(matrices[metric])
    values = frame.to_numpy(dtype=float)
    if not np.isfinite(values).any():
        return [f"No {metric} value between two different models is defined (NaN)."]
    high, low = np.unravel_index(np.nanargmax(values), values.shape), np.unravel_index(np.nanargmin(values), values.shape)
    name = lambda ij: f"{frame.index[ij[0]]} and {frame.columns[ij[1]]} ({values[ij]:.3f})"  # noqa: E731
    info = (chances or {}).get(metric)
    weights = weights_words(summary)
    lead = (f"{metric} between {len(frame)} models ({'weights: ' + weights + '; ' if weights else ''}"
            f"{pairing_words(str(summary.get('pairing', '?')))}, {summary.get('data', '?')}, "
            f"n = {summary.get('n', '?')}, {summary.get('mode', '?')} mode): ")
    best = best_of(summary, metric)
    if best is not None and not best.get("beats_max_null"):  # p-values: named only when it beats the max null
        lead += ("no pair of different models beats the null of the best pair, so none is named most similar "
                 f"(the highest value, {values[high]:.3f}, has max-corrected p = {best.get('p_max')}).")
    elif info is not None and not info["beats"][high]:
        lead += (f"no pair of different models beats chance, so none is named most similar (the highest value, "
                 f"{values[high]:.3f}, is within chance).")
    else:
        lead += f"the most similar pair is {name(high)}, the least similar {name(low)}."
    out = [lead, f"Between different models the mean is {float(np.nanmean(values)):.3f}."]
    tested = best_sentence(summary, metric, "pair of models") if best is not None and best.get("beats_max_null") else None
    out += [tested] if tested else []
    if chances:
        return out + chance_sentences({m: off_diagonal(f) for m, f in matrices.items()}, chances)
    row = next((r for r in band if r["metric"] == metric), None)
    if row is not None and row["above"] is not None:
        out.append(f"{row['above']} of {row['pairs']} model pairs (each model with itself included) exceed "
                   "their permutation null's 95th percentile.")
    return out


def pairing_words(pairing: str) -> str:
    """The layer pairing in words: "last layers", "layers at relative depth 0.5", "layers layer4.1=layer4.2"."""
    if pairing in ("last", "first"):
        return f"{pairing} layers"
    if pairing == "depth" or pairing.startswith("depth:"):
        return f"layers at relative depth {pairing.partition(':')[2] or '0.5'}"
    return f"layers {pairing}"


def weights_words(summary: dict[str, Any]) -> str | None:
    """Each model's weights in words ("all random init, seed 0", or one per model); None when unknown."""
    weights, models = summary.get("weights"), summary.get("models", [])
    if not isinstance(weights, list) or not weights:
        return None
    if len(set(weights)) == 1:
        return f"all {weights[0]}"
    return "; ".join(f"{model} {w}" for model, w in zip(models, weights, strict=False))


def dissimilarity_words(metric: str) -> str:
    """What the views are drawn from: 1 − the similarity, or the distance itself."""
    measure = MEASURES.get(metric)
    words = metric if measure is not None and not measure.similarity else f"1 − {metric}"
    return words + (" (the mean of both directions)" if measure is not None and measure.directional else "")


def chance_distance(result, metric: str, like: pd.DataFrame) -> float | None:
    """The mean chance level of ``metric`` between different models, as a dissimilarity (None: unknown)."""
    chance = study_matrix(result.tables["study"], metric, "chance", like)
    if chance is None:
        return None
    values = off_diagonal(pd.DataFrame(chance)).to_numpy(dtype=float)
    if not np.isfinite(values).any():
        return None
    level = float(np.nanmean(values))
    measure = MEASURES.get(metric)
    return level if measure is not None and not measure.similarity else 1.0 - level


def noise_words(info: dict[str, Any] | None) -> str:
    """How many pairs of different models beat chance, and when none does, that the views show noise."""
    if info is None:
        return "Without chance levels in this study, nothing here says which pairs differ from unrelated models."
    counted = ~info["skip"] & np.isfinite(info["chance"])
    beats = int((info["beats"] & counted).sum())
    if beats == 0:
        return ("No pair of different models beats chance, so neither the map nor the tree is a finding: their "
                "layout is noise.")
    return f"{beats} of {int(counted.sum())} pairs of different models beat chance (marked in the heatmap above)."


def views(result, metric: str, info: dict[str, Any] | None, like: pd.DataFrame) -> dict[str, Any] | None:
    """The map and the dendrogram of ``metric`` with their captions; None for a result without the
    ``embedding`` and ``linkage`` tables (written before they existed), a note when ``metric`` has none."""
    embedding, linkage = result.tables.get("embedding"), result.tables.get("linkage")
    if embedding is None or linkage is None:
        return None
    points, merges = embedding[embedding["metric"] == metric], linkage[linkage["metric"] == metric]
    if points.empty or merges.empty:
        return {"note": f"No map or dendrogram of {metric}: a value between two different models is undefined."}
    words, share = dissimilarity_words(metric), float(points["share"].iloc[0])
    chance = chance_distance(result, metric, like)
    cophenetic = float(merges["cophenetic"].iloc[0])
    map_caption = (f"Classical (Torgerson) MDS of {words}: the nearer two models, the more similar. The two "
                   f"axes hold {share:.0%} of the eigenvalue mass, so distances on the map are approximate.")
    tree_caption = (f"Average linkage (UPGMA) on {words}; cophenetic correlation "
                    f"{'n/a' if cophenetic != cophenetic else f'{cophenetic:.2f}'} (how well merge heights keep "
                    "the table's values).")
    if chance is not None:
        tree_caption += (" Groups joined right of the dashed line (the mean chance level) are on average no "
                         "more similar than chance.")
    labels = [str(m) for m in like.index]
    return {"note": None, "metric": metric, "noise": noise_words(info), "map_caption": map_caption, "tree_caption": tree_caption,
            "map": embedding_svg(points, metric, "study-map"),
            "tree": dendrogram_svg(merges, labels, metric, words, "study-tree", chance)}


def context(result) -> dict[str, Any]:
    """Everything ``study.html.j2`` shows, prepared from ``result`` (a StudyResult)."""
    table = result.tables["study"]
    summary = result.summary
    metrics = list(summary.get("metrics") or ([summary["metric"]] if summary.get("metric")
                                              else pd.unique(table["metric"])))
    heatmaps, matrices, chances = [], {}, {}
    for metric in metrics:
        frame = matrices[metric] = result.matrix(metric)
        info = study_chance(result, metric, frame)
        if info is not None:
            chances[metric] = info
        marks = None if info is None else ChanceMarks(info["chance"], info["beats"] | info["skip"], info["rule"])
        vmin, vmax = colour_range(metric, frame.to_numpy(dtype=float, na_value=np.nan))
        heatmaps.append({"metric": metric, "svg": heatmap_svg(
            frame, title=metric, vmin=vmin, vmax=vmax, null=None if marks else null_p95(table, metric, frame),
            chance=marks, xlabel="model B", ylabel="model A")})
    models = result.tables.get("models")
    columns = [c for c in ("model_a", "model_b", "layer_a", "layer_b", "metric", "value") if c in table.columns]
    columns += [c for c in table.columns if c not in columns]
    band = null_band(table, metrics)
    return {
        "findings": with_sources(findings(summary, matrices, band, chances), summary),
        "cautions": cautions(summary, result.meta, {m: off_diagonal(f) for m, f in matrices.items()}, band, table,
                             chances),
        "summary_rows": summary_rows({**summary, **({"weights": weights_words(summary) or "unknown"}
                                                    if "weights" in summary else {}),
                                      **({"samples": samples_words(summary["samples"])} if "samples" in summary
                                         else {}),
                                      **({"p_values": p_values_words(summary)} if "p_values" in summary else {})},
                                     _SUMMARY_LABELS),
        "views": views(result, lead_metric(metrics), chances.get(lead_metric(metrics)),
                       matrices[lead_metric(metrics)]) if metrics else None,
        "models": list(summary.get("models", [])),
        "heatmaps": heatmaps,
        "model_table": html_table(models, css_class="models") if models is not None else None,
        "values": html_table(table[columns], numeric=["value", "null_mean", "null_p95"], css_class="values"),
        "n_values": len(table),
    }
