"""Report context of a ``linearize`` result: accuracy vs NAPL, path-length histograms, heatmaps.

Reads only the result's tables (``runs``, ``layers``, ``distributions``, ``cka``, ``history``) and
summary; the binomial reference curves are drawn from the stored NAPL and maximum length.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from simkit.report.figures import heatmap_svg, img, line_plot, new_figure

_COLOURS = {"channel": "#1f77b4", "layer": "#d62728"}


def _accuracy_vs_napl(runs: pd.DataFrame, summary: dict[str, Any]):
    fig, ax = new_figure(6.5, 4.0)
    for granularity, group in runs.groupby("granularity", sort=False):
        group = group.sort_values("napl")
        ax.plot(group["napl"], group["accuracy"], marker="o", label=f"{granularity}-wise",
                color=_COLOURS.get(str(granularity)))
        for _, row in group.iterrows():
            ax.annotate(f"ω={row['omega']:g}", (row["napl"], row["accuracy"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
    ax.scatter([summary["original_napl"]], [summary["original_accuracy"]], marker="*", s=140, color="black",
               label="original (all ReLU)", zorder=3)
    ax.set_xlabel("NAPL (normalised average path length)")
    ax.set_ylabel("test accuracy")
    ax.set_title("Accuracy against NAPL", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    return img(fig, "accuracy against NAPL, channel-wise and layer-wise")


def _binomial(length: int, p: float) -> np.ndarray:
    return np.array([math.comb(length, k) * p**k * (1 - p) ** (length - k) for k in range(length + 1)])


def _histograms(dists: pd.DataFrame, order: list[str]):
    labels = [r for r in order if r in set(dists["run"])]
    cols = min(4, len(labels))
    rows = -(-len(labels) // cols)
    fig, _ = new_figure(3.0 * cols, 2.3 * rows)
    fig.clear()
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(labels):]:
        ax.axis("off")
    for ax, label in zip(axes.flat, labels, strict=False):
        frame = dists[dists["run"] == label].sort_values("length")
        lengths = frame["length"].to_numpy()
        probs = frame["probability"].to_numpy()
        top = int(lengths.max())
        napl = float(lengths @ probs)
        ax.bar(lengths, probs, color="#8fb3d9", label="path lengths")
        if top > 0:
            ax.plot(np.arange(top + 1), _binomial(top, min(max(napl / top, 0.0), 1.0)), "k.--", lw=0.8, ms=4,
                    label=f"Binomial({top}, NAPL/{top})")
        ax.set_title(f"{label}  (NAPL {napl:.3g})", fontsize=8)
        ax.tick_params(labelsize=7)
    axes.flat[0].legend(fontsize=6, frameon=False)
    fig.tight_layout()
    return img(fig, "path-length distributions against the binomial expectation")


def _layer_heatmap(layers: pd.DataFrame, order: list[str]):
    if layers.empty:
        return None
    wide = layers.pivot(index="layer", columns="run", values="nonlinear_fraction")
    layer_order = list(dict.fromkeys(layers["layer"]))
    wide = wide.reindex(index=layer_order, columns=[r for r in order if r in wide.columns])
    wide.index.name, wide.columns.name = "activation site", "run"
    return heatmap_svg(wide, title="fraction of units still nonlinear", vmin=0.0, vmax=1.0)


def _cka_figures(cka: pd.DataFrame | None, runs: pd.DataFrame, order: list[str]) -> dict[str, Any]:
    if cka is None or cka.empty:
        return {"cka_diagonal": None, "cka_matrices": []}
    same = cka[cka["layer_a"] == cka["layer_b"]]
    diagonal = same.pivot(index="layer_a", columns="run", values="linear_cka")
    diagonal = diagonal.reindex(index=list(dict.fromkeys(same["layer_a"])),
                                columns=[r for r in order if r in diagonal.columns])
    diagonal.index.name, diagonal.columns.name = "activation site", "run"
    matrices = []
    for granularity, group in runs.groupby("granularity", sort=False):
        row = group.sort_values("napl").iloc[0]
        label = f"{granularity} ω={row['omega']:g}"
        rows = cka[cka["run"] == label]
        if rows.empty:
            continue
        wide = rows.pivot(index="layer_a", columns="layer_b", values="linear_cka")
        names = list(dict.fromkeys(rows["layer_a"]))
        wide = wide.reindex(index=names, columns=names)
        wide.index.name, wide.columns.name = "original site", f"linearized site ({label})"
        matrices.append({"label": label, "svg": heatmap_svg(
            wide, title=f"linear CKA: original vs {label} (lowest NAPL)", vmin=0.0, vmax=1.0)})
    return {"cka_diagonal": heatmap_svg(diagonal, title="linear CKA of each site with the original's",
                                        vmin=0.0, vmax=1.0),
            "cka_matrices": matrices}


def _loss_plot(history: pd.DataFrame | None, order: list[str]):
    if history is None or history.empty:
        return None
    steps = sorted(history["step"].unique())
    series = {}
    for label in order:
        frame = history[history["run"] == label].set_index("step")["loss"]
        series[label] = frame.reindex(steps).to_numpy()
    return line_plot(steps, series, title="post-training loss (CE + ω·penalty)", xlabel="step", ylabel="loss",
                     logy=True)


def context(result) -> dict[str, Any]:
    """Template context of a LinearizeResult: figures and tables drawn from its tables only."""
    runs = result.tables["runs"]
    order = [f"{g} ω={w:g}" for g, w in zip(runs["granularity"], runs["omega"], strict=True)]
    dists = result.tables.get("distributions", pd.DataFrame(columns=["run", "length", "probability"]))
    columns = list(runs.columns)
    return {
        "runs_columns": columns,
        "runs_rows": runs.to_dict(orient="records"),
        "accuracy_plot": _accuracy_vs_napl(runs, result.summary) if not runs.empty else None,
        "matched": result.tables["matched"].to_dict(orient="records") if "matched" in result.tables else [],
        "histograms": _histograms(dists, ["original"] + order) if not dists.empty else None,
        "layer_heatmap": _layer_heatmap(result.tables.get("layers", pd.DataFrame()), order),
        "loss_plot": _loss_plot(result.tables.get("history"), order),
        **_cka_figures(result.tables.get("cka"), runs, order),
    }
