"""Figure helpers shared by every report: inline images and SVG heatmaps, never files on the side.

- ``new_figure`` / ``img``: a matplotlib figure drawn on an explicit canvas, embedded as a PNG data URI.
- ``line_plot`` / ``bar_plot``: the two matplotlib charts most reports need, as ready ``<img>`` markup.
- ``html_table``: a DataFrame as an escaped HTML table, quick for tens of thousands of rows.
- ``heatmap_svg``: a hand-built inline SVG heatmap (no JavaScript) with readable labels on both axes,
  a ``<title>`` tooltip on every cell, a colour bar, hatched NaN cells and optional null marks.

Every string that reaches the markup goes through :func:`markupsafe.escape`.
"""

from __future__ import annotations

import base64
import hashlib
import io
import math
from collections.abc import Mapping, Sequence

import numpy as np
from markupsafe import Markup, escape


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
        ax.set_xticklabels([shorten(str(v), 24) for v in x[::every]], rotation=60, ha="right", fontsize=7)
    if logy:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1 or bands:
        ax.legend(fontsize=7, frameon=False, loc="best")
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
                       ha="right" if len(labels) > 6 else "center", fontsize=7)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:  # outside the axes, so it never hides a bar
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
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


def shorten(text: str, max_chars: int = _MAX_LABEL_CHARS) -> str:
    """``text`` cut in the middle with '…' to at most ``max_chars`` characters (the tail says more)."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 3
    tail = max_chars - head - 1
    return text[:head] + "…" + text[-tail:]


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
) -> Markup:
    """An inline SVG heatmap of ``frame`` (rows = ``frame.index``, columns = ``frame.columns``); the colour
    bar has round ticks (:func:`nice_ticks`).

    frame: (R, C) DataFrame of numbers; NaN cells are drawn hatched grey.
    vmin, vmax: colour range (default: the finite data's min and max).
    null: optional (R, C) DataFrame (same index/columns, reindexed if needed) of null thresholds, e.g.
        a permutation null's 95th percentile; cells whose value is not above it get a dot.
    xlabel, ylabel: axis titles (default: ``frame.columns.name`` and ``frame.index.name``).
    Labels longer than ``max_label_chars`` are shortened in the middle; the full name is in a
    ``<title>``. Each cell's tooltip reads "row × column: value". Returns markup safe to embed.
    """
    values = frame.to_numpy(dtype=float, na_value=np.nan)
    rows = [str(v) for v in frame.index]
    cols = [str(v) for v in frame.columns]
    n_rows, n_cols = values.shape
    xlabel = str(frame.columns.name or "") if xlabel is None else xlabel
    ylabel = str(frame.index.name or "") if ylabel is None else ylabel
    thresholds = None
    if null is not None:
        thresholds = null.reindex(index=frame.index, columns=frame.columns).to_numpy(
            dtype=float, na_value=np.nan)
    lo, hi = _range(values, vmin, vmax)

    digest = hashlib.sha1(repr((title, rows, cols)).encode() + values.tobytes()).hexdigest()[:10]
    uid = f"hm{digest}"

    cell = float(max(14, min(40, 760 // max(n_cols, 1), 600 // max(n_rows, 1))))
    font = _FONT_PX if cell >= 16 else 10
    short_rows = [shorten(r, max_label_chars) for r in rows]
    short_cols = [shorten(c, max_label_chars) for c in cols]
    row_label_px = max((_text_px(r) for r in short_rows), default=0.0)
    col_label_px = max((_text_px(c) for c in short_cols), default=0.0)
    pad = 8.0
    ytitle_px = 18.0 if ylabel else 0.0
    # Column labels hang down-left at 45 degrees from under each column's centre.
    overhang = max((_text_px(c) * _COS45 - (j + 0.5) * cell for j, c in enumerate(short_cols)), default=0.0)
    left = pad + ytitle_px + max(row_label_px + 6.0, overhang)
    top = 30.0 if title else pad
    grid_w, grid_h = n_cols * cell, n_rows * cell
    col_label_h = col_label_px * _COS45 + font + 8.0
    xtitle_h = 20.0 if xlabel else 0.0
    bar_x = left + grid_w + 18.0
    bar_w = 14.0
    bar_h = max(grid_h, 120.0)
    ticks, tick_labels = nice_ticks(lo, hi)
    width = bar_x + bar_w + 6.0 + max(_text_px(t) for t in tick_labels) + pad
    # titles never run out of the picture: bold text is ~10 % wider, the 13 px title ~20 % more
    xlabel_px, ylabel_px = _text_px(xlabel or "") * 1.1, _text_px(ylabel or "") * 1.1
    xlabel_x = max(left + grid_w / 2, pad + xlabel_px / 2)
    ylabel_y = top + max(grid_h, ylabel_px) / 2
    width = max(width, xlabel_x + xlabel_px / 2 + pad, left + _text_px(title) * 1.3 + pad)
    height = max(top + grid_h + col_label_h + xtitle_h, top + bar_h + font, top + ylabel_px) + pad

    colours = _colours(values.ravel(), lo, hi, cmap).reshape(n_rows, n_cols, 3)
    fills = [[_hex(rgb) for rgb in row] for row in colours.tolist()]
    show_values = cell >= 34 and _text_px(format(hi, fmt)) * 0.85 <= cell - 4

    def e(text) -> str:
        return str(escape(str(text)))

    out: list[str] = []
    add = out.append
    add(f'<svg class="heatmap-svg" id="{uid}" role="img" '
        f'aria-label="{e(title)}" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-size="{font}">')
    add(f"<title>{e(title)}</title>")
    add(f'<defs><pattern id="{uid}-nan" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#d9d9d9"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#8c8c8c" stroke-width="2"/></pattern>')
    add(f'<linearGradient id="{uid}-bar" x1="0" y1="1" x2="0" y2="0">')
    for k in range(11):
        add(f'<stop offset="{k / 10:.1f}" stop-color="{_hex(_colours(np.array([lo + (hi - lo) * k / 10]), lo, hi, cmap)[0])}"/>')
    add("</linearGradient></defs>")
    if title:
        add(f'<text class="hm-title" x="{left:.1f}" y="18" font-size="13" font-weight="600">{e(title)}</text>')

    # Cells, row by row; each carries its own tooltip.
    add(f'<g class="cells" transform="translate({left:.1f},{top:.1f})">')
    for i in range(n_rows):
        for j in range(n_cols):
            v = values[i, j]
            x, y = j * cell, i * cell
            finite = math.isfinite(v)
            fill = fills[i][j] if finite else f"url(#{uid}-nan)"
            tip = f"{rows[i]} × {cols[j]}: {format(v, fmt) if finite else 'NaN (undefined)'}"
            below_null = False
            if thresholds is not None and finite and math.isfinite(thresholds[i, j]):
                below_null = v <= thresholds[i, j]
                tip += f" (null p95 {format(thresholds[i, j], fmt)}{': not above null' if below_null else ''})"
            cls = "c" if finite else "c nan"
            add(f'<rect class="{cls}" x="{x:.1f}" y="{y:.1f}" width="{cell:.1f}" height="{cell:.1f}" '
                f'fill="{fill}"><title>{e(tip)}</title></rect>')
            if below_null:
                add(f'<circle class="null-mark" cx="{x + cell / 2:.1f}" cy="{y + cell / 2:.1f}" '
                    f'r="{max(1.5, cell * 0.1):.1f}" fill="{_ink(colours[i, j])}" fill-opacity="0.75" '
                    'pointer-events="none"/>')
            elif show_values and finite:
                add(f'<text x="{x + cell / 2:.1f}" y="{y + cell / 2 + 3.5:.1f}" text-anchor="middle" '
                    f'font-size="9" fill="{_ink(colours[i, j])}" pointer-events="none">{e(format(v, fmt))}</text>')
    add(f'<rect x="0" y="0" width="{grid_w:.1f}" height="{grid_h:.1f}" fill="none" stroke="#667085" '
        'stroke-width="0.6" pointer-events="none"/></g>')

    # Row labels, right-aligned against the grid.
    add(f'<g class="row-labels" text-anchor="end" transform="translate({left - 5:.1f},{top:.1f})">')
    for i, (full, short) in enumerate(zip(rows, short_rows, strict=True)):
        add(f'<text x="0" y="{i * cell + cell / 2 + font * 0.35:.1f}"><title>{e(full)}</title>{e(short)}</text>')
    add("</g>")
    # Column labels, rotated 45 degrees under the grid.
    add(f'<g class="col-labels" text-anchor="end" transform="translate({left:.1f},{top + grid_h + 6:.1f})">')
    for j, (full, short) in enumerate(zip(cols, short_cols, strict=True)):
        cx = j * cell + cell / 2 + font * 0.3
        add(f'<text transform="translate({cx:.1f},0) rotate(-45)" x="0" y="{font * 0.35:.1f}">'
            f"<title>{e(full)}</title>{e(short)}</text>")
    add("</g>")
    if xlabel:
        add(f'<text class="axis-title" x="{xlabel_x:.1f}" y="{top + grid_h + col_label_h + 12:.1f}" '
            f'text-anchor="middle" font-weight="600">{e(xlabel)}</text>')
    if ylabel:
        add(f'<text class="axis-title" transform="translate({pad + 10:.1f},{ylabel_y:.1f}) rotate(-90)" '
            f'text-anchor="middle" font-weight="600">{e(ylabel)}</text>')

    # Colour bar with five ticks.
    add(f'<g class="colorbar" transform="translate({bar_x:.1f},{top:.1f})">')
    add(f'<rect width="{bar_w:.0f}" height="{bar_h:.1f}" fill="url(#{uid}-bar)" stroke="#667085" stroke-width="0.6"/>')
    for tick, label in zip(ticks, tick_labels, strict=True):
        y = bar_h - bar_h * ((tick - lo) / (hi - lo) if hi > lo else 0.5)
        add(f'<line x1="{bar_w:.0f}" x2="{bar_w + 3:.0f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#667085"/>'
            f'<text x="{bar_w + 5:.0f}" y="{y + font * 0.35:.1f}">{e(label)}</text>')
    add("</g></svg>")

    legend = []
    if np.isnan(values).any():
        legend.append("hatched grey: undefined (NaN)")
    if thresholds is not None:
        marked = int(np.sum(values <= thresholds))  # NaN compares False on either side
        legend.append(f"dot: value not above the permutation null's 95th percentile ({marked} of {values.size} cells)"
                      if marked else "every value is above the permutation null's 95th percentile")
    caption = f'<p class="muted hm-legend">{e("; ".join(legend))}</p>' if legend else ""
    return Markup(f'<div class="heatmap">{"".join(out)}{caption}</div>')
