"""The study report's views of many networks at once, drawn from the study's ``embedding`` and
``linkage`` tables (computed by ``simkit.engine.study_views``): a map of the models (classical MDS) and
a dendrogram (average linkage), each an inline SVG made by matplotlib on its own Agg canvas (never
pyplot), with real text and each model's full name on hover.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd
from markupsafe import Markup, escape

from simkit.report.figures import keep_figure, new_figure, shorten

INK = "#0072B2"  # Okabe–Ito blue: one colour, safe for colour-blind readers
CHANCE_INK = "#D55E00"  # Okabe–Ito vermillion
_LABEL_CHARS = 24


def svg_markup(fig, key: str, titles: Sequence[str] = (), alt: str = "") -> Markup:
    """``fig`` as inline ``<svg>`` markup with text kept as text; ``key`` makes its ids unique in the page.
    Artists whose gid is ``{key}-label-{i}`` get ``titles[i]`` as a hover title."""
    import matplotlib

    keep_figure(fig, alt or key)  # also a figure file with `simkit report --figures` (issue #26)
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": key}):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r"<style[^>]*>.*?</style>", "", text, flags=re.S)  # its `*` rule would reach the page
    for index, title in enumerate(titles):
        text = text.replace(f'<g id="{key}-label-{index}">',
                            f'<g id="{key}-label-{index}"><title>{escape(title)}</title>', 1)
    head = f'<svg class="view-svg" role="img" aria-label="{escape(alt)}" '
    return Markup(text.replace("<svg ", head, 1))


def embedding_svg(rows: pd.DataFrame, metric: str, key: str) -> Markup:
    """The models placed by their two MDS coordinates (``embedding`` rows of one metric), each labelled."""
    fig, ax = new_figure(6.4, 4.6)
    x, y = rows["x"].to_numpy(dtype=float), rows["y"].to_numpy(dtype=float)
    ax.scatter(x, y, s=36, color=INK, zorder=3)
    rank = np.argsort(np.argsort(x, kind="stable"), kind="stable")  # labels alternate above and below in x order
    for index, (name, px, py) in enumerate(zip(rows["model"].astype(str), x, y, strict=True)):
        above = rank[index] % 2 == 0
        label = ax.annotate(shorten(name, _LABEL_CHARS), (px, py), xytext=(4, 5 if above else -5),
                            textcoords="offset points", va="bottom" if above else "top", fontsize=9,
                            parse_math=False)
        label.set_gid(f"{key}-label-{index}")
    _pad(ax, x, y)
    ax.set_aspect("equal", adjustable="box")  # one unit of dissimilarity is as long on both axes
    ax.set_xlabel("MDS dimension 1")
    ax.set_ylabel("MDS dimension 2")
    ax.set_title(f"{metric}: map of the models (classical MDS)", fontsize=10)
    ax.grid(alpha=0.3)
    return svg_markup(fig, key, list(rows["model"].astype(str)), f"{metric}: map of the models")


def _pad(ax, x: np.ndarray, y: np.ndarray) -> None:
    """Room around the points for their labels (also when every point sits at one place)."""
    span = max(float(np.ptp(x)), float(np.ptp(y)), 1e-3)
    middle, half = (float(y.min()) + float(y.max())) / 2, max(float(np.ptp(y)) / 2 + 0.2 * span, 0.4 * span)
    ax.set_xlim(float(x.min()) - 0.15 * span, float(x.max()) + 0.45 * span)
    ax.set_ylim(middle - half, middle + half)


def tree_matrix(rows: pd.DataFrame) -> np.ndarray:
    """scipy's (M − 1, 4) linkage matrix from ``linkage`` rows of one metric (in step order)."""
    ordered = rows.sort_values("step")
    return ordered[["left", "right", "distance", "size"]].to_numpy(dtype=float)


def dendrogram_svg(rows: pd.DataFrame, labels: Sequence[str], metric: str, xlabel: str, key: str,
                   chance: float | None = None) -> Markup:
    """The average-linkage tree of ``linkage`` rows (one metric; leaves ``labels`` in model order), merge
    heights on the x axis, with a dashed line at the chance dissimilarity when known."""
    from scipy.cluster.hierarchy import dendrogram

    fig, ax = new_figure(6.4, 1.2 + 0.32 * len(labels))
    # scipy's own drawing imports pyplot (matplotlib.pylab): take its coordinates, draw the links here
    drawn = dendrogram(tree_matrix(rows), orientation="right", no_plot=True)
    for heights, positions in zip(drawn["dcoord"], drawn["icoord"], strict=True):
        ax.plot(heights, positions, color=INK, lw=1.4)
    leaves = list(drawn["leaves"])
    ax.set_ylim(0.0, 10.0 * len(leaves))
    ax.set_yticks(5.0 + 10.0 * np.arange(len(leaves)))
    ticks = ax.set_yticklabels([shorten(str(labels[i]), _LABEL_CHARS) for i in leaves], fontsize=9)
    for position, tick in enumerate(ticks):
        tick.set_parse_math(False)
        tick.set_gid(f"{key}-label-{position}")
    if chance is not None and np.isfinite(chance):
        ax.axvline(chance, color=CHANCE_INK, ls="--", lw=1.2, label=f"chance ({chance:.3f})")
        ax.legend(fontsize=9, frameon=False, loc="lower left", bbox_to_anchor=(0.0, 1.0))
    ax.set_xlim(left=0.0, right=max(float(rows["distance"].max()), chance or 0.0, 1e-3) * 1.05)
    ax.set_xlabel(xlabel)
    ax.set_title(f"{metric}: dendrogram (average linkage)", fontsize=10, loc="right")
    ax.grid(axis="x", alpha=0.3)
    return svg_markup(fig, key, [str(labels[i]) for i in leaves], f"{metric}: dendrogram of the models")
