"""Figures that leave the user's matplotlib alone, and figure files fit for a paper.

- :func:`agg_figure`: a :class:`matplotlib.figure.Figure` on its own Agg canvas, never a pyplot figure,
  so simkit never changes the backend, pyplot's figures or ``rcParams``. Its class has ``_repr_png_``,
  so a figure returned as a notebook cell's last expression shows as an image whatever the backend.
- :func:`figure_style`: simkit's look, applied through ``matplotlib.rc_context`` while a figure is made
  or saved (never globally): the Okabe–Ito colour-blind-safe palette (:data:`PALETTE`), viridis as the
  default map, 10 pt text, and vector text in files (``svg.fonttype: none``, ``pdf.fonttype: 42``).
- :func:`save_figure`: a figure as ``<stem>.<format>`` files (each atomically), text raised to at least
  :data:`MIN_FONT_PT` at print size.
- :func:`shorten`: long model and layer names cut in the middle for axis labels.

matplotlib is imported on first use only, so ``import simkit`` stays fast.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from simkit.errors import SimkitError
from simkit.io import atomic_write

#: Okabe & Ito's qualitative palette (blue, orange, bluish green, vermillion, reddish purple, sky blue,
#: yellow, black): its colours stay distinct under the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
#: colour maps that stay readable under the common colour-vision deficiencies: the perceptually uniform
#: sequential ones (also in grey) and ColorBrewer's colour-blind-safe diverging ones
CVD_SAFE_MAPS = frozenset(name + suffix for name in ("viridis", "cividis", "magma", "inferno", "plasma",
                                                      "RdBu", "RdYlBu", "PuOr", "BrBG", "PRGn", "PiYG")
                          for suffix in ("", "_r"))
#: the formats figure files are written in
FIGURE_FORMATS = ("png", "pdf", "svg")
#: the smallest text in a figure file, in points at the figure's print size
MIN_FONT_PT = 9.0
#: dots per inch of PNG files (pdf and svg are vector)
FILE_DPI = 200
_MAX_LABEL_CHARS = 28


def shorten(text: str, max_chars: int = _MAX_LABEL_CHARS) -> str:
    """``text`` cut in the middle with '…' to at most ``max_chars`` characters (the tail says more)."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 3
    tail = max_chars - head - 1
    return text[:head] + "…" + text[-tail:]


def style() -> dict[str, Any]:
    """The rc settings :func:`figure_style` applies: palette, default map, font sizes, vector text."""
    from cycler import cycler

    return {"axes.prop_cycle": cycler(color=list(PALETTE)), "image.cmap": "viridis", "font.size": 10.0,
            "svg.fonttype": "none", "pdf.fonttype": 42, "ps.fonttype": 42}


@contextmanager
def figure_style() -> Iterator[None]:
    """simkit's figure look for the duration of the block (``matplotlib.rc_context``: every rc setting,
    the user's own included, is as it was afterwards; the backend is never touched)."""
    import matplotlib

    settings: Any = style()  # rc names checked by matplotlib, not by their typed Literal
    with matplotlib.rc_context(settings):
        yield


@functools.cache
def figure_class() -> type:
    """The Figure class simkit draws on: a :class:`matplotlib.figure.Figure` whose ``_repr_png_`` lets
    Jupyter show it inline without pyplot (made on first use, so importing simkit never imports
    matplotlib; registered as ``simkit.plotting.SimkitFigure`` so figures pickle)."""
    from matplotlib.figure import Figure

    class SimkitFigure(Figure):
        """A Figure on an Agg canvas that shows itself as a PNG in Jupyter."""

        def _repr_png_(self) -> bytes:
            return png_bytes(self)

    SimkitFigure.__module__, SimkitFigure.__qualname__ = __name__, "SimkitFigure"
    globals()["SimkitFigure"] = SimkitFigure
    return SimkitFigure


def agg_figure(width: float = 6.0, height: float = 4.0):
    """A figure of ``width`` × ``height`` inches on its own Agg canvas (no pyplot, no backend change),
    made in :func:`figure_style`, so axes added inside the block take simkit's palette."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    with figure_style():
        fig = figure_class()(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def use_agg_canvas(fig) -> None:
    """Give a figure made as a bare ``Figure(...)`` (no canvas of its own yet) the Agg canvas; a figure
    that already has one (Agg, or a user's pyplot backend) keeps it."""
    from matplotlib.backend_bases import FigureCanvasBase
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if type(fig.canvas) is FigureCanvasBase:
        FigureCanvasAgg(fig)


def png_bytes(fig, dpi: float = 100) -> bytes:
    """``fig`` as PNG bytes, drawn in :func:`figure_style` (what Jupyter shows)."""
    import io

    use_agg_canvas(fig)
    buffer = io.BytesIO()
    with figure_style():
        fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()


def readable_fonts(fig, min_pt: float = MIN_FONT_PT) -> None:
    """Raise every text of ``fig`` smaller than ``min_pt`` points (tick labels, legends, annotations,
    titles) to ``min_pt``; larger text keeps its size."""
    from matplotlib.text import Text

    for ax in fig.axes:
        for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = axis.get_ticklabels(which="both")
            if labels and min(label.get_fontsize() for label in labels) < min_pt:
                ax.tick_params(axis=which, which="both", labelsize=max(min_pt, max(
                    label.get_fontsize() for label in labels)))
    for text in fig.findobj(Text):
        if text.get_fontsize() < min_pt:
            text.set_fontsize(min_pt)


def parse_formats(formats: str | Iterable[str], option: str = "`formats`") -> tuple[str, ...]:
    """``"png,pdf"`` or ``["png", "svg"]`` → ``("png", "pdf")``: known figure formats, in order, each once;
    a SimkitError naming ``option`` for an unknown or empty list."""
    parts = formats.split(",") if isinstance(formats, str) else [str(f) for f in formats]
    chosen = [p.strip().lower().lstrip(".") for p in parts if p.strip()]
    unknown = [p for p in chosen if p not in FIGURE_FORMATS]
    if unknown or not chosen:
        got = f"got {', '.join(map(repr, unknown))}" if unknown else "got none"
        raise SimkitError(f"{option} takes a comma list of figure formats from {','.join(FIGURE_FORMATS)} "
                          f"({got}); e.g. {option} png,pdf")
    return tuple(dict.fromkeys(chosen))


def save_figure(fig, stem: str | Path, formats: Iterable[str] = FIGURE_FORMATS) -> list[Path]:
    """Write ``fig`` as ``<stem>.<format>`` for each format (each file atomically) and return the paths.

    Text below :data:`MIN_FONT_PT` is raised to it; PNGs at :data:`FILE_DPI`; pdf and svg keep text as
    text (TrueType in pdf, ``<text>`` in svg). Settings apply to this save only (:func:`figure_style`).
    """
    stem = Path(stem)
    use_agg_canvas(fig)
    readable_fonts(fig)
    paths = []
    with figure_style():
        for fmt in formats:
            def write(tmp: Path, fmt: str = fmt) -> None:
                fig.savefig(tmp, format=fmt, dpi=FILE_DPI, bbox_inches="tight")

            paths.append(atomic_write(stem.with_name(f"{stem.name}.{fmt}"), write))
    return paths


def figure_names(titles: Sequence[str]) -> list[str]:
    """A file name (no suffix) per figure title: lower case, runs of other characters than letters,
    digits and '_' as '-', at most 60 characters; a repeated name gets '-2', '-3', ..."""
    names: list[str] = []
    for title in titles:
        base = re.sub(r"[^a-z0-9_]+", "-", title.lower()).strip("-")[:60].strip("-") or "figure"
        name, k = base, 1
        while name in names:
            k += 1
            name = f"{base}-{k}"
        names.append(name)
    return names


def write_figures(figures: Mapping[str, Callable[[], Any]], folder: str | Path,
                  formats: Iterable[str] = FIGURE_FORMATS) -> list[Path]:
    """Save each figure (``name → draw()``) as ``folder/<name>.<format>`` (:func:`save_figure`) and
    return the paths written."""
    folder, formats = Path(folder), tuple(formats)
    paths: list[Path] = []
    for name, draw in figures.items():
        paths += save_figure(draw(), folder / name, formats)
    return paths
