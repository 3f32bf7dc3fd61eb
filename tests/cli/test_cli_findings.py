"""The one-line finding of `compare`, `capture` and studies (simkit.report.headline): every number it
states is recomputed here from the files the run wrote (or the hand-made result's rows)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import simkit.cli.main  # noqa: F401  (registers the commands)
from simkit.catalog import LARGE_EFFECT, range_width
from simkit.cli.common import app
from simkit.provenance import run_meta
from simkit.report.headline import capture_headline, compare_headline, study_headline
from simkit.results import StudyResult

MLP_A = "simkit:mlp:in_features=40,hidden=16,depth=3"
MLP_B = "simkit:mlp:in_features=40,hidden=12,depth=2"


def finding(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("finding: ")]
    assert len(lines) == 1, stdout
    return lines[0]


def matching_depth(values: np.ndarray) -> tuple[float, float]:
    """Mean over row i ↔ column round(i·(C−1)/(R−1)) and over every other cell (written out again)."""
    r, c = values.shape
    on = {(i, int(round(i * (c - 1) / (r - 1)))) for i in range(r)}
    inside = [values[i, j] for i in range(r) for j in range(c) if (i, j) in on]
    outside = [values[i, j] for i in range(r) for j in range(c) if (i, j) not in on]
    return float(np.mean(inside)), float(np.mean(outside))


def test_compare_prints_the_lead_measure_at_matching_depth_chance_count_and_report(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "96", "--null", "4",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    line = finding(result.stdout)
    table = pd.read_csv(out / "similarity.csv")
    layers = pd.read_csv(out / "layers.csv")
    lead = table[table["metric"] == "unbiased_cka"]
    wide = lead.pivot(index="layer_a", columns="layer_b", values="value").reindex(
        index=list(layers.loc[layers["model"] == "a", "name"]), columns=list(layers.loc[layers["model"] == "b", "name"]))
    on, off = matching_depth(wide.to_numpy())
    counted = lead["chance"].notna() & lead["value"].notna()
    beaten = lead["beats_chance"].astype(bool) & counted
    large = beaten & (lead["value"] - lead["chance"] >= LARGE_EFFECT * range_width("unbiased_cka"))
    assert line == (f"finding: unbiased_cka averages {on:.3f} at matching relative depth ({off:.3f} elsewhere); "
                    f"{int(beaten.sum())} of {int(counted.sum())} layer pairs beat their chance level, "
                    f"{int(large.sum())} of them by a large margin (≥ {LARGE_EFFECT:.0%} of the range); "
                    f"details in {out / 'report.html'}")


def study_result(values: np.ndarray, chance: np.ndarray, metric: str = "linear_cka") -> StudyResult:
    models = [f"m{i}" for i in range(len(values))]
    rows = [{"model_a": a, "model_b": b, "layer_a": "fc", "layer_b": "fc", "metric": metric,
             "value": values[i, j], "chance": chance[i, j], "beats_chance": bool(values[i, j] > chance[i, j])}
            for i, a in enumerate(models) for j, b in enumerate(models)]
    summary = {"models": models, "metric": metric, "metrics": [metric], "pairing": "last", "data": "mnist1d",
               "n": 64, "mode": "exact"}
    return StudyResult(summary=summary, tables={"study": pd.DataFrame(rows)}, meta=run_meta(settings={"null": 0}))


def test_study_names_the_most_similar_pair_among_those_beating_chance():
    values = np.array([[1.0, 0.9, 0.6], [0.9, 1.0, 0.4], [0.6, 0.4, 1.0]])
    chance = np.array([[0.1, 0.95, 0.3], [0.95, 0.1, 0.3], [0.3, 0.3, 0.1]])  # m0-m1 is high but within chance
    line = study_headline(study_result(values, chance))  # m0-m2 beats chance by 0.3 (large), m1-m2 by 0.1
    assert line == ("most similar pair: m0 and m2 (linear_cka 0.600, chance level 0.300); 4 of 6 pairs of "
                    "different models beat chance, 2 by a large margin")


def test_study_without_a_pair_beating_chance_names_none():
    values = np.array([[1.0, 0.2, 0.1], [0.2, 1.0, 0.15], [0.1, 0.15, 1.0]])
    chance = np.full((3, 3), 0.3)
    line = study_headline(study_result(values, chance))
    assert line == "no pair of different models beats its chance level (linear_cka, 3 models, highest 0.200)"
    assert "m0" not in line


def test_study_of_a_distance_picks_the_lowest_value():
    values = np.array([[0.0, 0.3, 0.6], [0.3, 0.0, 0.8], [0.6, 0.8, 0.0]])
    chance = np.full((3, 3), 0.9)
    rows = study_result(values, chance, metric="procrustes_angle")
    rows.tables["study"]["beats_chance"] = rows.tables["study"]["value"] < 0.9   # a distance beats below
    assert study_headline(rows).startswith("most similar pair: m0 and m1 (procrustes_angle 0.300")


def test_compare_without_chance_levels_says_so():
    from tests.report.test_report import make_compare

    line = compare_headline(make_compare(1, 4, metrics=("linear_cka",)))
    values = make_compare(1, 4, metrics=("linear_cka",)).tables["similarity"]["value"]
    assert line == (f"linear_cka averages {values.mean():.3f} over 1 × 4 layer pairs; not checked against "
                    "chance (rerun with --null 10)")


@pytest.mark.slow
def test_capture_and_study_print_their_findings(tmp_path):
    caches = []
    for i, spec in enumerate((MLP_A, MLP_B, MLP_A)):
        out = tmp_path / f"cache{i}"
        result = CliRunner().invoke(app, ["capture", spec, "--data", "mnist1d", "--n", "64", "--seed", str(i),
                                          "--layers", "blocks.0,blocks.1", "--out", str(out)])
        assert result.exit_code == 0, result.output
        manifest = json.loads((out / "manifest.json").read_text())
        dims = [layer["dim"] for layer in manifest["layers"]]
        size = sum((out / s["file"]).stat().st_size for s in manifest["shards"])
        line = finding(result.stdout)
        assert line == f"finding: {capture_headline(manifest, out)}"
        assert line.startswith(f"finding: stored 64 samples × 2 layers of {spec} ({manifest['weights']}) on mnist1d")
        width = f"width {dims[0]}" if len(set(dims)) == 1 else f"widths {min(dims)}–{max(dims)}"
        assert f"({width}, float32): {size / 1000:.1f} KB in 1 shard in {out}" in line
        caches.append(str(out))
    out = tmp_path / "study"
    result = CliRunner().invoke(app, ["compare", *caches, "--out", str(out), "--no-report"])
    assert result.exit_code == 0, result.output
    line = finding(result.stdout)
    study = pd.read_csv(out / "study.csv")
    lead = study[(study["metric"] == "unbiased_cka") & (study["model_a"] != study["model_b"])]
    winners = lead[lead["beats_chance"].astype(bool)]
    if winners.empty:
        assert "no pair of different models beats its chance level" in line
    else:
        best = winners.loc[winners["value"].idxmax()]
        named = line.removeprefix("finding: most similar pair: ").split(" (")[0].split(" and ")
        assert set(named) == {best["model_a"], best["model_b"]}
        assert f"(unbiased_cka {best['value']:.3f}, chance level {best['chance']:.3f}); {len(winners)} of " \
               f"{len(lead)} pairs of different models beat chance" in line
    assert line.endswith(f"details in {out / 'result.json'}")
