"""Mean ± spread over seeds of a linearization sweep's tables (runs, distributions, layers, CKA).

The spread is the sample standard deviation over seeds (ddof = 1; NaN with one seed), with the
minimum and maximum beside it where a verdict needs them. NAPL values are grouped after rounding to
:data:`NAPL_DIGITS` decimals, so runs whose NAPL differ only by float rounding count as one value.
Every aggregated row carries ``run``, the granularity × ω label without a seed (``channel ω=0.01``;
"original" for the original network), which is what the report draws.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simkit.linearization.labels import run_label
from simkit.stats import paired_difference

NAPL_DIGITS = 9
AGGREGATED = ("napl", "accuracy", "nonlinear_fraction", "apl", "frozen_fraction", "linearized_fraction",
              "mean_abs_one_minus_alpha", "accuracy_recovered")


def spread(values) -> float:
    """Sample standard deviation (ddof = 1) of ``values``; NaN for fewer than two values."""
    values = np.asarray(values, dtype=float)
    return float(values.std(ddof=1)) if len(values) > 1 else float("nan")


def napl_key(napl) -> float:
    """``napl`` rounded to :data:`NAPL_DIGITS` decimals: the value runs are grouped by."""
    return round(float(napl), NAPL_DIGITS)


def label(granularity: str, omega: float) -> str:
    """The granularity × ω label of aggregated rows; "original" for the original network's rows."""
    return "original" if granularity == "original" or math.isnan(float(omega)) else run_label(granularity, omega)


def aggregate_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per granularity × ω (in sweep order): ``run``, ``seeds`` and, for each of
    :data:`AGGREGATED` that ``runs`` has, ``<name>_mean`` and ``<name>_std`` over the seeds (ddof = 1).
    With ``accuracy_recovered`` (a sweep with recovery) also the recovery gain, accuracy_recovered −
    accuracy paired by seed: ``recovery_gain_mean``, ``_std`` and its 95 % t interval ``_low``, ``_high``
    (NaN with one seed). runs: the runs table (with a ``seed`` column)."""
    names = [c for c in AGGREGATED if c in runs.columns]
    gain = "accuracy_recovered" in runs.columns
    columns = ["run", "granularity", "omega", "seeds"] + [f"{c}_{s}" for c in names for s in ("mean", "std")]
    columns += [f"recovery_gain_{s}" for s in ("mean", "std", "low", "high")] if gain else []
    rows = []
    for (granularity, omega), group in runs.groupby(["granularity", "omega"], sort=False):
        row = {"run": label(granularity, omega), "granularity": granularity, "omega": float(omega),
               "seeds": int(group["seed"].nunique())}
        for name in names:
            row[f"{name}_mean"] = float(group[name].mean())
            row[f"{name}_std"] = spread(group[name])
        if gain:
            interval = paired_difference(group["accuracy_recovered"], group["accuracy"])
            row.update(recovery_gain_mean=interval.mean, recovery_gain_std=interval.std,
                       recovery_gain_low=interval.low, recovery_gain_high=interval.high)
        rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def mean_over_seeds(frame: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """``value``'s mean and std (ddof = 1) over seeds for each combination of ``keys`` (which start
    with granularity and omega; ω NaN groups as one key), in first-seen order; columns ``run``,
    ``keys``, ``seeds``, ``<value>_mean``, ``<value>_std``. An empty frame gives an empty table."""
    columns = ["run", *keys, "seeds", f"{value}_mean", f"{value}_std"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for key, group in frame.groupby(keys, sort=False, dropna=False):
        row = dict(zip(keys, key, strict=True))
        rows.append({"run": label(row["granularity"], row["omega"]), **row, "seeds": int(group["seed"].nunique()),
                     f"{value}_mean": float(group[value].mean()), f"{value}_std": spread(group[value])})
    return pd.DataFrame(rows, columns=columns)


__all__ = ["AGGREGATED", "NAPL_DIGITS", "aggregate_runs", "label", "mean_over_seeds", "napl_key", "spread"]
