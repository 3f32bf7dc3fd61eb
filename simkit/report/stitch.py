"""Report context of a stitch run: penalty heatmaps (objective × layer pair) per setting, penalties over
depth, IRI quality (relative-error histograms, IRIs beside their originals) and the run's settings.

Everything is drawn from the result's tables and ``extra``; nothing is computed here but layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from simkit.report.figures import heatmap_svg, img, line_plot, new_figure


def _pair_label(row) -> str:
    return f"{row['layer_a']} → {row['layer_b']}"


def _pair_order(table: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(table.apply(_pair_label, axis=1))) if len(table) else []


def penalty_frames(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """setting → DataFrame (objective × layer pair) of penalties, pairs in run order."""
    if not len(table):
        return {}
    table = table.assign(pair=table.apply(_pair_label, axis=1))
    order = _pair_order(table)
    frames = {}
    for setting, part in table.groupby("setting", sort=False):
        frame = part.pivot_table(index="objective", columns="pair", values="penalty", aggfunc="mean")
        objectives = list(dict.fromkeys(part.objective))
        frame = frame.reindex(index=objectives, columns=[p for p in order if p in frame.columns])
        frame.index.name, frame.columns.name = "objective", "layer of A → layer of B"
        frames[str(setting)] = frame
    return frames


def _heatmaps(frames: dict[str, pd.DataFrame]) -> list[dict[str, Any]]:
    values = [f.to_numpy(dtype=float) for f in frames.values()]
    finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.array([])
    lo = float(min(0.0, finite.min())) if finite.size else 0.0
    hi = float(max(finite.max(), lo + 1e-9)) if finite.size else 1.0
    return [{"setting": setting,
             "svg": heatmap_svg(frame, title=f"Stitching penalty, {setting} stitching", vmin=lo, vmax=hi,
                                cmap="magma_r")}
            for setting, frame in frames.items()]


def _depth_plot(table: pd.DataFrame):
    if not len(table):
        return None
    order = _pair_order(table)
    table = table.assign(pair=table.apply(_pair_label, axis=1))
    series = {}
    for (objective, setting), part in table.groupby(["objective", "setting"], sort=False):
        values = part.groupby("pair").penalty.mean().reindex(order)
        series[f"{objective} ({setting})"] = values.tolist()
    return line_plot(order, series, title="Stitching penalty over depth", xlabel="layer pair (A → B)",
                     ylabel="penalty (B acc − stitched acc)")


def _histogram(histograms: dict[str, dict[str, list[float]]], tol: float | None):
    if not histograms:
        return None
    fig, ax = new_figure(6.5, 3.4)
    for layer, hist in histograms.items():
        edges = np.asarray(hist["log10_edges"], dtype=float)
        ax.stairs(np.asarray(hist["counts"], dtype=float), 10 ** edges, label=layer)
    if tol:
        ax.axvline(tol, color="k", ls="--", lw=1, label=f"tolerance {tol:g}")
    ax.set_xscale("log")
    ax.set_xlabel("relative error ‖a(x′) − a(x)‖ / ‖a(x)‖")
    ax.set_ylabel("IRIs")
    ax.set_title("IRI relative error per stitch layer of A", fontsize=10)
    ax.legend(fontsize=7, frameon=False)
    return img(fig, "IRI relative error histogram")


def _examples_figure(layer: str, ex: dict[str, Any]):
    """Originals, seeds and IRIs side by side: images (C, H, W) as pictures, (C, L) as curves."""
    shape = ex.get("shape", [])
    k = len(ex["original"])
    if not k or len(shape) not in (2, 3):
        return None
    columns = [("original x", ex["original"]), ("seed", ex["seed"]), ("IRI x′", ex["iri"])]
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1.6 * len(columns) + 0.6, 1.4 * k + 0.4))
    axes = fig.subplots(k, len(columns), squeeze=False)
    for i in range(k):
        for j, (name, values) in enumerate(columns):
            ax = axes[i][j]
            sample = values[i]
            if sample is None:
                ax.axis("off")
                continue
            array = np.asarray(sample, dtype=float)
            if len(shape) == 3:
                picture = array[0] if array.shape[0] == 1 else np.moveaxis(array[:3], 0, -1)
                lo, hi = _limits(ex)
                ax.imshow(np.clip(picture, lo, hi), cmap="gray" if array.shape[0] == 1 else None, vmin=lo, vmax=hi)
                ax.set_xticks([])
                ax.set_yticks([])
            else:
                for channel in array:
                    ax.plot(channel, lw=1)
                ax.tick_params(labelsize=6)
            if i == 0:
                ax.set_title(name, fontsize=8)
        axes[i][0].set_ylabel(f"r = {ex['rel_error'][i]:.3g}", fontsize=7)
    fig.suptitle(f"IRIs at A.{layer}", fontsize=9)
    return img(fig, f"IRIs beside their originals at {layer}")


def _limits(ex: dict[str, Any]) -> tuple[float, float]:
    values = np.asarray(ex["original"], dtype=float)
    return float(values.min()), float(values.max())


def context(result) -> dict[str, Any]:
    table = result.tables.get("stitching", pd.DataFrame())
    meta, extra = result.meta, result.extra
    frames = penalty_frames(table)
    iri_meta = meta.get("iri") or {}
    settings_rows = [("model A (front)", meta.get("model_a")), ("model B (back)", meta.get("model_b")),
                     ("data", meta.get("data")), ("train / test samples", f"{meta.get('n_train')} / {meta.get('n_test')}"),
                     ("objectives", ", ".join(meta.get("objectives", []))),
                     ("settings", ", ".join(meta.get("settings", []))), ("stitch init", meta.get("init")),
                     ("stitch training", meta.get("train")), ("IRI generation", iri_meta or "not run"),
                     ("input value range", f"{meta.get('value_range')} ({meta.get('value_range_source')})"),
                     ("how B was cut", meta.get("cut")), ("seed", meta.get("seed"))]
    summary = result.summary
    headline = [(key, summary[key]) for key in summary]
    return {
        "headline": headline,
        "heatmaps": _heatmaps(frames),
        "depth_plot": _depth_plot(table),
        "rows": table.to_dict("records"),
        "iri_table": result.tables["iris"].to_dict("records") if "iris" in result.tables else [],
        "iri_histogram": _histogram(extra.get("iri_histograms", {}), iri_meta.get("tol")),
        "iri_examples": [fig for layer, ex in extra.get("iri_examples", {}).items()
                         if (fig := _examples_figure(layer, ex)) is not None],
        "objective_descriptions": extra.get("objective_descriptions", {}),
        "settings_rows": settings_rows,
        "training_rows": result.tables["training"].to_dict("records") if "training" in result.tables else [],
    }
