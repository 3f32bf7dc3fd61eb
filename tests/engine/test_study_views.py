"""Views of many networks at once (#26): the study's classical-MDS map and average-linkage dendrogram of
1 − similarity, their tables (embedding.csv, linkage.csv), each model's weights, and the report's SVGs."""

from __future__ import annotations

import re
import subprocess
import sys
from itertools import combinations

import numpy as np
import pandas as pd
import pytest
import torch

from simkit.engine import capture, study
from simkit.engine.study_views import average_linkage, classical_mds, dissimilarity, linkage_rows, study_views
from simkit.report import render_html
from simkit.report import study as study_report
from simkit.results import load
from tests.report.test_report import EVIL, make_study


def distances(points: np.ndarray) -> np.ndarray:
    return np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)


def test_classical_mds_recovers_points_in_a_plane():
    points = np.random.default_rng(0).normal(size=(7, 2)) * [3.0, 1.0]
    coords, share = classical_mds(distances(points))
    np.testing.assert_allclose(distances(coords), distances(points), atol=1e-10)
    assert share == pytest.approx(1.0)


def test_the_share_is_the_two_top_eigenvalues_over_all():
    points = np.random.default_rng(1).normal(size=(9, 4)) * [4.0, 2.0, 1.5, 1.0]
    _, share = classical_mds(distances(points))
    singular = np.linalg.svd(points - points.mean(axis=0), compute_uv=False) ** 2  # B = P Pᵀ of centred P
    assert share == pytest.approx(singular[:2].sum() / singular.sum(), rel=1e-9)
    assert share < 0.99


def test_classical_mds_of_identical_models_is_one_point():
    coords, share = classical_mds(np.zeros((3, 3)))
    assert np.allclose(coords, 0.0) and np.isnan(share)


def test_dissimilarity_is_one_minus_similarity_symmetric_with_a_zero_diagonal():
    similarity = np.array([[0.98, 0.7, 0.2], [0.6, 1.0, 0.1], [0.2, 0.1, 1.0]])
    d = dissimilarity(similarity, "linear_cka")
    np.testing.assert_allclose(d, [[0, 0.35, 0.8], [0.35, 0, 0.9], [0.8, 0.9, 0]])
    angles = np.array([[0.0, 0.3], [0.3, 0.0]])
    np.testing.assert_allclose(dissimilarity(angles, "shape_metric"), angles)  # a distance as it is
    ridge = np.array([[1.0, -0.5], [0.3, 1.0]])  # directional: the mean of both directions
    np.testing.assert_allclose(dissimilarity(ridge, "ridge_r2"), [[0, 1.1], [1.1, 0]])
    with_nan = similarity.copy()
    with_nan[0, 0] = np.nan  # the diagonal is not needed
    assert dissimilarity(with_nan, "linear_cka") is not None
    with_nan[0, 2] = np.nan
    assert dissimilarity(with_nan, "linear_cka") is None


def test_average_linkage_merges_the_nearest_then_averages():
    d = np.array([[0.0, 0.2, 0.8], [0.2, 0.0, 0.6], [0.8, 0.6, 0.0]])
    rows = linkage_rows("linear_cka", ["a", "b", "c"], d)
    assert list(rows["left_label"]) == ["a", "c"] and list(rows["right_label"]) == ["b", "cluster 3"]
    np.testing.assert_allclose(rows["distance"], [0.2, 0.7])  # c to {a, b}: (0.8 + 0.6) / 2
    assert list(rows["size"]) == [2, 3] and list(rows["cluster"]) == [3, 4]
    _, cophenetic = average_linkage(d)
    tree_heights = np.array([0.2, 0.7, 0.7])  # (a,b), (a,c), (b,c)
    assert cophenetic == pytest.approx(np.corrcoef(tree_heights, [0.2, 0.8, 0.6])[0, 1])


def test_study_views_skip_a_metric_with_an_undefined_value():
    good = pd.DataFrame(np.eye(3) * 0.5 + 0.5, index=list("abc"), columns=list("abc"))
    bad = good.copy()
    bad.iloc[0, 1] = np.nan
    tables = study_views({"linear_cka": good, "rbf_cka": bad})
    assert set(tables["embedding"]["metric"]) == {"linear_cka"} == set(tables["linkage"]["metric"])
    assert len(tables["embedding"]) == 3 and len(tables["linkage"]) == 2
    assert study_views({"rbf_cka": bad})["embedding"].empty


class _Related(torch.nn.Module):
    """A "model" whose one layer returns rows of a random table for the sample indices asked for; models
    of one ``family`` share a table, each adds its own noise of scale ``noise``."""

    def __init__(self, family: int, seed: int, noise: float, n: int = 256, width: int = 6):
        super().__init__()
        base = torch.randn(n, width, generator=torch.Generator().manual_seed(family))
        own = torch.randn(n, width, generator=torch.Generator().manual_seed(1000 + seed))
        self.layer = torch.nn.Identity()
        self.register_buffer("table", base + noise * own)

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.layer(self.table[index])


def family_study(tmp_path, families: list[int], noise: float = 0.3):
    index = torch.arange(256)
    paths = [capture(_Related(family, k, noise), index, tmp_path / f"m{k}", layers=["layer"],
                     model_name=f"fam{family}-{k}", data_name="index", progress=False)
             for k, family in enumerate(families)]
    return study(paths, metrics=["unbiased_cka", "linear_cka"], mode="exact", progress=False)


def test_related_models_are_joined_first_and_placed_together(tmp_path):
    result = family_study(tmp_path, [0, 0, 1, 1, 2])
    tree = result.tables["linkage"].query("metric == 'unbiased_cka'")
    first_two = {frozenset((r.left_label, r.right_label)) for r in tree.head(2).itertuples()}
    assert first_two == {frozenset(("m0", "m1")), frozenset(("m2", "m3"))}
    points = result.tables["embedding"].query("metric == 'unbiased_cka'").set_index("model")[["x", "y"]]
    gaps = {frozenset(p): float(np.linalg.norm(points.loc[p[0]] - points.loc[p[1]]))
            for p in combinations(points.index, 2)}
    related = max(gaps[frozenset(("m0", "m1"))], gaps[frozenset(("m2", "m3"))])
    assert related < min(v for k, v in gaps.items() if k not in (frozenset(("m0", "m1")), frozenset(("m2", "m3"))))


def test_the_tables_weights_and_depths_are_saved_and_read_back(tmp_path):
    result = family_study(tmp_path, [0, 1, 2])
    result.save(tmp_path / "run")
    assert (tmp_path / "run" / "embedding.csv").is_file() and (tmp_path / "run" / "linkage.csv").is_file()
    back = load(tmp_path / "run")
    pd.testing.assert_frame_equal(back.tables["embedding"], result.tables["embedding"], check_dtype=False)
    assert back.summary["weights"] == [result.tables["models"]["weights"][k] for k in range(3)]
    assert list(back.tables["models"]["depth"]) == [1.0, 1.0, 1.0]  # one cached layer each: the last


def test_the_report_of_unrelated_models_says_the_views_are_noise(tmp_path):
    result = family_study(tmp_path, [0, 1, 2])
    context = study_report.context(result)
    assert "no pair of different models beats chance" in context["findings"][0]
    assert "weights: all as given (a module simkit did not load)" in context["findings"][0]
    assert context["views"]["noise"].startswith("No pair of different models beats chance")
    html = render_html(result)
    assert 'id="study-map"' in html and 'id="study-tree"' in html
    assert "layout is noise" in html


def test_the_report_of_related_models_counts_the_pairs_that_beat_chance(tmp_path):
    result = family_study(tmp_path, [0, 0, 1])
    views = study_report.context(result)["views"]
    beats = result.tables["study"].query("metric == 'unbiased_cka' and model_a != model_b")["beats_chance"]
    assert views["noise"].startswith(f"{int(beats.sum())} of 6 pairs of different models beat chance")
    assert 0 < int(beats.sum()) < 6


def test_the_views_are_inline_svg_with_text_titles_and_no_script(tmp_path):
    result = family_study(tmp_path, [0, 1, 2])
    models = result.summary["models"]
    long_name = "a-very-long-model-name-that-needs-shortening-" + EVIL
    rename = dict(zip(models, ["m0", long_name, "m$x^2$"], strict=True))
    result.summary["models"] = [rename[m] for m in models]
    for name in ("study", "embedding"):
        for column in ("model", "model_a", "model_b"):
            if column in result.tables[name]:
                result.tables[name][column] = result.tables[name][column].map(rename)
    views = study_report.context(result)["views"]
    for svg in (str(views["map"]), str(views["tree"])):
        assert svg.startswith('<svg class="view-svg"') and "<script" not in svg and "<style" not in svg
        assert len(re.findall(r"<text\b", svg)) >= 6  # labels and ticks as text, not paths
        assert "<title>a-very-long-model-name-that-needs-shortening-&lt;script&gt;alert(1)&lt;/script&gt;</title>" in svg
        assert "m$x^2$" in svg  # no mathtext
    assert str(views["map"]).count("<svg") == 1 and 'id="study-map-' not in str(views["tree"])


def test_a_study_without_the_tables_renders_without_the_views():
    html = render_html(make_study(null=True))
    assert "Many networks at once" not in html and html.count('class="heatmap-svg"') == 2


def test_drawing_the_views_leaves_pyplot_unimported(tmp_path):
    result = family_study(tmp_path, [0, 1, 2])
    result.save(tmp_path / "run")
    code = ("import sys, matplotlib\nfrom simkit.results import load\nfrom simkit.report import render_html\n"
            f"html = render_html(load({str(tmp_path / 'run')!r}))\n"
            "assert 'id=\"study-tree\"' in html\n"
            "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
