"""Figure helpers shared by every report: inline images and SVG heatmaps, never files on the side.

- ``new_figure`` / ``img``: a matplotlib figure drawn on an explicit canvas, embedded as a PNG data URI.
- ``line_plot`` / ``bar_plot``: the two matplotlib charts most reports need, as ready ``<img>`` markup.
- ``html_table``: a DataFrame as an escaped HTML table, quick for tens of thousands of rows.
- ``heatmap_svg``: a hand-built inline SVG heatmap (no JavaScript) with readable labels on both axes,
  a ``<title>`` tooltip on every cell, a colour bar, hatched NaN cells and optional null marks.

Every string that reaches the markup goes through :func:`markupsafe.escape`. Figures are drawn on their
own Agg canvas in :func:`simkit.plotting.figure_style` (colour-blind-safe palette, never a global
``rcParams`` or backend change).

Figures as files: inside :func:`collect_figures`, every figure a report makes (each ``img`` and each
``heatmap_svg``, the heatmap redrawn with matplotlib by :func:`heatmap_figure`) is also kept as a
:class:`ReportFigure`, which :func:`simkit.plotting.write_figures` saves as ``<name>.<format>``.
"""

from __future__ import annotations

import base64
import hashlib
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
from markupsafe import Markup, escape

from simkit.plotting import CVD_SAFE_MAPS, agg_figure, figure_names, figure_style, png_bytes, shorten


def format_number(value, digits: int = 4) -> str:
    """Numbers for tables: NaN as 'n/a', floats to ``digits`` significant digits."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if value != value:
            return "n/a"
        return f"{value:.{digits}g}"
    return str(value)


def nice_ticks(lo: float, hi: float, target: int = 5) -> tuple[list[float], list[str]]:
    """About ``target`` round tick values within ``[lo, hi]`` (steps 1, 2, 2.5 or 5 × 10^k) and their
    labels, written with just the digits the step needs and never as ``-0``."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        value = lo if math.isfinite(lo) else 0.0
        return [value], [format_number(float(value) + 0.0, 3)]
    def ticks_of(step: float) -> list[float]:
        first = math.ceil(lo / step - 1e-9)
        return [(first + k) * step for k in range(int(math.floor(hi / step + 1e-9)) - first + 1)]

    base = math.floor(math.log10((hi - lo) / max(target - 1, 1)))
    candidates = [(m, 10.0 ** p) for p in (base - 1, base, base + 1) for m in (1, 2, 2.5, 5)]
    # the step whose tick count is nearest ``target``; on a tie the larger step
    mult, power = min(candidates, key=lambda c: (abs(len(ticks_of(c[0] * c[1])) - target), -c[0] * c[1]))
    step = mult * power
    ticks = ticks_of(step)
    decimals = max(0, -round(math.log10(power)) + (1 if mult == 2.5 else 0))
    labels = [f"{(0.0 if abs(t) < step * 1e-6 else t):.{decimals}f}" for t in ticks]
    return ticks, labels


def meta_html(value) -> Markup:
    """A ``meta`` value as readable HTML, never a Python repr: mappings as nested tables, a list of
    mappings as one table (a column per key), other lists comma-joined, ``None`` as an em dash, floats
    to 4 significant digits, booleans as yes/no."""
    if isinstance(value, Mapping):
        rows = "".join(f"<tr><th>{escape(str(k))}</th><td>{meta_html(v)}</td></tr>" for k, v in value.items())
        return Markup(f'<table class="meta">{rows}</table>')
    if isinstance(value, list | tuple):
        if not value:
            return Markup('<span class="muted">none</span>')
        if all(isinstance(v, Mapping) for v in value):
            keys = list(dict.fromkeys(k for v in value for k in v))
            head = "".join(f"<th>{escape(str(k))}</th>" for k in keys)
            body = "".join("<tr>" + "".join(f"<td>{meta_html(v.get(k))}</td>" for k in keys) + "</tr>"
                           for v in value)
            return Markup(f'<table class="meta"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
        return Markup(", ").join(meta_html(v) for v in value)
    if value is None:
        return Markup("—")
    if isinstance(value, bool):
        return Markup("yes" if value else "no")
    if isinstance(value, float):
        return Markup(escape(format_number(value)))
    return Markup("<code>{}</code>").format(str(value))


def plain_text(value) -> str:
    """A ``meta`` value as one line of readable text, never a Python repr: mappings as ``key=value``
    pairs (nested ones in parentheses), lists comma-joined, ``None`` as '—', floats to 4 significant
    digits, booleans as yes/no."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_nested_text(v)}" for k, v in value.items()) or "—"
    if isinstance(value, list | tuple):
        return ", ".join(plain_text(v) for v in value) if value else "none"
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return format_number(value)


def _nested_text(value) -> str:
    """A value inside a mapping: a nested mapping or a list of several in parentheses."""
    text = plain_text(value)
    several = isinstance(value, Mapping) and len(value) > 1 or isinstance(value, list | tuple) and len(value) > 1
    return f"({text})" if several else text


def _close(fig) -> None:
    """Close ``fig`` in pyplot when pyplot manages it. Figures made by :func:`new_figure` never enter
    pyplot; pyplot is not imported here (importing it picks a backend), only used when already loaded."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close(fig)


def figure_to_data_uri(fig) -> str:
    """Save a matplotlib figure as an inline PNG data URI and close it."""
    try:
        data = png_bytes(fig, dpi=110)
    finally:
        _close(fig)
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def img(fig, alt: str) -> Markup:
    """An <img> element holding ``fig`` inline (the figure is closed; inside :func:`collect_figures` it
    is also kept, named after ``alt``, and with ``encode=False`` the element has no image: nobody reads it)."""
    keep_figure(fig, alt)
    src = figure_to_data_uri(fig) if _ENCODE.get() else ""
    return Markup('<img class="figure" src="{}" alt="{}">').format(src, alt)


def new_figure(width: float = 6.0, height: float = 4.0):
    """A matplotlib figure on its own Agg canvas: ``fig, ax = new_figure()``.

    The figure is a plain :class:`matplotlib.figure.Figure` with a ``FigureCanvasAgg``
    (:func:`simkit.plotting.agg_figure`), never a pyplot figure, so making reports leaves the user's
    backend (e.g. Jupyter's inline one), ``rcParams`` and pyplot's figures alone; its axes take the
    colour-blind-safe palette.
    """
    fig = agg_figure(width, height)
    with figure_style():
        ax = fig.add_subplot(1, 1, 1)
    return fig, ax


# ---------------------------------------------------------------------------------------------------
# figures as files


@dataclass(frozen=True)
class ReportFigure:
    """One figure of a report: its title and a function drawing it as a matplotlib Figure."""

    title: str
    draw: Callable[[], Any]


_KEPT: ContextVar[list[ReportFigure] | None] = ContextVar("simkit_report_figures", default=None)
# False while a report is built only for its figures (:func:`collect_figures` ``encode=False``): the HTML
# is thrown away, so ``img`` skips encoding each figure as an inline PNG
_ENCODE: ContextVar[bool] = ContextVar("simkit_report_encode", default=True)


def _keep(title: str, draw: Callable[[], Any]) -> None:
    """Keep a figure when :func:`collect_figures` is listening (otherwise nothing happens)."""
    kept = _KEPT.get()
    if kept is not None:
        kept.append(ReportFigure(str(title), draw))


def keep_figure(fig, title: str) -> None:
    """For a report figure embedded otherwise than by :func:`img` (e.g. as inline SVG): keep ``fig``
    under ``title`` for the figure files (:func:`collect_figures`); nothing happens outside it."""
    _keep(title, lambda: fig)


def collect_figures(build: Callable[[], Any], encode: bool = True) -> tuple[Any, dict[str, Callable[[], Any]]]:
    """``(build(), {file name: draw})``: run a report's builder and keep each figure it makes, in the
    report's order, named by :func:`simkit.plotting.figure_names` after its title. ``encode=False`` when
    only the figures are wanted: the report's inline images are then left empty (its PNG encoding was
    half the cost of ``savefig``)."""
    token, encoding = _KEPT.set([]), _ENCODE.set(encode)
    try:
        value = build()
        kept = list(_KEPT.get() or [])
    finally:
        _KEPT.reset(token)
        _ENCODE.reset(encoding)
    return value, dict(zip(figure_names([f.title for f in kept]), (f.draw for f in kept), strict=True))


# ---------------------------------------------------------------------------------------------------
# matplotlib charts


def line_plot(
    x: Sequence,
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    xlabel: str = "",
    ylabel: str = "",
    bands: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
    logy: bool = False,
    width: float = 7.0,
    height: float = 3.6,
) -> Markup:
    """Lines ``series[name]`` (each the length of ``x``) with optional shaded ``bands[name] = (lo, hi)``.

    ``x`` may be numbers or labels (strings: drawn as rotated category ticks). Returns an ``<img>``.
    """
    fig, ax = new_figure(width, height)
    categorical = any(isinstance(v, str) for v in x)
    positions = np.arange(len(x)) if categorical else np.asarray(x, dtype=float)
    for name, values in series.items():
        (line,) = ax.plot(positions, np.asarray(values, dtype=float), marker="o", ms=3, label=name)
        if bands and name in bands:
            lo, hi = bands[name]
            # drawn over the line with its edges dashed, so a band the line lies on stays visible
            lo_values, hi_values = np.asarray(lo, float), np.asarray(hi, float)
            ax.fill_between(positions, lo_values, hi_values, color=line.get_color(), alpha=0.3, lw=0,
                            zorder=3, label=f"{name}: null mean–p95")
            for edge in (lo_values, hi_values):
                ax.plot(positions, edge, color=line.get_color(), lw=0.8, ls="--", zorder=3)
    if categorical:  # at most ~40 labelled ticks, so long layer lists stay legible and quick to draw
        every = max(1, math.ceil(len(x) / 40))
        ax.set_xticks(positions[::every])
        ax.set_xticklabels([shorten(str(v), 24) for v in x[::every]], rotation=60, ha="right", fontsize=9,
                           parse_math=False)  # layer names are text ("$" included), never mathtext
    if logy:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1 or bands:
        ax.legend(fontsize=9, frameon=False, loc="best")
    return img(fig, title)


def bar_plot(
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    ylabel: str = "",
    width: float = 7.0,
    height: float = 3.6,
) -> Markup:
    """Grouped bars: one group per label, one bar per entry of ``series`` (each the length of labels)."""
    fig, ax = new_figure(width, height)
    positions = np.arange(len(labels))
    step = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        ax.bar(positions + (i - (len(series) - 1) / 2) * step, np.asarray(values, dtype=float),
               width=step, label=name)
    ax.set_xticks(positions)
    ax.set_xticklabels([shorten(str(v), 24) for v in labels], rotation=60 if len(labels) > 6 else 0,
                       ha="right" if len(labels) > 6 else "center", fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:  # outside the axes, so it never hides a bar
        ax.legend(fontsize=9, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return img(fig, title)


# ---------------------------------------------------------------------------------------------------
# tables


def html_table(frame, *, numeric: Sequence[str] = (), digits: int = 4, css_class: str = "") -> Markup:
    """``frame`` (rows × columns) as an escaped ``<table>``; floats to ``digits`` significant digits,
    NaN as 'n/a'; cells of the ``numeric`` columns right-aligned. Built in Python, not Jinja, so a
    40,000-row table takes about a second."""

    columns = [str(c) for c in frame.columns]
    right = [c in numeric for c in columns]
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = []
    for row in frame.itertuples(index=False, name=None):
        cells = "".join(
            f'<td class="num">{escape(format_number(v, digits))}</td>' if num
            else f"<td>{escape(format_number(v, digits))}</td>"
            for v, num in zip(row, right, strict=True))
        body.append(f"<tr>{cells}</tr>")
    cls = f' class="{escape(css_class)}"' if css_class else ""
    return Markup(f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


# ---------------------------------------------------------------------------------------------------
# SVG heatmap

_FONT_PX = 11
_CHAR_PX = 6.6          # generous average glyph width of an 11 px sans-serif font
_MAX_LABEL_CHARS = 28
_COS45 = math.sqrt(0.5)


def _colours(values: np.ndarray, vmin: float, vmax: float, cmap: str) -> np.ndarray:
    """(k,) values -> (k, 3) RGB in [0, 1] from the matplotlib colormap ``cmap``."""
    from matplotlib import colormaps

    span = vmax - vmin
    t = np.clip((values - vmin) / span, 0.0, 1.0) if span > 0 else np.full_like(values, 0.5)
    return np.asarray(colormaps[cmap](t))[..., :3]


def _hex(rgb) -> str:
    r, g, b = (int(round(255 * float(c))) for c in rgb)
    return f"#{r:02x}{g:02x}{b:02x}"


def _ink(rgb) -> str:
    """Black or white, whichever reads better on ``rgb``."""
    luminance = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]
    return "#000" if luminance > 0.45 else "#fff"


def _range(values: np.ndarray, vmin, vmax) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    lo = float(vmin) if vmin is not None else (float(finite.min()) if finite.size else 0.0)
    hi = float(vmax) if vmax is not None else (float(finite.max()) if finite.size else 1.0)
    if hi < lo:
        lo, hi = hi, lo
    return lo, hi


def _text_px(text: str) -> float:
    return len(text) * _CHAR_PX


@dataclass(frozen=True)
class ChanceMarks:
    """Each cell's chance level and whether it beats it (R, C), the rule in words, and an optional
    interval (R, C) each, shown on hover: cells that do not beat chance get a dot."""

    chance: np.ndarray
    beats: np.ndarray
    rule: str
    low: np.ndarray | None = None
    high: np.ndarray | None = None


@dataclass(frozen=True)
class _HeatmapData:
    """What a heatmap shows: values (R, C), full and shortened labels, null thresholds (R, C) or None,
    the colour range [lo, hi] and the SVG's unique id."""

    title: str
    values: np.ndarray
    rows: list[str]
    cols: list[str]
    short_rows: list[str]
    short_cols: list[str]
    xlabel: str
    ylabel: str
    thresholds: np.ndarray | None
    chance: ChanceMarks | None
    lo: float
    hi: float
    cmap: str
    fmt: str
    uid: str


@dataclass(frozen=True)
class _HeatmapLayout:
    """Where everything goes, in px: cell size and font, the grid's top-left corner and size, the
    column labels' height, the colour bar, the axis titles' centres and the picture's size."""

    cell: float
    font: int
    pad: float
    left: float
    top: float
    grid_w: float
    grid_h: float
    col_label_h: float
    bar_x: float
    bar_w: float
    bar_h: float
    xlabel_x: float
    ylabel_y: float
    width: float
    height: float
    ticks: list[float]
    tick_labels: list[str]


def _e(text) -> str:
    """``text`` escaped for SVG markup, as a plain string."""
    return str(escape(str(text)))


def _heatmap_data(frame, title: str, vmin, vmax, cmap: str, fmt: str, null, xlabel: str | None,
                  ylabel: str | None, max_label_chars: int, chance: ChanceMarks | None = None) -> _HeatmapData:
    """The values, labels, thresholds and colour range of ``heatmap_svg``'s arguments."""
    values = frame.to_numpy(dtype=float, na_value=np.nan)
    rows = [str(v) for v in frame.index]
    cols = [str(v) for v in frame.columns]
    thresholds = None
    if null is not None:
        thresholds = null.reindex(index=frame.index, columns=frame.columns).to_numpy(
            dtype=float, na_value=np.nan)
    lo, hi = _range(values, vmin, vmax)
    digest = hashlib.sha1(repr((title, rows, cols)).encode() + values.tobytes()).hexdigest()[:10]
    return _HeatmapData(
        title=title, values=values, rows=rows, cols=cols,
        short_rows=[shorten(r, max_label_chars) for r in rows], short_cols=[shorten(c, max_label_chars) for c in cols],
        xlabel=str(frame.columns.name or "") if xlabel is None else xlabel,
        ylabel=str(frame.index.name or "") if ylabel is None else ylabel,
        thresholds=thresholds, chance=chance, lo=lo, hi=hi, cmap=cmap, fmt=fmt, uid=f"hm{digest}")


def _heatmap_layout(hm: _HeatmapData) -> _HeatmapLayout:
    """Cell size from the grid's shape; margins wide enough for the labels, the colour bar's tick
    labels and the titles (which never run out of the picture)."""
    n_rows, n_cols = hm.values.shape
    cell = float(max(14, min(40, 760 // max(n_cols, 1), 600 // max(n_rows, 1))))
    font = _FONT_PX if cell >= 16 else 10
    row_label_px = max((_text_px(r) for r in hm.short_rows), default=0.0)
    col_label_px = max((_text_px(c) for c in hm.short_cols), default=0.0)
    pad = 8.0
    ytitle_px = 18.0 if hm.ylabel else 0.0
    # Column labels hang down-left at 45 degrees from under each column's centre.
    overhang = max((_text_px(c) * _COS45 - (j + 0.5) * cell for j, c in enumerate(hm.short_cols)), default=0.0)
    left = pad + ytitle_px + max(row_label_px + 6.0, overhang)
    top = 30.0 if hm.title else pad
    grid_w, grid_h = n_cols * cell, n_rows * cell
    col_label_h = col_label_px * _COS45 + font + 8.0
    xtitle_h = 20.0 if hm.xlabel else 0.0
    bar_x, bar_w, bar_h = left + grid_w + 18.0, 14.0, max(grid_h, 120.0)
    ticks, tick_labels = nice_ticks(hm.lo, hm.hi)
    width = bar_x + bar_w + 6.0 + max(_text_px(t) for t in tick_labels) + pad
    # titles never run out of the picture: bold text is ~10 % wider, the 13 px title ~20 % more
    xlabel_px, ylabel_px = _text_px(hm.xlabel or "") * 1.1, _text_px(hm.ylabel or "") * 1.1
    xlabel_x = max(left + grid_w / 2, pad + xlabel_px / 2)
    width = max(width, xlabel_x + xlabel_px / 2 + pad, left + _text_px(hm.title) * 1.3 + pad)
    height = max(top + grid_h + col_label_h + xtitle_h, top + bar_h + font, top + ylabel_px) + pad
    return _HeatmapLayout(cell=cell, font=font, pad=pad, left=left, top=top, grid_w=grid_w, grid_h=grid_h,
                          col_label_h=col_label_h, bar_x=bar_x, bar_w=bar_w, bar_h=bar_h, xlabel_x=xlabel_x,
                          ylabel_y=top + max(grid_h, ylabel_px) / 2, width=width, height=height, ticks=ticks,
                          tick_labels=tick_labels)


def _svg_head(hm: _HeatmapData, lay: _HeatmapLayout) -> list[str]:
    """The ``<svg>`` element's opening, its title, the NaN hatch and the colour scale (an 11-stop
    gradient of ``cmap`` over [lo, hi]) as ``<defs>``, and the visible title."""
    lo, hi = hm.lo, hm.hi
    out = [f'<svg class="heatmap-svg" id="{hm.uid}" role="img" '
           f'aria-label="{_e(hm.title)}" width="{lay.width:.0f}" height="{lay.height:.0f}" '
           f'viewBox="0 0 {lay.width:.0f} {lay.height:.0f}" font-size="{lay.font}">',
           f"<title>{_e(hm.title)}</title>",
           f'<defs><pattern id="{hm.uid}-nan" width="6" height="6" patternUnits="userSpaceOnUse" '
           'patternTransform="rotate(45)"><rect width="6" height="6" fill="#d9d9d9"/>'
           '<line x1="0" y1="0" x2="0" y2="6" stroke="#8c8c8c" stroke-width="2"/></pattern>',
           f'<linearGradient id="{hm.uid}-bar" x1="0" y1="1" x2="0" y2="0">']
    for k in range(11):
        colour = _hex(_colours(np.array([lo + (hi - lo) * k / 10]), lo, hi, hm.cmap)[0])
        out.append(f'<stop offset="{k / 10:.1f}" stop-color="{colour}"/>')
    out.append("</linearGradient></defs>")
    if hm.title:
        out.append(f'<text class="hm-title" x="{lay.left:.1f}" y="18" font-size="13" font-weight="600">'
                   f"{_e(hm.title)}</text>")
    return out


def _cell(hm: _HeatmapData, cell: float, i: int, j: int, rgb: np.ndarray, fill: str, show_value: bool) -> str:
    """Cell (i, j): its rect with a "row × column: value" tooltip, then a dot when the value is not
    above its null threshold, else (when ``show_value`` and finite) the value printed on it."""
    v = hm.values[i, j]
    x, y = j * cell, i * cell
    finite = math.isfinite(v)
    fill = fill if finite else f"url(#{hm.uid}-nan)"
    tip = f"{hm.rows[i]} × {hm.cols[j]}: {format(v, hm.fmt) if finite else 'NaN (undefined)'}"
    below_null = False
    if hm.chance is not None and finite:
        below_null, tip = _chance_tip(hm, i, j, tip)
    elif hm.thresholds is not None and finite and math.isfinite(hm.thresholds[i, j]):
        below_null = v <= hm.thresholds[i, j]
        tip += f" (null p95 {format(hm.thresholds[i, j], hm.fmt)}{': not above null' if below_null else ''})"
    cls = "c" if finite else "c nan"
    markup = (f'<rect class="{cls}" x="{x:.1f}" y="{y:.1f}" width="{cell:.1f}" height="{cell:.1f}" '
              f'fill="{fill}"><title>{_e(tip)}</title></rect>')
    if below_null and show_value and finite:  # the value stays readable: the dot moves to the corner
        markup += (f'<circle class="null-mark" cx="{x + cell * 0.85:.1f}" cy="{y + cell * 0.15:.1f}" '
                   f'r="{max(1.5, cell * 0.07):.1f}" fill="{_ink(rgb)}" fill-opacity="0.75" '
                   'pointer-events="none"/>')
    elif below_null:
        markup += (f'<circle class="null-mark" cx="{x + cell / 2:.1f}" cy="{y + cell / 2:.1f}" '
                   f'r="{max(1.5, cell * 0.1):.1f}" fill="{_ink(rgb)}" fill-opacity="0.75" '
                   'pointer-events="none"/>')
    if show_value and finite:
        markup += (f'<text x="{x + cell / 2:.1f}" y="{y + cell / 2 + 3.5:.1f}" text-anchor="middle" '
                   f'font-size="9" fill="{_ink(rgb)}" pointer-events="none">{_e(format(v, hm.fmt))}</text>')
    return markup


def _chance_tip(hm: _HeatmapData, i: int, j: int, tip: str) -> tuple[bool, str]:
    """Whether cell (i, j) gets a dot (it does not beat chance), and its tooltip with the interval and
    the chance level."""
    marks = hm.chance
    assert marks is not None
    if marks.low is not None and marks.high is not None and math.isfinite(marks.low[i, j]):
        tip += f" [{format(marks.low[i, j], hm.fmt)}, {format(marks.high[i, j], hm.fmt)}]"
    level = marks.chance[i, j]
    if not math.isfinite(level):
        return False, tip + " (no chance level)"
    beats = bool(marks.beats[i, j])
    return not beats, tip + f" (chance {format(level, hm.fmt)}: {'beats chance' if beats else 'not beyond chance'})"


def _cells(hm: _HeatmapData, lay: _HeatmapLayout) -> list[str]:
    """The grid: every cell, row by row, each with its own tooltip, then the grid's frame."""
    n_rows, n_cols = hm.values.shape
    colours = _colours(hm.values.ravel(), hm.lo, hm.hi, hm.cmap).reshape(n_rows, n_cols, 3)
    fills = [[_hex(rgb) for rgb in row] for row in colours.tolist()]
    show_values = lay.cell >= 34 and _text_px(format(hm.hi, hm.fmt)) * 0.85 <= lay.cell - 4
    out = [f'<g class="cells" transform="translate({lay.left:.1f},{lay.top:.1f})">']
    out += [_cell(hm, lay.cell, i, j, colours[i, j], fills[i][j], show_values)
            for i in range(n_rows) for j in range(n_cols)]
    out.append(f'<rect x="0" y="0" width="{lay.grid_w:.1f}" height="{lay.grid_h:.1f}" fill="none" '
               'stroke="#667085" stroke-width="0.6" pointer-events="none"/></g>')
    return out


def _axis_labels(hm: _HeatmapData, lay: _HeatmapLayout) -> list[str]:
    """Row labels right-aligned against the grid, column labels rotated 45 degrees under it (each with
    its full name as a tooltip), and the axis titles."""
    cell, font, top = lay.cell, lay.font, lay.top
    out = [f'<g class="row-labels" text-anchor="end" transform="translate({lay.left - 5:.1f},{top:.1f})">']
    for i, (full, short) in enumerate(zip(hm.rows, hm.short_rows, strict=True)):
        out.append(f'<text x="0" y="{i * cell + cell / 2 + font * 0.35:.1f}"><title>{_e(full)}</title>'
                   f"{_e(short)}</text>")
    out.append("</g>")
    out.append(f'<g class="col-labels" text-anchor="end" '
               f'transform="translate({lay.left:.1f},{top + lay.grid_h + 6:.1f})">')
    for j, (full, short) in enumerate(zip(hm.cols, hm.short_cols, strict=True)):
        cx = j * cell + cell / 2 + font * 0.3
        out.append(f'<text transform="translate({cx:.1f},0) rotate(-45)" x="0" y="{font * 0.35:.1f}">'
                   f"<title>{_e(full)}</title>{_e(short)}</text>")
    out.append("</g>")
    if hm.xlabel:
        out.append(f'<text class="axis-title" x="{lay.xlabel_x:.1f}" y="{top + lay.grid_h + lay.col_label_h + 12:.1f}" '
                   f'text-anchor="middle" font-weight="600">{_e(hm.xlabel)}</text>')
    if hm.ylabel:
        out.append(f'<text class="axis-title" transform="translate({lay.pad + 10:.1f},{lay.ylabel_y:.1f}) '
                   f'rotate(-90)" text-anchor="middle" font-weight="600">{_e(hm.ylabel)}</text>')
    return out


def _colour_bar(hm: _HeatmapData, lay: _HeatmapLayout) -> list[str]:
    """The colour bar (the gradient of :func:`_svg_head`) with its round ticks, closing the ``<svg>``."""
    lo, hi, bar_w, bar_h = hm.lo, hm.hi, lay.bar_w, lay.bar_h
    out = [f'<g class="colorbar" transform="translate({lay.bar_x:.1f},{lay.top:.1f})">',
           f'<rect width="{bar_w:.0f}" height="{bar_h:.1f}" fill="url(#{hm.uid}-bar)" stroke="#667085" '
           'stroke-width="0.6"/>']
    for tick, label in zip(lay.ticks, lay.tick_labels, strict=True):
        y = bar_h - bar_h * ((tick - lo) / (hi - lo) if hi > lo else 0.5)
        out.append(f'<line x1="{bar_w:.0f}" x2="{bar_w + 3:.0f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#667085"/>'
                   f'<text x="{bar_w + 5:.0f}" y="{y + lay.font * 0.35:.1f}">{_e(label)}</text>')
    out.append("</g></svg>")
    return out


def _legend(hm: _HeatmapData) -> str:
    """The caption under the heatmap: what hatched cells and dots mean (empty when neither occurs)."""
    legend = []
    if np.isnan(hm.values).any():
        legend.append("hatched grey: undefined (NaN)")
    if hm.chance is not None:
        known = np.isfinite(hm.values) & np.isfinite(hm.chance.chance)
        marked = int(np.sum(known & ~hm.chance.beats.astype(bool)))
        legend.append(f"dot: not beyond chance, i.e. not {hm.chance.rule} ({marked} of {hm.values.size} cells)"
                      if marked else f"every value beats chance ({hm.chance.rule})")
    elif hm.thresholds is not None:
        marked = int(np.sum(hm.values <= hm.thresholds))  # NaN compares False on either side
        legend.append(f"dot: value not above the permutation null's 95th percentile ({marked} of {hm.values.size} cells)"
                      if marked else "every value is above the permutation null's 95th percentile")
    return f'<p class="muted hm-legend">{_e("; ".join(legend))}</p>' if legend else ""


def heatmap_svg(
    frame,
    *,
    title: str,
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str = "viridis",
    fmt: str = ".3f",
    null=None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    max_label_chars: int = _MAX_LABEL_CHARS,
    chance: ChanceMarks | None = None,
) -> Markup:
    """An inline SVG heatmap of ``frame`` (rows = ``frame.index``, columns = ``frame.columns``); the colour
    bar has round ticks (:func:`nice_ticks`).

    frame: (R, C) DataFrame of numbers; NaN cells are drawn hatched grey.
    vmin, vmax: colour range (default: the finite data's min and max).
    cmap: a colour-blind-safe map (:data:`simkit.plotting.CVD_SAFE_MAPS`: viridis, cividis, magma,
        inferno, plasma, or a ColorBrewer diverging map such as RdBu, or their ``_r``); a ValueError for
        any other.
    null: optional (R, C) DataFrame (same index/columns, reindexed if needed) of null thresholds, e.g.
        a permutation null's 95th percentile; cells whose value is not above it get a dot.
    chance: optional :class:`ChanceMarks` instead of ``null``: cells that do not beat their chance level
        get a dot, and the tooltip shows the chance level (and the interval, when given).
    xlabel, ylabel: axis titles (default: ``frame.columns.name`` and ``frame.index.name``).
    Labels longer than ``max_label_chars`` are shortened in the middle; the full name is in a
    ``<title>``. Each cell's tooltip reads "row × column: value". Returns markup safe to embed.
    """
    if cmap not in CVD_SAFE_MAPS:
        raise ValueError(f"heatmap colour map {cmap!r} is not colour-blind safe; use one of {sorted(CVD_SAFE_MAPS)}")
    hm = _heatmap_data(frame, title, vmin, vmax, cmap, fmt, null, xlabel, ylabel, max_label_chars, chance)
    _keep(title, lambda: heatmap_figure(hm))
    lay = _heatmap_layout(hm)
    out = _svg_head(hm, lay) + _cells(hm, lay) + _axis_labels(hm, lay) + _colour_bar(hm, lay)
    return Markup(f'<div class="heatmap">{"".join(out)}{_legend(hm)}</div>')


# ---------------------------------------------------------------------------------------------------
# the heatmap as a matplotlib figure (for figure files)

_FILE_CELL_IN = 0.42     # a heatmap file's cell edge at most, inches
_FILE_GRID_IN = (9.0, 8.0)   # the grid's largest width and height, inches
_LABEL_PITCH_PT = 11.0   # labels closer than this are thinned (every k-th), so 9 pt text never overlaps


def _label_ticks(count: int, cell_in: float) -> np.ndarray:
    """Positions of the labelled rows (or columns): every one, or every k-th when cells are too small."""
    every = max(1, math.ceil(_LABEL_PITCH_PT / (cell_in * 72.0)))
    return np.arange(0, count, every)


def _file_marks(ax, hm: _HeatmapData, rgba: np.ndarray) -> None:
    """Hatched grey NaN cells, dots on the cells that fail their null or chance level (as the SVG), and
    the values on grids of at most 12 × 12."""
    from matplotlib.patches import Rectangle

    values = hm.values
    finite = np.isfinite(values)
    for i, j in zip(*np.nonzero(~finite), strict=True):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#d9d9d9", edgecolor="#8c8c8c", hatch="///", lw=0))
    if hm.chance is not None:
        failed = finite & np.isfinite(hm.chance.chance) & ~hm.chance.beats.astype(bool)
    elif hm.thresholds is not None:
        failed = finite & (values <= hm.thresholds)
    else:
        failed = np.zeros_like(finite)
    annotate = max(values.shape) <= 12
    for i, j in zip(*np.nonzero(finite), strict=True):
        ink = _ink(rgba[i, j])
        if failed[i, j]:
            ax.plot(j + (0.33 if annotate else 0.0), i - (0.33 if annotate else 0.0), "o", ms=3, color=ink, alpha=0.75)
        if annotate:
            ax.text(j, i, format(values[i, j], hm.fmt), ha="center", va="center", fontsize=9, color=ink)


def heatmap_figure(hm: _HeatmapData):
    """``heatmap_svg``'s heatmap drawn with matplotlib for files: the same colour map and range, labels
    shortened, NaN hatched and null or chance failures dotted; a colour bar and the axis titles."""
    n_rows, n_cols = hm.values.shape
    cell = min(_FILE_CELL_IN, _FILE_GRID_IN[0] / max(n_cols, 1), _FILE_GRID_IN[1] / max(n_rows, 1))
    fig = agg_figure(1.8 + cell * n_cols, 1.2 + cell * n_rows)
    with figure_style():
        ax = fig.add_subplot(1, 1, 1)
        from matplotlib import colormaps

        cmap = colormaps[hm.cmap]
        image = ax.imshow(np.ma.masked_invalid(hm.values), cmap=cmap, vmin=hm.lo, vmax=hm.hi, aspect="equal",
                          interpolation="nearest")
        rgba = np.asarray(cmap(image.norm(np.nan_to_num(hm.values, nan=hm.lo))))
        _file_marks(ax, hm, rgba)
        rows, cols = _label_ticks(n_rows, cell), _label_ticks(n_cols, cell)
        ax.set_yticks(rows, [hm.short_rows[i] for i in rows], fontsize=9, parse_math=False)  # names: text
        ax.set_xticks(cols, [hm.short_cols[j] for j in cols], fontsize=9, rotation=45, ha="right",
                      rotation_mode="anchor", parse_math=False)
        ax.set_xlabel(hm.xlabel, parse_math=False)
        ax.set_ylabel(hm.ylabel, parse_math=False)
        ax.set_title(hm.title, fontsize=11)
        bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
        ticks, labels = nice_ticks(hm.lo, hm.hi)
        bar.set_ticks(ticks, labels=labels)
        bar.ax.tick_params(labelsize=9)
    return fig
