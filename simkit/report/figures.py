"""Figure helpers shared by every report: inline images and SVG heatmaps, never files on the side."""

from __future__ import annotations

import base64
import io

from markupsafe import Markup


def figure_to_data_uri(fig) -> str:
    """Save a matplotlib figure as an inline PNG data URI and close it."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def img(fig, alt: str) -> Markup:
    """An <img> element holding ``fig`` inline (the figure is closed)."""
    return Markup('<img class="figure" src="{}" alt="{}">').format(figure_to_data_uri(fig), alt)


def new_figure(width: float = 6.0, height: float = 4.0):
    """A matplotlib figure on the non-interactive Agg canvas: ``fig, ax = new_figure()``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.add_subplot(1, 1, 1)
