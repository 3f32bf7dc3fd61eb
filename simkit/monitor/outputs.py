"""What a measurement becomes outside the monitor: tracker scalars, the matrix image, the long table.

- :func:`scalars_of`: ``{"similarity/<metric>/<layer>": value, "chance/<metric>/<layer>": chance}`` (the
  pair written ``<layer>~<reference layer>`` when the names differ);
- :func:`matrix_png`: one measure's layer × reference-layer matrix at one step as a PNG heatmap (its own
  Agg figure in simkit's style; the user's matplotlib is left alone);
- :class:`StepsTable`: the long table of every step, rewritten atomically as ``steps.csv`` after each
  measurement (``steps.parquet`` too at the end when pyarrow is installed).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pandas as pd

from simkit.catalog import colour_bounds
from simkit.io import atomic_write, write_csv
from simkit.plotting import agg_figure, figure_style, png_bytes, shorten


def pair_name(layer: str, reference_layer: str) -> str:
    """How a layer pair is written in tags and legends."""
    return layer if layer == reference_layer else f"{layer}~{reference_layer}"


def scalars_of(rows: pd.DataFrame) -> dict[str, float]:
    """Tracker scalars of one step's rows: each pair's value and, when known, its chance level."""
    out: dict[str, float] = {}
    for row in rows.itertuples(index=False):
        pair = pair_name(str(row.layer), str(row.reference_layer))
        value = float(row.value)
        if math.isfinite(value):
            out[f"similarity/{row.metric}/{pair}"] = value
        chance = float(getattr(row, "chance", math.nan))
        if math.isfinite(chance):
            out[f"chance/{row.metric}/{pair}"] = chance
    return out


def matrix_png(rows: pd.DataFrame, metric: str, step: int) -> bytes:
    """The heatmap of ``metric``'s layer × reference-layer matrix in ``rows`` (all pairs of one step)."""
    part = rows[rows["metric"] == metric]
    wide = part.pivot_table(index=["depth", "layer"], columns=["reference_depth", "reference_layer"],
                            values="value", aggfunc="first", dropna=False)
    lo, hi = colour_bounds(metric)
    fig = agg_figure(1.6 + 0.45 * wide.shape[1], 1.2 + 0.4 * wide.shape[0])
    with figure_style():
        ax = fig.add_subplot(1, 1, 1)
        image = ax.imshow(wide.to_numpy(dtype=float), cmap="viridis", vmin=lo, vmax=hi, aspect="auto")
        ax.set_xticks(range(wide.shape[1]), [shorten(str(c[1]), 18) for c in wide.columns], rotation=90)
        ax.set_yticks(range(wide.shape[0]), [shorten(str(i[1]), 18) for i in wide.index])
        ax.set_xlabel("reference layer")
        ax.set_ylabel("layer")
        ax.set_title(f"{metric}, step {step}", fontsize=10)
        fig.colorbar(image, ax=ax)
    return png_bytes(fig, dpi=80)


class StepsTable:
    """The long table of a run: every measured step's rows, kept in order and written to ``folder``."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.parts: list[pd.DataFrame] = []

    def add(self, rows: pd.DataFrame) -> None:
        """Keep ``rows`` and add them to ``steps.csv`` (the first rows write it atomically with its header,
        later ones are appended in one write, so a step costs its own rows, not the whole run's; the
        run's end rewrites it whole, ordered by step)."""
        self.parts.append(rows)
        if self.folder is None:
            return
        path = self.folder / "steps.csv"
        if len(self.parts) == 1 or not path.exists():
            write_csv(path, self.frame())
        else:
            with path.open("a", encoding="utf-8", newline="") as handle:
                handle.write(rows.to_csv(index=False, header=False))

    def frame(self) -> pd.DataFrame:
        """Every row so far, ordered by step (one empty frame before the first measurement)."""
        if not self.parts:
            return pd.DataFrame()
        return pd.concat(self.parts, ignore_index=True).sort_values("step", kind="stable").reset_index(drop=True)

    def finish(self) -> Path | None:
        """Write ``steps.parquet`` beside ``steps.csv`` when pyarrow is installed (its path, else None)."""
        if self.folder is None or not self.parts or importlib.util.find_spec("pyarrow") is None:
            return None
        frame = self.frame()
        return atomic_write(self.folder / "steps.parquet", lambda p: frame.to_parquet(p, index=False))
