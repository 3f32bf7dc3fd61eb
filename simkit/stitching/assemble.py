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

from simkit.provenance import Timer, run_meta
from simkit.results import StitchResult
from simkit.stats import beyond_noise, paired_difference, t_interval
from simkit.stitching.checks import chance_accuracy, run_warnings
from simkit.stitching.iri import IRISet
from simkit.stitching.objectives import DESCRIPTIONS
from simkit.stitching.prepare import Prepared

COLUMNS = ["layer_a", "layer_b", "objective", "setting", "stitched_accuracy", "b_accuracy", "penalty", "seed",
           "a_accuracy", "penalty_min", "chosen_step"]
KEYS = ["layer_a", "layer_b", "objective", "setting"]
SEED_INTERVAL_COLUMNS = ("stitched_accuracy", "penalty", "penalty_min")  # mean, std and t interval over seeds
MAX_EXAMPLE_VALUES = 3 * 64 * 64  # larger inputs are not copied into result.json


@dataclass
class ArmRows:
    """What the arms produce: a row per (seed, pair, arm, objective) of the ``stitching`` and
    ``training`` tables, the IRI set, cache record and diagnostics per (seed, layer of A), the accuracies
    of A and B per seed, and how each pair was cut."""

    arms: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    train_rows: list[dict[str, Any]] = field(default_factory=list)
    iri_sets: dict[tuple[int, str], IRISet] = field(default_factory=dict)
    iri_cache: dict[tuple[int, str], Any] = field(default_factory=dict)
    iri_diagnostics: dict[tuple[int, str], dict[str, float]] = field(default_factory=dict)
    accuracies: list[dict[str, float]] = field(default_factory=list)
    cut_modes: dict[str, str] = field(default_factory=dict)

    @property
    def several(self) -> bool:
        """Whether more than one seed ran."""
        return len(self.accuracies) > 1

    def layer_label(self, key: tuple[int, str]) -> str:
        """A layer of A as keys of ``extra``/``meta`` name it: the layer, ``"<layer> seed=<s>"`` with
        several seeds."""
        return f"{key[1]} seed={key[0]}" if self.several else key[1]


@dataclass(frozen=True)
class RunFacts:
    """The run's facts the meta records beside the settings: the (first seed's) models as trained, the
    IRI clamp range and its source, the IRI cache directory, the accuracies of A and B (means over
    seeds), the seeds and how their models differ."""

    model_a: nn.Module
    model_b: nn.Module
    value_range: tuple[float, float]
    range_source: str
    cache_dir: str | Path | None
    a_acc: float
    b_acc: float
    seeds: list[int] = field(default_factory=lambda: [0])
    seed_models: str = "the given models"
    weights: dict[str, str] = field(default_factory=dict)


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


def aggregate(table: pd.DataFrame) -> pd.DataFrame:
    """Over seeds, per layer pair × objective × setting (run order): ``seeds`` and, for each of
    :data:`SEED_INTERVAL_COLUMNS`, ``<column>_mean``, ``_std`` (ddof = 1), ``_low``, ``_high`` (95 % t
    interval, :func:`simkit.stats.t_interval`; NaN with one seed); ``b_accuracy_mean``, ``a_accuracy_mean`` and
    ``chosen_step_mean``. table: the ``stitching`` table (one row per seed × pair × objective × setting)."""
    columns = [*KEYS, "seeds", *(f"{c}_{s}" for c in SEED_INTERVAL_COLUMNS for s in ("mean", "std", "low", "high")),
               "a_accuracy_mean", "b_accuracy_mean", "chosen_step_mean"]
    rows = []
    for key, group in table.groupby(KEYS, sort=False):
        row: dict[str, Any] = dict(zip(KEYS, key, strict=True))
        row["seeds"] = int(group.seed.nunique())
        for column in SEED_INTERVAL_COLUMNS:
            interval = t_interval(group[column].to_numpy(float))
            row.update({f"{column}_{s}": getattr(interval, s) for s in ("mean", "std", "low", "high")})
        for name in ("a_accuracy", "b_accuracy", "chosen_step"):
            row[f"{name}_mean"] = float(group[name].astype(float).mean())
        rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def iri_differences(table: pd.DataFrame) -> pd.DataFrame:
    """Invariance-aware minus standard penalty, paired by seed (:func:`simkit.stats.paired_difference`),
    per layer pair × objective: ``seeds``, ``mean``, ``std``, ``low``, ``high`` (95 % t interval; NaN with
    one seed) and ``beyond_noise`` (the interval excludes 0). Both arms of a seed share its reference
    accuracy, so the difference is the same for ``penalty`` and ``penalty_min`` (standard − IRI stitched
    accuracy). Empty without an IRI arm."""
    columns = ["layer_a", "layer_b", "objective", "seeds", "mean", "std", "low", "high", "beyond_noise"]
    if not len(table) or "iri" not in set(table.setting):
        return pd.DataFrame(columns=columns)
    rows = []
    for (la, lb, objective), group in table.groupby(["layer_a", "layer_b", "objective"], sort=False):
        arms = group.pivot_table(index="seed", columns="setting", values="penalty", aggfunc="first")
        interval = paired_difference(arms["iri"].to_numpy(float), arms["standard"].to_numpy(float))
        rows.append({"layer_a": la, "layer_b": lb, "objective": objective, "seeds": interval.n,
                     "mean": interval.mean, "std": interval.std, "low": interval.low, "high": interval.high,
                     "beyond_noise": beyond_noise(interval)})
    return pd.DataFrame(rows, columns=columns)


def objective_differences(table: pd.DataFrame, objectives: list[str]) -> dict[str, dict[str, Any]]:
    """Per objective: the IRI − standard penalty averaged over layer pairs within each seed, paired by
    seed, as :meth:`simkit.stats.Interval.as_dict` plus ``beyond_noise``; {} without an IRI arm."""
    if not len(table) or "iri" not in set(table.setting):
        return {}
    found = {}
    for objective in objectives:
        part = table[table.objective == objective]
        per_seed = part.pivot_table(index="seed", columns="setting", values="penalty", aggfunc="mean")
        interval = paired_difference(per_seed["iri"].to_numpy(float), per_seed["standard"].to_numpy(float))
        found[objective] = {**interval.as_dict(), "beyond_noise": beyond_noise(interval)}
    return found


def summarize(table: pd.DataFrame, objectives: list[str], arms: list[str], a_acc: float, b_acc: float,
              out: ArmRows, labels: Tensor | None, tol: float, n_pairs: int) -> dict[str, Any]:
    """The result's summary: accuracies (means over seeds, and per seed), IRI quality, mean penalty and
    penalty_min per objective and arm (over pairs and seeds), per arm the penalty and penalty_min
    averaged over pairs and objectives within each seed with their t interval over seeds
    (``penalty_over_seeds``), the paired IRI − standard differences per objective
    (``iri_minus_standard``), warnings."""
    summary: dict[str, Any] = {"a_accuracy": a_acc, "b_accuracy": b_acc, "iri_relative_error_median": None,
                               "iri_converged_fraction": None}
    converged = {out.layer_label(k): float(s.reached.double().mean()) for k, s in out.iri_sets.items()}
    medians = {out.layer_label(k): float(s.rel_error.median()) for k, s in out.iri_sets.items()}
    if out.iri_sets:
        summary["iri_relative_error_median"] = float(torch.cat([s.rel_error for s in out.iri_sets.values()]).median())
        summary["iri_converged_fraction"] = min(converged.values())
    for objective in objectives:
        for arm in arms:
            part = table[(table.objective == objective) & (table.setting == arm)]
            summary[f"mean_penalty_{objective}_{arm}"] = float(part.penalty.mean())
            summary[f"mean_penalty_min_{objective}_{arm}"] = float(part.penalty_min.mean())
    summary["pairs"] = n_pairs
    summary["chance_accuracy"] = chance_accuracy(labels) if labels is not None else None
    summary["seeds"] = [int(r["seed"]) for r in out.accuracies]
    summary["a_accuracies"] = [r["a_accuracy"] for r in out.accuracies]
    summary["b_accuracies"] = [r["b_accuracy"] for r in out.accuracies]
    summary["iri_minus_standard"] = objective_differences(table, objectives)
    summary["penalty_over_seeds"] = {
        arm: {m: t_interval(table[table.setting == arm].groupby("seed")[m].mean().to_numpy(float)).as_dict()
              for m in ("penalty", "penalty_min")} for arm in arms}
    accuracies = {"model A": a_acc, "model B": b_acc} if not out.several else {
        f"model {m} (seed {r['seed']})": r[f"{m.lower()}_accuracy"] for m in ("A", "B") for r in out.accuracies}
    radius = next((s.radius for s in out.iri_sets.values()), None)
    summary["warnings"] = run_warnings(accuracies, labels, converged, medians, tol, radius)
    return summary


def _iri_table(out: ArmRows) -> pd.DataFrame:
    """One row per (seed, layer of A) with IRIs: their summary, tolerance, cache use and diagnostics
    (distance from the seed input, B's labels on them); a bounded search adds ``radius``, ``norm``,
    ``reached_inside_radius_fraction`` and ``distance_median`` (in the ball's norm)."""
    return pd.DataFrame([{"layer_a": la, **s.summary(), "iri_converged_fraction": s.summary()["reached_fraction"],
                          "tol": s.tol, "cache": out.iri_cache[(seed, la)]["cache"], "seed": seed,
                          **({} if s.radius is None else {"norm": s.norm}),
                          **out.iri_diagnostics.get((seed, la), {})}
                         for (seed, la), s in out.iri_sets.items()])


def _extra(prep: Prepared, facts: RunFacts, out: ArmRows) -> dict[str, Any]:
    """The result's extra: pair depths, IRI error histograms and examples (first seed), objective
    descriptions."""
    first = facts.seeds[0]
    sets = {la: s for (seed, la), s in out.iri_sets.items() if seed == first}
    return {
        "pairs": [{"layer_a": la, "layer_b": lb, "depth_a": relative_depth(facts.model_a, la),
                   "depth_b": relative_depth(facts.model_b, lb)} for la, lb in prep.pairs],
        "iri_histograms": {la: histogram(s.rel_error) for la, s in sets.items()},
        "iri_examples": {la: examples(prep.x_train, s, prep.settings.examples) for la, s in sets.items()},
        "objective_descriptions": {k: DESCRIPTIONS[k] for k in prep.objectives},
    }


def _meta(prep: Prepared, facts: RunFacts, out: ArmRows, timer: Timer) -> dict[str, Any]:
    """The result's meta: inputs, sizes, settings, IRI and cache facts, cut modes, device, timings."""
    settings = prep.settings
    return run_meta(
        model_a=prep.names[0], model_b=prep.names[1], data=prep.data.spec, n=settings.n, seed=settings.seed,
        seeds=facts.seeds, seed_models=facts.seed_models, weights=facts.weights,
        n_train=len(prep.train), n_test=len(prep.test), n_val=0 if prep.x_val is None else len(prep.x_val),
        validation=None if prep.x_val is None else {"every": settings.val_every, "fraction": settings.val_fraction,
                                                   "score": "accuracy" if prep.y_val is not None else "-loss"},
        test_data=None if prep.test_data is None else prep.test_data.spec, objectives=prep.objectives,
        settings=out.arms, pairs=[list(p) for p in prep.pairs], init=settings.init,
        train={"steps": settings.steps, "batch_size": settings.batch_size, "lr": settings.lr, "optimizer": "adam"},
        train_models_epochs=settings.train,
        iri=asdict(settings.iri_settings()) if settings.iri else None,
        value_range=list(facts.value_range), value_range_source=facts.range_source,
        cache_dir=None if facts.cache_dir is None else str(facts.cache_dir),
        iri_cache={out.layer_label(k): v for k, v in out.iri_cache.items()}, cut=out.cut_modes,
        device=str(prep.dev), options=settings.to_dict(), timings=timer.seconds)


def assemble(prep: Prepared, facts: RunFacts, out: ArmRows, timer: Timer) -> StitchResult:
    """The StitchResult of the run; the summary's warnings are also raised (pointing at the caller of
    ``stitch``, which calls this directly)."""
    table = pd.DataFrame(out.rows, columns=COLUMNS)
    summary = summarize(table, prep.objectives, out.arms, facts.a_acc, facts.b_acc, out, prep.y_test,
                        prep.settings.iri_settings().tol, len(prep.pairs))
    for message in summary["warnings"]:
        warnings.warn(message, stacklevel=3)
    iri_table = _iri_table(out)
    extra = _extra(prep, facts, out)
    meta = _meta(prep, facts, out, timer)
    tables = {"stitching": table, "training": pd.DataFrame(out.train_rows), "stitching_mean": aggregate(table)}
    differences = iri_differences(table)
    if len(differences):
        tables["iri_differences"] = differences
    if len(iri_table):
        tables["iris"] = iri_table
    return StitchResult(summary=summary, tables=tables, meta=meta, extra=extra)
