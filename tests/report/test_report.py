"""The report layer: SVG heatmaps, compare/study report pages, escaping, offline output, `simkit report`.

Every result here is hand-made (no model runs); expected values come from numpy on the raw rows.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import simkit
import simkit.cli.main  # noqa: F401  (registers every command on the app)
from simkit.cli.common import app
from simkit.provenance import run_meta
from simkit.report import REPORT_KINDS, environment, render_html
from simkit.report import compare as compare_report
from simkit.report.figures import bar_plot, heatmap_svg, html_table, line_plot, shorten
from simkit.results import RESULT_KINDS, CompareResult, StudyResult

EVIL = "<script>alert(1)</script>"
QUOTED = "q\"uo'te&amp;<b>"


def layer_names(count: int, prefix: str) -> list[str]:
    names = [f"{prefix}.stage{i // 4}.block{i % 4}.conv" for i in range(count)]
    names[0] = "encoder.layers.0.self_attention.out_proj.weight_view"  # longer than any label budget
    return names


def make_compare(la: int = 4, lb: int = 5, metrics=("linear_cka", "unbiased_cka"), null: bool = False,
                 names_a: list[str] | None = None, names_b: list[str] | None = None,
                 nan_cell: tuple[int, int] | None = None, seed: int = 0) -> CompareResult:
    """A CompareResult with random values in [0, 1] laid out exactly as the engine's contract says."""
    rng = np.random.default_rng(seed)
    names_a = names_a or layer_names(la, "a")
    names_b = names_b or layer_names(lb, "b")
    rows = []
    for metric in metrics:
        for i, layer_a in enumerate(names_a):
            for j, layer_b in enumerate(names_b):
                value = float("nan") if nan_cell == (i, j) else float(rng.random())
                row = {"layer_a": layer_a, "layer_b": layer_b, "metric": metric, "value": value}
                if null:
                    row["null_mean"] = float(rng.uniform(0.0, 0.1))
                    row["null_p95"] = float(rng.uniform(0.2, 0.6))
                rows.append(row)
    layers = pd.DataFrame(
        [{"model": "a", "name": n, "type": "Conv2d", "shape": "64x16x16", "reduction": "flatten", "dim": 16384}
         for n in names_a]
        + [{"model": "b", "name": n, "type": "Linear", "shape": "10", "reduction": "flatten", "dim": 10}
           for n in names_b])
    summary = {"model_a": "simkit:cnn1d", "model_b": "simkit:cnn1d:channels=16", "data": "mnist1d", "n": 256,
               "mode": "exact", "metrics": list(metrics), "n_layers_a": len(names_a),
               "n_layers_b": len(names_b), "batch_size": 64, "seconds": 1.25}
    return CompareResult(summary=summary, tables={"similarity": pd.DataFrame(rows), "layers": layers},
                         meta=run_meta(settings={"null": 8 if null else 0, "seed": seed}))


def svg_root(markup) -> ET.Element:
    """The heatmap's <svg> element (the helper emits well-formed XML)."""
    return ET.fromstring(str(markup)).find("svg")


def cell_rects(svg: ET.Element) -> list[ET.Element]:
    return [r for r in svg.iter("rect") if "c" in r.get("class", "").split()]


# --------------------------------------------------------------------------------------------------
# heatmap_svg


def test_heatmap_20x30_has_every_label_and_tooltip():
    rows, cols = layer_names(20, "resnet18"), layer_names(30, "resnet34")
    values = np.random.default_rng(1).random((20, 30))
    frame = pd.DataFrame(values, index=rows, columns=cols)
    svg = svg_root(heatmap_svg(frame, title="linear_cka"))
    row_labels = svg.find("g[@class='row-labels']").findall("text")
    col_labels = svg.find("g[@class='col-labels']").findall("text")
    assert [t.find("title").text for t in row_labels] == rows
    assert [t.find("title").text for t in col_labels] == cols
    assert all("rotate(-45)" in t.get("transform") for t in col_labels)
    # The long first name is shortened on screen but complete in its <title>.
    assert row_labels[0].find("title").tail == shorten(rows[0]) != rows[0]
    assert row_labels[1].find("title").tail == rows[1]
    cells = cell_rects(svg)
    assert len(cells) == 600
    tips = [c.find("title").text for c in cells]
    expected = [f"{a} × {b}: {values[i, j]:.3f}" for i, a in enumerate(rows) for j, b in enumerate(cols)]
    assert tips == expected
    # Labels fit: the SVG is wide enough for the grid plus the labels and the colour bar.
    grid = svg.find("g[@class='cells']")
    left = float(re.match(r"translate\(([\d.]+),", grid.get("transform")).group(1))
    assert left >= max(len(shorten(r)) for r in rows) * 6
    assert float(svg.get("width")) > left + 30 * float(cells[0].get("width"))


def test_heatmap_colours_follow_values_and_range():
    frame = pd.DataFrame([[0.0, 0.5], [1.0, 0.25]], index=["r0", "r1"], columns=["c0", "c1"])
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    svg = svg_root(heatmap_svg(frame, title="t", vmin=0.0, vmax=1.0, cmap="magma"))
    fills = [c.get("fill") for c in cell_rects(svg)]
    expected = [to_hex(colormaps["magma"](v)) for v in (0.0, 0.5, 1.0, 0.25)]
    assert fills == expected
    ticks = [t.text for t in svg.find("g[@class='colorbar']").findall("text")]
    assert ticks == ["0.00", "0.25", "0.50", "0.75", "1.00"]
    # Default range = the data's finite min and max.
    ticks = [t.text for t in svg_root(heatmap_svg(frame * 2 + 1, title="t", fmt=".1f"))
             .find("g[@class='colorbar']").findall("text")]
    assert ticks == ["1.0", "1.5", "2.0", "2.5", "3.0"]


def test_heatmap_nan_cells_are_hatched():
    frame = pd.DataFrame([[0.1, np.nan], [0.3, 0.4]], index=["a", "b"], columns=["x", "y"])
    markup = heatmap_svg(frame, title="with nan")
    svg = svg_root(markup)
    cells = cell_rects(svg)
    assert cells[1].get("class") == "c nan"
    assert cells[1].get("fill") == f"url(#{svg.get('id')}-nan)"
    assert svg.find(f".//pattern[@id='{svg.get('id')}-nan']") is not None
    assert cells[1].find("title").text == "a × y: NaN (undefined)"
    assert all(c.get("fill").startswith("#") for i, c in enumerate(cells) if i != 1)
    assert "hatched grey" in str(markup)


def test_heatmap_all_nan_and_constant_frames_render():
    nan = pd.DataFrame(np.full((2, 3), np.nan), index=["a", "b"], columns=["x", "y", "z"])
    assert len(cell_rects(svg_root(heatmap_svg(nan, title="empty")))) == 6
    flat = pd.DataFrame(np.full((2, 2), 0.7), index=["a", "b"], columns=["x", "y"])
    fills = {c.get("fill") for c in cell_rects(svg_root(heatmap_svg(flat, title="flat")))}
    assert len(fills) == 1


def test_heatmap_marks_cells_not_above_the_null():
    rng = np.random.default_rng(3)
    values, p95 = rng.random((6, 7)), rng.random((6, 7))
    index, columns = [f"r{i}" for i in range(6)], [f"c{j}" for j in range(7)]
    frame = pd.DataFrame(values, index=index, columns=columns)
    null = pd.DataFrame(p95, index=index, columns=columns).iloc[::-1, ::-1]  # reordered: must be aligned
    svg = svg_root(heatmap_svg(frame, title="t", null=null))
    assert len(svg.findall(".//circle[@class='null-mark']")) == int((values <= p95).sum())
    tips = [c.find("title").text for c in cell_rects(svg)]
    flagged = [t.endswith(": not above null)") for t in tips]
    assert flagged == list((values <= p95).ravel())


def test_heatmap_escapes_names_and_title():
    frame = pd.DataFrame([[0.5, 0.6]], index=[EVIL], columns=[QUOTED, "plain"])
    markup = str(heatmap_svg(frame, title=f"title {EVIL}", xlabel=QUOTED, ylabel=EVIL))
    assert "<script" not in markup and "<b>" not in markup
    assert "&lt;script&gt;" in markup
    svg = svg_root(markup)  # parses: nothing unescaped broke the markup
    assert svg.get("aria-label") == f"title {EVIL}"
    assert svg.find("g[@class='row-labels']/text/title").text == EVIL
    assert cell_rects(svg)[0].find("title").text == f"{EVIL} × {QUOTED}: 0.500"


def test_heatmap_ids_differ_between_heatmaps():
    a = pd.DataFrame([[0.1]], index=["x"], columns=["y"])
    assert svg_root(heatmap_svg(a, title="one")).get("id") != svg_root(heatmap_svg(a, title="two")).get("id")


@given(st.text(min_size=0, max_size=80), st.integers(min_value=5, max_value=40))
def test_shorten_keeps_ends_within_budget(text, budget):
    short = shorten(text, budget)
    assert len(short) <= budget
    if len(text) <= budget:
        assert short == text
        return
    assert len(short) == budget
    splits = [(short[:i], short[i + 1:]) for i, ch in enumerate(short) if ch == "…"]
    assert any(head and tail and text.startswith(head) and text.endswith(tail) and len(tail) >= len(head)
               for head, tail in splits)


def test_line_and_bar_plots_are_inline_images():
    for markup in (line_plot(["a", "b", "c"], {"s": [1, 2, 3]}, title="lines", bands={"s": ([0, 0, 0], [1, 1, 1])}),
                   line_plot([1, 2, 3], {"s": [1, 2, 3], "t": [3, 2, 1]}, title="numeric", logy=True),
                   bar_plot(["a", "b"], {"x": [1, 2], "y": [2, 1]}, title="<bars>")):
        text = str(markup)
        assert text.startswith('<img class="figure" src="data:image/png;base64,')
    assert 'alt="&lt;bars&gt;"' in text


def test_html_table_escapes_formats_and_aligns():
    frame = pd.DataFrame({"name": [EVIL, "b"], "value": [1 / 3, float("nan")], "dim": [np.int64(7), 8]})
    table = ET.fromstring(str(html_table(frame, numeric=["value"], css_class="t")))
    assert table.get("class") == "t"
    assert [th.text for th in table.iter("th")] == ["name", "value", "dim"]
    rows = [[(td.text, td.get("class")) for td in tr.iter("td")] for tr in table.find("tbody")]
    assert rows == [[(EVIL, None), ("0.3333", "num"), ("7", None)], [("b", None), ("n/a", "num"), ("8", None)]]
    assert "<script" not in str(html_table(frame))


# --------------------------------------------------------------------------------------------------
# compare report


def test_best_matches_are_the_row_maxima():
    result = make_compare(5, 7, null=True, nan_cell=(2, 3))
    context = compare_report.context(result)
    table = result.tables["similarity"]
    for k, metric in enumerate(result.summary["metrics"]):
        rows = table[table["metric"] == metric]
        for row in context["best"]:
            mine = rows[rows["layer_a"] == row["layer_a"]]
            j = int(np.nanargmax(mine["value"].to_numpy()))
            cell = row["cells"][k]
            assert cell["layer_b"] == mine["layer_b"].iloc[j]
            assert cell["value"] == mine["value"].iloc[j]
            assert cell["null_p95"] == mine["null_p95"].iloc[j]
            assert cell["above_null"] == (mine["value"].iloc[j] > mine["null_p95"].iloc[j])
    band = context["null_band"]
    assert [b["metric"] for b in band] == ["linear_cka", "unbiased_cka"]
    lin = table[table["metric"] == "linear_cka"]
    assert band[0]["above"] == int((lin["value"] > lin["null_p95"]).sum())
    assert band[0]["null_p95_max"] == lin["null_p95"].max()
    assert math.isclose(band[0]["null_mean"], lin["null_mean"].mean())


def test_best_match_of_an_all_nan_row_is_na():
    result = make_compare(2, 1, metrics=("linear_cka",), nan_cell=(1, 0))
    best = compare_report.context(result)["best"]
    assert best[1]["cells"][0]["layer_b"] == "n/a"


def test_compare_report_shows_every_part():
    result = make_compare(4, 5, metrics=("linear_cka", "unbiased_cka", "mutual_knn"), null=True)
    html = render_html(result)
    assert html.count('class="heatmap-svg"') == 3
    for section in ("Run summary", "Best match in B for each layer of A", "Permutation null", "Layers",
                    "All values", "How this run was made"):
        assert f">{section}<" in html
    values = ET.fromstring(re.search(r'<table class="values">.*?</table>', html, re.S).group(0))
    assert len(values.find("tbody")) == len(result.tables["similarity"]) == 3 * 4 * 5
    assert "simkit:cnn1d:channels=16" in html and "64x16x16" in html


def test_compare_report_without_null_has_no_null_parts():
    html = render_html(make_compare(3, 3))
    assert "Permutation null" not in html and "null p95" not in html and "null-mark" not in html


def test_compare_report_escapes_everything():
    result = make_compare(names_a=[EVIL, "ok"], names_b=[QUOTED, "fine"], null=True)
    result.summary["model_a"] = f"python:{EVIL}"
    result.summary["data"] = QUOTED
    result.meta["note"] = {"nested": EVIL}
    html = render_html(result)
    assert "<script" not in html.lower()
    assert "<b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "q&#34;uo&#39;te&amp;amp;&lt;b&gt;" in html


def test_compare_report_is_offline():
    html = render_html(make_compare(3, 4, null=True))
    assert "http://" not in html and "https://" not in html
    links = re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', html)
    assert links and all(v.startswith(("data:image/png;base64,", "#")) for v in links)
    assert set(re.findall(r"url\(([^)]*)\)", html)) <= {f"#{i}" for i in re.findall(r'id="([^"]+)"', html)}
    assert "default-src 'none'" in html  # the browser itself refuses any outside load


def test_compare_report_large_model_pair_renders_all_labels():
    result = make_compare(20, 30, metrics=("linear_cka",))
    html = render_html(result)
    for name in layer_names(20, "a") + layer_names(30, "b"):
        assert f"<title>{name}</title>" in html


def test_report_from_saved_files_matches_the_live_result(tmp_path):
    result = make_compare(3, 4, null=True, nan_cell=(0, 0))
    result.save(tmp_path / "run")
    assert render_html(simkit.load(tmp_path / "run")) == render_html(result)


# --------------------------------------------------------------------------------------------------
# study report


def make_study(models=("m1", "m2", EVIL), metrics=("linear_cka", "unbiased_cka"), null=False) -> StudyResult:
    rng = np.random.default_rng(5)
    rows = []
    for metric in metrics:
        for a in models:
            for b in models:
                row = {"model_a": a, "model_b": b, "layer_a": f"{a}.fc", "layer_b": f"{b}.fc", "metric": metric,
                       "value": 1.0 if a == b else float(rng.random())}
                if null:
                    row.update(null_mean=0.01, null_p95=0.5)
                rows.append(row)
    summary = {"models": list(models), "metric": metrics[0], "metrics": list(metrics), "pairing": "last",
               "data": "mnist1d", "n": 128, "mode": "exact", "seconds": 0.5}
    return StudyResult(summary=summary, tables={"study": pd.DataFrame(rows)}, meta=run_meta())


def test_study_report_has_a_model_by_model_heatmap_per_metric():
    result = make_study(null=True)
    html = render_html(result)
    assert html.count('class="heatmap-svg"') == 2
    assert "<script" not in html.lower()
    svg = svg_root(re.search(r'<div class="heatmap">.*?</svg>', html, re.S).group(0) + "</div>")
    tips = [c.find("title").text for c in cell_rects(svg)]
    values = result.matrix("linear_cka").to_numpy()
    assert tips[0] == "m1 × m1: 1.000 (null p95 0.500)"
    assert tips[1] == f"m1 × m2: {values[0, 1]:.3f} (null p95 0.500{': not above null' if values[0, 1] <= 0.5 else ''})"


# --------------------------------------------------------------------------------------------------
# simkit report DIR


def test_cli_report_rerenders_a_saved_run(tmp_path):
    run = tmp_path / "run"
    make_compare(3, 4, null=True).save(run)
    assert not (run / "report.html").exists()
    outcome = CliRunner().invoke(app, ["report", str(run)])
    assert outcome.exit_code == 0, outcome.output
    html = (run / "report.html").read_text(encoding="utf-8")
    assert html.count('class="heatmap-svg"') == 2
    assert "wrote" in outcome.output


def test_cli_report_bad_directory_is_exit_2_one_line(tmp_path):
    outcome = CliRunner().invoke(app, ["report", str(tmp_path / "nowhere")])
    assert outcome.exit_code == 2
    lines = outcome.output.strip().splitlines()
    assert len(lines) == 1 and "is not a simkit run directory" in lines[0]


def test_cli_report_missing_table_is_exit_2(tmp_path):
    run = tmp_path / "run"
    make_compare(2, 2).save(run)
    (run / "layers.csv").unlink()
    outcome = CliRunner().invoke(app, ["report", str(run)])
    assert outcome.exit_code == 2
    assert re.fullmatch(r"error: .* is incomplete: layers\.csv is missing; rerun the command that wrote it\n",
                        outcome.output)


def test_load_of_a_bad_directory_raises_simkit_error(tmp_path):
    with pytest.raises(simkit.SimkitError, match="is not a simkit run directory"):
        simkit.load(tmp_path)


def test_load_of_an_incomplete_directory_raises_simkit_error(tmp_path):
    run = tmp_path / "run"
    make_compare(2, 2).save(run)
    (run / "similarity.csv").unlink()
    with pytest.raises(simkit.SimkitError, match="is incomplete: similarity.csv is missing"):
        simkit.load(run)


def test_save_into_a_file_is_a_clear_error(tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("x")
    with pytest.raises(simkit.SimkitError, match="is an existing file, not a directory"):
        make_compare(2, 2).save(target)
    assert target.read_text() == "x"


def test_every_result_kind_has_a_report_and_every_template_exists():
    assert set(REPORT_KINDS) == set(RESULT_KINDS)
    for kind, (build, template) in REPORT_KINDS.items():
        assert callable(build), kind
        assert template == f"{kind}.html.j2"
        environment().get_template(template)  # found in the installed simkit.templates; parses
