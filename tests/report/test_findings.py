"""Reports lead with what was found: the compare and study findings and cautions, readable "How this run
was made", round colour-bar ticks, and the notebook views (``_repr_html_``, ``plot``).

Results are hand-made (no model runs): every number a sentence states is recomputed here with numpy
from the rows the result holds.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import simkit
from simkit.provenance import run_meta
from simkit.report import compare as compare_report
from simkit.report import render_html
from simkit.report import study as study_report
from simkit.report.figures import meta_html, nice_ticks
from tests.report.test_report import EVIL, make_compare, make_study


def opening(html: str) -> str:
    """The page between the byline and the first section heading."""
    return html.split("</p>", 1)[1].split("<h2>", 1)[0]


def test_compare_findings_state_the_lead_metrics_numbers():
    result = make_compare(4, 5, null=True)
    findings = compare_report.context(result)["findings"]
    table = result.tables["similarity"]
    lead = table[table["metric"] == "unbiased_cka"]  # the lead metric, although linear_cka comes first
    matrix = result.matrix("unbiased_cka").to_numpy()
    assert findings[0].startswith("unbiased_cka between simkit:cnn1d and simkit:cnn1d:channels=16 on mnist1d "
                                  "(n = 256, exact mode, reduction: flatten)")
    assert f"averages {lead['value'].mean():.3f} over 4 × 5 layer pairs" in findings[0]
    assert f"from {lead['value'].min():.3f} to {lead['value'].max():.3f}" in findings[0]
    i, j = np.unravel_index(np.argmax(matrix), matrix.shape)
    best = result.matrix("unbiased_cka")
    assert f"highest: {best.index[i]} × {best.columns[j]} ({matrix[i, j]:.3f})" in findings[0]
    diagonal = [matrix[k, round(k * 4 / 3)] for k in range(4)]  # matching relative depth, 4 rows × 5 columns
    off = matrix[~np.isin(np.arange(20).reshape(4, 5), [k * 5 + round(k * 4 / 3) for k in range(4)])]
    assert findings[1] == f"At matching relative depth (the diagonal) the mean is {np.mean(diagonal):.3f}, " \
                          f"elsewhere {off.mean():.3f}."
    above = int((lead["value"] > lead["null_p95"]).sum())
    gap = lead["value"].mean() - lead["null_mean"].mean()
    assert findings[2] == (f"Against a permutation null (8 shuffles of B's samples) {above} of 20 pairs exceed "
                           f"their null's 95th percentile; the mean value lies {abs(gap):.3f} "
                           f"{'above' if gap >= 0 else 'below'} the null mean ({lead['null_mean'].mean():.3f}).")


def test_compare_report_opens_with_findings_then_figures_then_tables():
    html = render_html(make_compare(3, 4, null=True))
    first = opening(html)
    assert first.lstrip().startswith('<section class="findings" id="findings">')
    assert html.index('id="findings"') < html.index('class="heatmap-svg"') < html.index('<img class="figure"') \
        < html.index('<table class="best">') < html.index("<h2>Run summary</h2>")


def test_biased_cka_in_minibatch_mode_is_flagged_with_its_null():
    result = make_compare(3, 3, null=True)
    result.summary["mode"] = "minibatch"
    table = result.tables["similarity"]
    linear = table["metric"] == "linear_cka"
    table.loc[linear, "null_mean"] = table.loc[linear, "value"] - 0.01  # almost all of each value is bias
    cautions = compare_report.context(result)["cautions"]
    bias = next(c for c in cautions if c.startswith("linear_cka in minibatch mode"))
    assert "batches of 64 samples" in bias and "does not shrink with more data" in bias
    assert bias.endswith(f"Here its null mean is {table.loc[linear, 'null_mean'].mean():.3f} against a mean value "
                         f"of {table.loc[linear, 'value'].mean():.3f}, so these values are mostly estimator bias.")
    assert not any(c.startswith("unbiased_cka in minibatch mode") for c in cautions)
    result.summary["mode"] = "exact"  # the same null in exact mode: the generic warning
    cautions = compare_report.context(result)["cautions"]
    assert any(c.startswith("linear_cka: the null mean") and "more than half the mean value" in c for c in cautions)


def test_cautions_count_pairs_within_the_null_band_and_missing_nulls():
    result = make_compare(3, 4, null=True, nan_cell=(1, 2))
    table = result.tables["similarity"]
    cautions = compare_report.context(result)["cautions"]
    for metric in ("linear_cka", "unbiased_cka"):
        rows = table[table["metric"] == metric].dropna(subset=["value"])
        within = len(table[table["metric"] == metric]) - int((rows["value"] > rows["null_p95"]).sum())
        assert f"{within} of 12 {metric} pairs are not above their null's 95th percentile" in " ".join(cautions)
    assert "2 of 24 values are undefined (NaN; hatched)" in " ".join(cautions)
    plain = compare_report.context(make_compare(3, 4))["cautions"]
    assert any(c.startswith("No permutation null was run") for c in plain)


def test_flattened_text_and_small_n_are_cautions():
    result = make_compare(2, 2, null=True)
    result.summary.update(data="text:/data/sentences.txt", n=40)
    result.meta["settings"]["reduce"] = "flatten"
    cautions = " ".join(compare_report.context(result)["cautions"])
    assert "Token sequences were flattened (--reduce flatten)" in cautions
    assert "Only n = 40 samples" in cautions
    result.meta["settings"]["reduce"] = "auto"
    assert "flattened" not in " ".join(compare_report.context(result)["cautions"])


def test_study_findings_name_the_most_and_least_similar_pair():
    result = make_study(models=("m1", "m2", "m3"), metrics=("linear_cka", "unbiased_cka"), null=True)
    findings = study_report.context(result)["findings"]
    matrix = result.matrix("unbiased_cka").to_numpy().copy()
    np.fill_diagonal(matrix, np.nan)
    names = ["m1", "m2", "m3"]
    hi = np.unravel_index(np.nanargmax(matrix), matrix.shape)
    lo = np.unravel_index(np.nanargmin(matrix), matrix.shape)
    assert findings[0] == (f"unbiased_cka between 3 models (last layers, mnist1d, n = 128, exact mode): the most "
                           f"similar pair is {names[hi[0]]} and {names[hi[1]]} ({matrix[hi]:.3f}), the least "
                           f"similar {names[lo[0]]} and {names[lo[1]]} ({matrix[lo]:.3f}).")
    assert findings[1] == f"Between different models the mean is {np.nanmean(matrix):.3f}."
    html = render_html(result)
    assert opening(html).lstrip().startswith('<section class="findings"')


def test_run_meta_is_shown_without_python_reprs():
    result = make_compare(2, 2)
    result.meta.update(layers={"a": [{"name": "blocks.0", "dim": 8}, {"name": "head", "dim": 10}]},
                       settings={"schedule": ["progressive"], "device": None, "fold": True, "note": EVIL},
                       timings={"total": 44.29663458899995})
    html = render_html(result)
    meta = html[html.index("<h2>How this run was made</h2>"):]
    for repr_text in ("[{", "{'", "['progressive']", "None", "True", "44.2966345"):
        assert repr_text not in meta
    assert "<code>progressive</code>" in meta and "44.3" in meta and ">yes<" in meta and "—" in meta
    assert "<th>name</th><th>dim</th>" in meta  # a list of records is one table
    assert "&lt;script&gt;" in meta and "<script" not in meta


def test_meta_html_escapes_and_formats():
    assert str(meta_html([1, 2.0, "x<y"])) == "<code>1</code>, 2, <code>x&lt;y</code>"
    assert str(meta_html([])) == '<span class="muted">none</span>'
    assert str(meta_html(float("nan"))) == "n/a"


@given(st.floats(-5, 5), st.floats(1e-6, 10))
def test_nice_ticks_are_round_evenly_spaced_and_inside_the_range(lo, span):
    hi = lo + span
    ticks, labels = nice_ticks(lo, hi)
    assert 2 <= len(ticks) <= 9
    assert all(lo - 1e-9 * span <= t <= hi + 1e-9 * span for t in ticks)
    steps = np.diff(ticks)
    assert np.allclose(steps, steps[0], rtol=1e-6)
    # the differences carry rounding error of ~1e-9 relative near lo = 1 with a 1e-6 step: round the exponent
    mantissa = steps[0] / 10 ** math.floor(math.log10(steps[0]) + 1e-6)
    assert any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 2.5, 5))
    assert not any(re.fullmatch(r"-0(\.0*)?", label) for label in labels)  # never "-0.000"
    assert [float(label) for label in labels] == pytest.approx(ticks, abs=steps[0] / 100)
    assert len(set(labels)) == len(labels)


def test_colour_bar_of_a_typical_cka_range():
    assert nice_ticks(-0.0001, 0.746)[1] == ["0.0", "0.2", "0.4", "0.6"]
    assert nice_ticks(0.0, 1.0)[1] == ["0.00", "0.25", "0.50", "0.75", "1.00"]


def test_results_show_their_findings_inline_in_a_notebook(tmp_path):
    result = make_compare(3, 4, null=True)
    html = result._repr_html_()
    assert "CompareResult" in html and 'class="findings"' in html and html.count('class="heatmap-svg"') == 2
    assert compare_report.context(result)["findings"][0].split(" (")[0] in html
    result.save(tmp_path / "run")
    loaded = simkit.load(tmp_path / "run")  # read back: the same view
    assert 'class="findings"' in loaded._repr_html_()
    study = make_study(models=("m1", "m2", EVIL), null=True)
    assert "StudyResult" in study._repr_html_() and "<script" not in study._repr_html_()


def test_plot_is_a_seaborn_heatmap_of_the_matrix():
    pytest.importorskip("seaborn")
    result = make_compare(3, 4, null=True)
    figure = result.plot()  # several metrics: unbiased_cka
    ax = figure.axes[0]
    assert ax.get_title() == "unbiased_cka"
    texts = [t.get_text() for t in ax.texts]
    assert texts == [f"{v:.2f}" for v in result.matrix("unbiased_cka").to_numpy().ravel()]
    from simkit.plotting import shorten  # long layer names are shortened in the middle (issue #26)

    assert [t.get_text() for t in ax.get_yticklabels()] == [shorten(n) for n in result.matrix("unbiased_cka").index]
    assert ax.collections[0].get_clim() == (0.0, 1.0)
    assert result.plot("linear_cka").axes[0].get_title() == "linear_cka"
    with pytest.raises(simkit.SimkitError, match="metric 'rsa' is not in this result"):
        result.plot("rsa")
    study = make_study(models=("m1", "m2"))
    assert study.plot("linear_cka").axes[0].get_xlabel() == "model B"
    import matplotlib.pyplot as plt

    plt.close("all")


def test_matrix_defaults_to_the_only_metric():
    result = make_compare(2, 3, metrics=("rsa",))
    pd.testing.assert_frame_equal(result.matrix(), result.matrix("rsa"))
    with pytest.raises(simkit.SimkitError, match="holds several metrics"):
        make_compare(2, 3).matrix()


def test_public_names_are_listed():
    assert {"compare", "compare_caches", "study", "capture", "load", "save_run"} <= set(dir(simkit))


def test_study_without_batch_size_in_its_summary_takes_it_from_the_settings():
    result = make_study(models=("m1", "m2"))
    result.summary["mode"] = "minibatch"
    result.meta = run_meta(settings={"batch_size": 32})
    assert "batches of 32 samples" in " ".join(study_report.context(result)["cautions"])
