"""The compare report for the measures beyond CKA: distances' best matches are minima, notes for the
directional ridge_r2, colour ranges per measure."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simkit.report.compare import best_matches, colour_range


def test_best_match_of_a_distance_is_the_minimum_and_ignores_the_null_p95():
    frame = pd.DataFrame([[0.2, 1.1], [0.9, 0.1]], index=["a0", "a1"], columns=["b0", "b1"])
    null = pd.DataFrame(np.full((2, 2), 0.5), index=frame.index, columns=frame.columns)
    rows = best_matches({"shape_metric": frame, "procrustes": frame}, {"shape_metric": null, "procrustes": null})
    assert [r["cells"][0]["layer_b"] for r in rows] == ["b0", "b1"]        # distance: smallest
    assert [r["cells"][1]["layer_b"] for r in rows] == ["b1", "b0"]        # similarity: largest
    assert rows[0]["cells"][0]["above_null"] is None and rows[0]["cells"][1]["above_null"] is True


def test_colour_ranges():
    values = np.array([[0.2, 0.4]])
    assert colour_range("cca", values) == (0.0, 1.0)
    assert colour_range("procrustes_angle", values) == (0.0, float(np.pi / 2))
    assert colour_range("ridge_r2", np.array([[-3.0, 0.5]])) == (None, None)


def test_null_band_gives_no_above_count_for_distances():
    from simkit.report.compare import null_band

    table = pd.DataFrame({"metric": ["cca", "cca", "shape_metric", "shape_metric"], "value": [0.9, 0.1, 0.2, 1.0],
                          "null_mean": [0.3] * 4, "null_p95": [0.5] * 4})
    rows = {r["metric"]: r for r in null_band(table, ["cca", "shape_metric"])}
    assert rows["cca"]["above"] == 1 and rows["shape_metric"]["above"] is None
