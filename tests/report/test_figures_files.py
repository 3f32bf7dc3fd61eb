"""Figures as files (`simkit report DIR --figures`, `result.savefig`), figures that leave the user's
matplotlib alone, colour-blind-safe colours, readable vector text, and the small report items of issue
#26 (a cache given to `simkit report`, stitch's settings table)."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import simkit
import simkit.cli.main  # noqa: F401  (registers every command on the app)
from simkit.cli.common import app
from simkit.errors import SimkitError
from simkit.plotting import CVD_SAFE_MAPS, MIN_FONT_PT, PALETTE, parse_formats, shorten
from simkit.report import render_html
from simkit.report.figures import collect_figures, heatmap_svg, line_plot, plain_text
from tests.report.test_report import make_compare, make_study

KINDS = ["compare", "study", "convert", "stitch", "linearize", "graft", "trend"]
SVG = "{http://www.w3.org/2000/svg}"


def report_figure_count(html: str) -> int:
    """The figures a report shows: its inline images, its SVG heatmaps and its other SVG figures."""
    return sum(html.count(mark) for mark in ('<img class="figure"', 'class="heatmap-svg"', 'class="view-svg"'))


def svg_font_sizes(path: Path) -> list[float]:
    """The font size (pt: matplotlib's SVG unit) of every ``<text>`` of an SVG written with svg.fonttype
    'none'; math text (a log axis' ``4×10⁻¹``) is a ``<text>`` of ``<tspan>``s: its base size, the largest
    (exponents are smaller by typesetting convention)."""
    def size(element) -> float | None:
        match = re.search(r"font-size:\s*([\d.]+)px", element.get("style", ""))
        return float(match.group(1)) if match else None

    sizes = []
    for text in ET.parse(path).getroot().iter(f"{SVG}text"):
        own = size(text)
        parts = [s for s in map(size, text.iter(f"{SVG}tspan")) if s is not None]
        assert own is not None or parts, ET.tostring(text)[:200]
        sizes.append(own if own is not None else max(parts))
    return sizes


def rc_snapshot() -> dict[str, str]:
    """Every rc setting but the backend, as text (compared before and after)."""
    return {key: repr(matplotlib.rcParams[key]) for key in matplotlib.rcParams if key != "backend"}


def pyplot_figures() -> int:
    """How many figures pyplot manages now."""
    from matplotlib._pylab_helpers import Gcf

    return len(Gcf.get_all_fig_managers())


# --------------------------------------------------------------------------------------------------
# simkit report DIR --figures, every kind


@pytest.mark.parametrize("kind", KINDS)
def test_report_writes_every_figure_of_every_kind_as_files(real_runs, kind, tmp_path):
    run = tmp_path / kind                          # the session's runs stay as their commands wrote them
    shutil.copytree(real_runs[kind], run)
    outcome = CliRunner().invoke(app, ["report", str(run), "--figures", "png,pdf,svg"])
    assert outcome.exit_code == 0, outcome.output
    shown = report_figure_count((run / "report.html").read_text(encoding="utf-8"))
    files = sorted((run / "figures").iterdir())
    stems = sorted({f.stem for f in files})
    assert shown >= 1 and len(stems) == shown, (shown, stems)     # each figure the report shows, once
    assert sorted(f.name for f in files) == sorted(f"{s}.{ext}" for s in stems for ext in ("png", "pdf", "svg"))
    for stem in stems:
        folder = run / "figures"
        assert (folder / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pdf = (folder / f"{stem}.pdf").read_bytes()
        assert pdf[:5] == b"%PDF-" and b"/Type3" not in pdf          # pdf.fonttype 42: TrueType, not Type 3
        sizes = svg_font_sizes(folder / f"{stem}.svg")
        assert sizes and min(sizes) >= MIN_FONT_PT, (stem, sorted(set(sizes)))   # text stays text, >= 9 pt
    assert f"figure files (png, pdf, svg) to {run / 'figures'}" in outcome.output.replace("\n", "")


def test_report_figures_format_subset_and_pdf_embeds_truetype(real_runs, tmp_path):
    result = simkit.load(real_runs["compare"])
    paths = result.savefig(tmp_path / "figs", formats="pdf")
    assert paths and all(p.suffix == ".pdf" for p in paths)
    assert all(b"/FontFile2" in p.read_bytes() for p in paths)


def test_report_with_a_bad_format_is_one_line_exit_2_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    make_compare(2, 3).save(run)
    outcome = CliRunner().invoke(app, ["report", str(run), "--figures", "png,gif"])
    assert outcome.exit_code == 2
    lines = outcome.output.strip().splitlines()
    assert len(lines) == 1 and "--figures" in lines[0] and "'gif'" in lines[0] and "png,pdf,svg" in lines[0]
    assert not (run / "report.html").exists() and not (run / "figures").exists()


def test_report_on_a_cache_says_it_is_a_cache_and_how_to_use_it(real_runs):
    cache = real_runs["study"].parent / "cache0"
    assert (cache / "manifest.json").is_file()
    outcome = CliRunner().invoke(app, ["report", str(cache)])
    assert outcome.exit_code == 2
    lines = outcome.output.strip().splitlines()
    assert len(lines) == 1, lines
    assert "activation cache" in lines[0] and f"simkit compare {cache} OTHER_CACHE --out RUN" in lines[0]
    assert "simkit report RUN" in lines[0] and "not a simkit run directory" not in lines[0]


# --------------------------------------------------------------------------------------------------
# result.savefig


def test_savefig_folder_names_follow_the_report(tmp_path):
    result = make_compare(3, 4, null=True)
    names = list(result.figures())
    assert names[:2] == ["linear_cka", "unbiased_cka"] and len(names) == len(set(names))
    written = result.savefig(tmp_path / "figs", formats=["svg", "png"])
    assert sorted(p.name for p in written) == sorted(f"{n}.{e}" for n in names for e in ("svg", "png"))


def test_savefig_one_file_takes_its_format_from_the_suffix(tmp_path):
    result = make_study(null=True)
    (path,) = result.savefig(tmp_path / "paper" / "study.pdf")
    assert path == tmp_path / "paper" / "study.pdf" and path.read_bytes()[:5] == b"%PDF-"
    assert sorted(p.name for p in (tmp_path / "paper").iterdir()) == ["study.pdf"]   # no temporary left over
    name = list(result.figures())[1]
    (other,) = result.savefig(tmp_path / "second.svg", name=name)
    assert other.read_text(encoding="utf-8").lstrip().startswith("<?xml")


@pytest.mark.parametrize("call, message", [
    (lambda r, p: r.savefig(p / "figs", formats="png,jpeg"), "'jpeg'"),
    (lambda r, p: r.savefig(p / "one.png", formats="pdf"), "drop `formats`"),
    (lambda r, p: r.savefig(p / "figs", name="nope"), "its figures: linear_cka"),
])
def test_savefig_refuses_bad_arguments_naming_them(tmp_path, call, message):
    with pytest.raises(SimkitError, match=re.escape(message)):
        call(make_compare(2, 2), tmp_path)
    assert not (tmp_path / "figs").exists()


def test_parse_formats_keeps_order_and_drops_repeats():
    assert parse_formats(" SVG, png,.pdf,svg ") == ("svg", "png", "pdf")
    with pytest.raises(SimkitError, match="got none"):
        parse_formats(",")


# --------------------------------------------------------------------------------------------------
# the user's matplotlib is left alone


def test_reports_figures_and_plot_leave_rc_params_backend_and_pyplot_alone(tmp_path):
    backend = matplotlib.get_backend()
    before, figures_before = rc_snapshot(), pyplot_figures()
    result = make_compare(3, 4, null=True)
    render_html(result)
    result._repr_html_()
    result.savefig(tmp_path / "figs")
    fig = result.plot("unbiased_cka")
    assert rc_snapshot() == before
    assert matplotlib.get_backend() == backend and pyplot_figures() == figures_before
    assert type(fig.canvas).__name__ == "FigureCanvasAgg"
    assert fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"          # shows inline as a cell's value
    fig.savefig(tmp_path / "plot.png")                           # and saves in a script


def test_plot_shortens_long_layer_names():
    result = make_compare(3, 3)
    long_name = result.matrix("linear_cka").index[0]
    ax = result.plot("linear_cka").axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == shorten(long_name) != long_name


# --------------------------------------------------------------------------------------------------
# colours and names


def test_heatmaps_take_colour_blind_safe_maps_only():
    frame = pd.DataFrame(np.eye(2), index=["a", "b"], columns=["c", "d"])
    with pytest.raises(ValueError, match="colour-blind"):
        heatmap_svg(frame, title="t", cmap="jet")
    for cmap in ("viridis", "cividis", "magma_r"):
        assert cmap in CVD_SAFE_MAPS
        _, kept = collect_figures(lambda cmap=cmap: heatmap_svg(frame, title="t", cmap=cmap))
        image = kept["t"]().axes[0].images[0]
        assert image.get_cmap().name == cmap


def test_lines_take_the_okabe_ito_palette_and_the_default_cycle_is_untouched():
    default = matplotlib.rcParams["axes.prop_cycle"]
    _, kept = collect_figures(lambda: line_plot([1, 2, 3], {"x": [1, 2, 3], "y": [3, 2, 1], "z": [2, 2, 2]},
                                                title="three lines"))
    colours = [line.get_color().lower() for line in kept["three-lines"]().axes[0].lines]
    assert colours == [c.lower() for c in PALETTE[:3]]
    assert matplotlib.rcParams["axes.prop_cycle"] == default


def test_heatmap_file_shortens_names_that_the_html_keeps_whole_on_hover():
    rows = ["encoder.layers.0.self_attention.out_proj.weight_view", "fc"]
    frame = pd.DataFrame([[0.1, 0.2], [0.3, 0.4]], index=rows, columns=["c1", "c2"])
    svg, kept = collect_figures(lambda: heatmap_svg(frame, title="long names"))
    assert f"<title>{rows[0]}</title>" in str(svg)                  # the full name on hover in the report
    ax = kept["long-names"]().axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [shorten(rows[0]), "fc"]


def test_figure_names_are_unique_slugs():
    _, kept = collect_figures(lambda: [line_plot([1, 2], {"a": [1, 2]}, title="CKA (mean of seeds)")
                                       for _ in range(3)])
    assert list(kept) == ["cka-mean-of-seeds", "cka-mean-of-seeds-2", "cka-mean-of-seeds-3"]


# --------------------------------------------------------------------------------------------------
# stitch's settings table


def test_plain_text_reads_as_key_value():
    assert plain_text({"steps": 200, "lr": 0.001, "opt": {"name": "adam", "betas": [0.9, 0.99]}}) == \
        "steps=200, lr=0.001, opt=(name=adam, betas=(0.9, 0.99))"
    assert plain_text([1, "a"]) == "1, a" and plain_text(None) == "—" and plain_text(True) == "yes"


def test_stitch_settings_table_has_no_raw_dicts(real_runs):
    html = render_html(simkit.load(real_runs["stitch"]))
    table = html[html.index('<table class="settings">'):]
    table = table[:table.index("</table>")]
    cells = re.findall(r"<td><code>(.*?)</code></td>", table, re.S)
    assert cells and not any(c.lstrip().startswith(("{", "[", "(")) or "&#39;" in c for c in cells), cells
    assert any("=" in c for c in cells)   # the IRI generation and training settings as key=value
