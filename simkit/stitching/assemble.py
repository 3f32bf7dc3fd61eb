"""The last phase of :func:`simkit.stitching.runner.stitch`: the rows of every arm into a StitchResult.

:class:`ArmRows` collects what the arms produce; :func:`assemble` turns it, with the accuracies of A
and B and the run's facts, into the result's summary (with its warnings), tables, meta and extra.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from simkit.results import StitchResult
from simkit.runinfo import Timer, run_meta
from simkit.stitching.checks import chance_accuracy, run_warnings
from simkit.stitching.iri import IRISet
from simkit.stitching.objectives import DESCRIPTIONS
from simkit.stitching.prepare import Prepared

COLUMNS = ["layer_a", "layer_b", "objective", "setting", "stitched_accuracy", "b_accuracy", "penalty"]
MAX_EXAMPLE_VALUES = 3 * 64 * 64  # larger inputs are not copied into result.json


@dataclass
class ArmRows:
    """What the arms produce: a row per (pair, arm, objective) of the ``stitching`` and ``training``
    tables, the IRI set and cache record per layer of A, and how each pair was cut."""

    arms: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    train_rows: list[dict[str, Any]] = field(default_factory=list)
    iri_sets: dict[str, IRISet] = field(default_factory=dict)
    iri_cache: dict[str, Any] = field(default_factory=dict)
    cut_modes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunFacts:
    """The run's facts the meta records beside the settings: the models as trained, the IRI clamp
    range and its source, the IRI cache directory and the accuracies of A and B."""

    model_a: nn.Module
    model_b: nn.Module
    value_range: tuple[float, float]
    range_source: str
    cache_dir: str | Path | None
    a_acc: float
    b_acc: float


def histogram(errors: Tensor, bins: int = 30) -> dict[str, list[float]]:
    """Histogram of log10 relative errors (clipped at 1e-12): edges and counts."""
    values = np.log10(np.clip(errors.numpy(), 1e-12, None))
    counts, edges = np.histogram(values, bins=bins)
    return {"log10_edges": edges.tolist(), "counts": counts.tolist()}


def examples(x: Tensor, iris: IRISet, k: int) -> dict[str, Any]:
    """The first ``k`` originals, seeds and IRIs (as lists) for the report; none for large inputs."""
    if x[0].numel() > MAX_EXAMPLE_VALUES:
        k = 0
    idx = list(range(min(k, len(x))))
    seeds = iris.seed_index[idx]
    return {"original": x[idx].tolist(), "iri": iris.iris[idx].tolist(),
            "seed": [x[int(s)].tolist() if s >= 0 else None for s in seeds],
            "rel_error": iris.rel_error[idx].tolist(), "shape": list(x.shape[1:])}


def relative_depth(model: nn.Module, name: str) -> float:
    """Position of module ``name`` among ``model``'s named modules, in (0, 1]."""
    names = [n for n, m in model.named_modules() if n]
    return (names.index(name) + 1) / len(names)


def summarize(table: pd.DataFrame, objectives: list[str], arms: list[str], a_acc: float, b_acc: float,
              iri_sets: dict[str, IRISet], labels: Tensor | None, tol: float, n_pairs: int) -> dict[str, Any]:
    """The result's summary: accuracies, IRI quality, mean penalty per objective and arm, warnings."""
    summary: dict[str, Any] = {"a_accuracy": a_acc, "b_accuracy": b_acc, "iri_relative_error_median": None,
                               "iri_converged_fraction": None}
    converged = {la: float(s.reached.double().mean()) for la, s in iri_sets.items()}
    medians = {la: float(s.rel_error.median()) for la, s in iri_sets.items()}
    if iri_sets:
        summary["iri_relative_error_median"] = float(torch.cat([s.rel_error for s in iri_sets.values()]).median())
        summary["iri_converged_fraction"] = min(converged.values())
    for objective in objectives:
        for arm in arms:
            part = table[(table.objective == objective) & (table.setting == arm)]
            summary[f"mean_penalty_{objective}_{arm}"] = float(part.penalty.mean())
    summary["pairs"] = n_pairs
    summary["chance_accuracy"] = chance_accuracy(labels) if labels is not None else None
    summary["warnings"] = run_warnings({"model A": a_acc, "model B": b_acc}, labels, converged, medians, tol)
    return summary


def _iri_table(out: ArmRows) -> pd.DataFrame:
    """One row per layer of A with IRIs: their summary, tolerance and cache use."""
    return pd.DataFrame([{"layer_a": la, **s.summary(), "iri_converged_fraction": s.summary()["reached_fraction"],
                          "tol": s.tol, "cache": out.iri_cache[la]["cache"]}
                         for la, s in out.iri_sets.items()])


def _extra(prep: Prepared, facts: RunFacts, out: ArmRows) -> dict[str, Any]:
    """The result's extra: pair depths, IRI error histograms and examples, objective descriptions."""
    return {
        "pairs": [{"layer_a": la, "layer_b": lb, "depth_a": relative_depth(facts.model_a, la),
                   "depth_b": relative_depth(facts.model_b, lb)} for la, lb in prep.pairs],
        "iri_histograms": {la: histogram(s.rel_error) for la, s in out.iri_sets.items()},
        "iri_examples": {la: examples(prep.x_train, s, prep.settings.examples) for la, s in out.iri_sets.items()},
        "objective_descriptions": {k: DESCRIPTIONS[k] for k in prep.objectives},
    }


def _meta(prep: Prepared, facts: RunFacts, out: ArmRows, timer: Timer) -> dict[str, Any]:
    """The result's meta: inputs, sizes, settings, IRI and cache facts, cut modes, device, timings."""
    settings = prep.settings
    return run_meta(
        model_a=prep.names[0], model_b=prep.names[1], data=prep.data.spec, n=settings.n, seed=settings.seed,
        n_train=len(prep.train), n_test=len(prep.test),
        test_data=None if prep.test_data is None else prep.test_data.spec, objectives=prep.objectives,
        settings=out.arms, pairs=[list(p) for p in prep.pairs], init=settings.init,
        train={"steps": settings.steps, "batch_size": settings.batch_size, "lr": settings.lr, "optimizer": "adam"},
        train_models_epochs=settings.train,
        iri=asdict(settings.iri_settings()) if settings.iri else None,
        value_range=list(facts.value_range), value_range_source=facts.range_source,
        cache_dir=None if facts.cache_dir is None else str(facts.cache_dir),
        iri_cache=dict(out.iri_cache), cut=out.cut_modes, device=str(prep.dev), options=settings.to_dict(),
        timings=timer.seconds)


def assemble(prep: Prepared, facts: RunFacts, out: ArmRows, timer: Timer) -> StitchResult:
    """The StitchResult of the run; the summary's warnings are also raised (pointing at the caller of
    ``stitch``, which calls this directly)."""
    table = pd.DataFrame(out.rows, columns=COLUMNS)
    summary = summarize(table, prep.objectives, out.arms, facts.a_acc, facts.b_acc, out.iri_sets, prep.y_test,
                        prep.settings.iri_settings().tol, len(prep.pairs))
    for message in summary["warnings"]:
        warnings.warn(message, stacklevel=3)
    iri_table = _iri_table(out)
    extra = _extra(prep, facts, out)
    meta = _meta(prep, facts, out, timer)
    tables = {"stitching": table, "training": pd.DataFrame(out.train_rows)}
    if len(iri_table):
        tables["iris"] = iri_table
    return StitchResult(summary=summary, tables=tables, meta=meta, extra=extra)
