"""The one result assembler of the engine: ``compare``, ``compare_caches`` and ``study`` all build their
result here, so they record the same provenance whichever entry point is used.

``meta`` always holds: ``settings`` (the resolved :class:`~simkit.metrics.settings.CompareSettings`, the
device, plus the entry point's own: layer selectors, reduction, output index, pairing),
``settings_given`` (the settings as the caller gave them, before ``validate()`` resolved them), ``seeds`` (the permutation
seed ``null`` plus whatever the caller knows: model and data seeds, or the seeds the caches were
captured with), ``method`` (the accumulator's ``describe()``), ``timings`` and, through
``simkit.provenance.run_meta``, the command, versions and world size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simkit.catalog import CHANCE_MARGIN, MEASURES, TESTED_NULL, range_width
from simkit.engine.measure import Measured
from simkit.engine.significance import ordered, p_value_columns, p_value_summary
from simkit.metrics.settings import CompareSettings
from simkit.provenance import run_meta
from simkit.results import CompareResult, StudyResult


def similarity_frame(values: dict[str, dict[str, np.ndarray]], labels_a: Sequence[str], labels_b: Sequence[str],
                     permutations: Mapping[str, int] | None = None, *, correction: str | None = None,
                     skip_diagonal: bool = False) -> pd.DataFrame:
    """Long table ``layer_a, layer_b, metric, value[, null_mean, null_p95, chance, beats_chance, ci_low,
    ci_high]`` from computed matrices; ``permutations``: each metric's null draws (the chance rule).
    ``correction`` (p-values asked): ``calibrated`` beside ``chance``, ``beats_chance`` the corrected decision,
    ``p_value`` and ``p_corrected`` (:mod:`simkit.engine.significance`; a study's family leaves out each model
    with itself, ``skip_diagonal``)."""
    parts = []
    grid_a, grid_b = np.meshgrid(np.arange(len(labels_a)), np.arange(len(labels_b)), indexing="ij")
    for metric, arrays in values.items():
        part = pd.DataFrame({
            "layer_a": np.asarray(labels_a, dtype=object)[grid_a.ravel()],
            "layer_b": np.asarray(labels_b, dtype=object)[grid_b.ravel()],
            "metric": metric,
            "value": np.asarray(arrays["value"], dtype=np.float64).ravel(),
        })
        columns: dict[str, np.ndarray] = {c: np.asarray(arrays[c], dtype=np.float64)
                                          for c in ("null_mean", "null_p95") if c in arrays}
        columns.update(chance_columns(metric, arrays, (permutations or {}).get(metric, 0)))
        if correction is not None and "p_value" in arrays:
            columns = _with_tests(columns, metric, arrays, correction, skip_diagonal)
        columns.update({c: np.asarray(arrays[c], dtype=np.float64) for c in ("ci_low", "ci_high") if c in arrays})
        for column, array in columns.items():
            part[column] = array.ravel()
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def _with_tests(columns: dict[str, np.ndarray], metric: str, arrays: Mapping[str, np.ndarray], correction: str,
                skip_diagonal: bool) -> dict[str, np.ndarray]:
    """``columns`` with the test columns of ``metric`` in place (``simkit.engine.significance.ordered``)."""
    tests = p_value_columns(metric, arrays, correction, skip_diagonal)
    return ordered(columns, tests)


def chance_columns(metric: str, arrays: Mapping[str, np.ndarray], permutations: int) -> dict[str, np.ndarray]:
    """``chance`` (the closed form, else the null mean) and ``beats_chance`` (the catalogue's rule,
    ``simkit.catalog.beats_chance_rule``) of one metric's cells; {} when it has no chance level."""
    if "chance" in arrays:
        chance = np.asarray(arrays["chance"], dtype=np.float64)
    elif "null_mean" in arrays:
        chance = np.asarray(arrays["null_mean"], dtype=np.float64)
    else:
        return {}
    value = np.asarray(arrays["value"], dtype=np.float64)
    similar = MEASURES[metric].similarity
    tested = permutations >= TESTED_NULL and "null_p95" in arrays
    if tested:
        bound = np.asarray(arrays["null_p95" if similar else "null_p05"], dtype=np.float64)
    else:
        margin = CHANCE_MARGIN * range_width(metric)
        bound = chance + margin if similar else chance - margin
    with np.errstate(invalid="ignore"):
        beats = value > bound if similar else value < bound
    beats = np.where(np.isfinite(value) & np.isfinite(bound), beats, False)
    return {"chance": chance, "beats_chance": beats}


def drawn(measured: Measured) -> dict[str, int]:
    """The permutations each metric's null actually drew (``meta.method``; 0 without a null)."""
    return {m: int(d.get("null") or 0) for m, d in measured.method.items()}


def layers_meta(layers: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """``{"a": [...], "b": [...]}``: each side's layers with shape, reduction and width for result.json."""
    return {side: [{k: v for k, v in row.items() if k != "model"}
                   for row in layers[layers["model"] == side].to_dict(orient="records")] for side in ("a", "b")}


def selector(value: str | Sequence[str]) -> str | list[str]:
    """A layer selector as recorded: a string as given, a sequence as a list."""
    return value if isinstance(value, str) else list(value)


def _timings(seconds: float, measured: Measured, extra: Mapping[str, float]) -> dict[str, float]:
    return {"total": round(seconds, 3), **{k: round(v, 3) for k, v in extra.items()},
            "metrics_final": round(measured.compute_seconds, 3)}


@dataclass(frozen=True)
class Run:
    """What every engine result records of how it was run: the settings as given and as resolved, the
    device, the entry point's own settings (layer selectors, reduction, pairing) and the seeds."""

    given: CompareSettings
    settings: CompareSettings
    device: str
    own: Mapping[str, Any]
    seeds: Mapping[str, Any]


def engine_meta(run: Run, measured: Measured, *, seconds: float, timings: Mapping[str, float] | None = None,
                **fields: Any) -> dict[str, Any]:
    """``meta`` of every engine result: settings, seeds, method, timings (see the module docstring)."""
    settings = {**run.settings.resolved(), "null": drawn(measured), "device": run.device, **run.own}
    return run_meta(**fields, settings=settings, settings_given=run.given.to_dict(),
                    seeds={"null": run.settings.seed, **run.seeds}, method=measured.method,
                    timings=_timings(seconds, measured, timings or {}))


def compare_result(run: Run, measured: Measured, *, model_a: str, model_b: str, data: str,
                   layers_a: Sequence[str], layers_b: Sequence[str], layer_rows: Sequence[Mapping[str, Any]],
                   seconds: float, timings: Mapping[str, float] | None = None,
                   weights: tuple[str, str] = ("unknown", "unknown"), **fields: Any) -> CompareResult:
    """A CompareResult (models or caches): similarity and layers tables, the contract summary, meta.

    layers_a/layers_b: the chosen layers (matrix rows and columns); layer_rows: one row per chosen layer
    and side (model, name, type, shape, reduction, dim); weights: what each model's weights are."""
    correction = _correction(run)
    frame = similarity_frame(measured.values, layers_a, layers_b, drawn(measured), correction=correction)
    layers = pd.DataFrame(list(layer_rows))
    summary = {"model_a": model_a, "model_b": model_b, "weights_a": weights[0], "weights_b": weights[1],
               "data": data, "n": measured.rows,
               "mode": run.settings.mode, "metrics": list(run.settings.metrics), "n_layers_a": len(layers_a),
               "n_layers_b": len(layers_b), "batch_size": run.settings.batch_size, "seconds": round(seconds, 3),
               "warnings": list(measured.warnings)}
    if correction is not None:
        summary["p_values"] = p_value_summary(measured.values, measured.method, frame, (layers_a, layers_b),
                                              correction, measured.groups)
    meta = engine_meta(run, measured, seconds=seconds, timings=timings, layers=layers_meta(layers), **fields)
    return CompareResult(summary=summary, tables={"similarity": frame, "layers": layers}, meta=meta)


def _correction(run: Run) -> str | None:
    """The correction of the run's p-values (None: no p-values asked)."""
    return str(run.settings.correction or "holm") if run.settings.p_values else None


def study_result(run: Run, measured: Measured, *, labels: Sequence[str], layers: Sequence[str],
                 models: Sequence[str], caches: Sequence[str], data: str, seconds: float) -> StudyResult:
    """A StudyResult: the model × model ``study`` table, the ``models`` table, the contract summary, meta."""
    correction = _correction(run)
    frame = similarity_frame(measured.values, labels, labels, drawn(measured), correction=correction,
                             skip_diagonal=True).rename(columns={"layer_a": "model_a", "layer_b": "model_b"})
    layer_of = dict(zip(labels, layers, strict=True))
    frame.insert(2, "layer_a", frame["model_a"].map(layer_of))
    frame.insert(3, "layer_b", frame["model_b"].map(layer_of))
    table = pd.DataFrame({"label": list(labels), "model": list(models), "layer": list(layers),
                          "cache": list(caches)})
    metrics = list(run.settings.metrics)
    summary = {"models": list(labels), "metric": metrics[0], "metrics": metrics, "pairing": run.own["pairing"],
               "data": data, "n": measured.rows, "mode": run.settings.mode, "seconds": round(seconds, 3),
               "warnings": list(measured.warnings)}
    if correction is not None:
        summary["p_values"] = p_value_summary(measured.values, measured.method, frame, (labels, labels), correction,
                                              measured.groups, keys=("model_a", "model_b"), skip_diagonal=True)
    meta = engine_meta(run, measured, seconds=seconds, caches=list(caches))
    return StudyResult(summary=summary, tables={"study": frame, "models": table}, meta=meta)
