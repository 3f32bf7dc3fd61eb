"""Over seeds: the tables of every seed in one (a ``seed`` column), ``aggregate`` (per arm the mean,
standard deviation and 95 % t interval of the test score over seeds, and the difference from scratch
paired by seed), and the headline numbers of the summary.

Every interval comes from :mod:`simkit.stats` (``t_interval``, ``paired_difference``, ``beyond_noise``):
Student's t over the per-seed values; with one seed the interval bounds are None ("one seed, no
interval") and nothing is beyond noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from simkit.stats import Interval, beyond_noise, paired_difference, t_interval

ARM = ["schedule", "metric", "guide_init", "rank"]
ROLES = ("guide", "probe", "converted", "scratch", "kd")


def combine(per_seed: Sequence[tuple[int, dict[str, pd.DataFrame]]]) -> dict[str, pd.DataFrame]:
    """The tables of every seed concatenated in seed order, each row with its ``seed``; a table only some
    seeds have is kept with theirs."""
    names = list(dict.fromkeys(name for _, tables in per_seed for name in tables))
    out: dict[str, pd.DataFrame] = {}
    for name in names:
        parts = [t[name].assign(seed=seed) if "seed" not in t[name].columns else t[name]
                 for seed, t in per_seed if name in t]
        out[name] = pd.concat(parts, ignore_index=True)
    return out


def _plain(value: float) -> float | None:
    """A float, or None for NaN (strict JSON has no NaN; ``result.json`` writes null)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _interval_fields(interval: Interval, prefix: str) -> dict[str, Any]:
    """``<prefix>`` (the mean), ``<prefix>_std``, ``_low``, ``_high`` (None with one seed)."""
    return {prefix: _plain(interval.mean), f"{prefix}_std": _plain(interval.std),
            f"{prefix}_low": _plain(interval.low), f"{prefix}_high": _plain(interval.high)}


def paired_gain(better: Sequence[float] | np.ndarray, scratch: Sequence[float] | np.ndarray,
                higher: bool) -> Interval:
    """``better`` − ``scratch`` paired by seed, in the score's better direction (for perplexity scratch −
    ``better``)."""
    return paired_difference(better, scratch) if higher else paired_difference(scratch, better)


def _row(role: str, labels: dict[str, Any], values: pd.Series, score: str) -> dict[str, Any]:
    interval = t_interval(values.astype(float))
    return {"role": role, **labels, "seeds": interval.n, **interval.as_dict(f"{score}_")}


def _with_gain(row: dict[str, Any], values: pd.Series, scratch: pd.Series | None, higher: bool) -> dict[str, Any]:
    """``row`` with the difference from scratch paired by seed (``gain_over_scratch_mean``, ``_std``,
    ``_low``, ``_high``, ``beyond_noise``) when there is a scratch baseline."""
    if scratch is None:
        return row
    interval = paired_gain(values.astype(float).to_numpy(), scratch.astype(float).to_numpy(), higher)
    return {**row, **{k: v for k, v in interval.as_dict("gain_over_scratch_").items()
                      if k.endswith(("mean", "std", "low", "high"))}, "beyond_noise": beyond_noise(interval)}


def aggregate(runs: pd.DataFrame, score: str, higher: bool) -> pd.DataFrame:
    """One row per arm and role over seeds: ``role`` (converted, probe, guide, scratch, kd), the arm
    columns, ``seeds``, ``<score>_mean``, ``_std``, ``_low``, ``_high`` (95 % t interval), ``_n``,
    ``_confidence``; for converted and kd rows also the difference from scratch paired by seed
    (``gain_over_scratch_mean`` ... ``_high``, ``beyond_noise``: the interval excludes 0), and the
    labelled-training epochs and optimizer steps (means over seeds). runs: the combined runs table."""
    by_seed = runs.drop_duplicates("seed").set_index("seed")
    scratch = by_seed[f"scratch_{score}"] if by_seed[f"scratch_{score}"].notna().any() else None
    out: list[dict[str, Any]] = []
    for key, part in runs.groupby(ARM, sort=False):
        labels = dict(zip(ARM, key, strict=True))
        part = part.set_index("seed")
        budget = {"labelled_epochs_mean": float(part["labelled_epochs"].mean()),
                  "steps_mean": float(part["steps"].mean())}
        out.append({**_with_gain(_row("converted", labels, part[f"converted_{score}"], score),
                                 part[f"converted_{score}"], scratch_of(scratch, part.index), higher), **budget})
        out.append(_row("probe", labels, part[f"probe_{score}"], score))
    for gi, part in runs.drop_duplicates(["seed", "guide_init"]).groupby("guide_init", sort=False):
        part = part.set_index("seed")
        empty = {"schedule": "", "metric": "", "rank": None}
        out.append(_row("guide", {**empty, "guide_init": gi}, part[f"guide_{score}"], score))
        if part[f"kd_{score}"].notna().any():
            row = _with_gain(_row("kd", {**empty, "guide_init": gi}, part[f"kd_{score}"], score),
                             part[f"kd_{score}"], scratch_of(scratch, part.index), higher)
            out.append({**row, "labelled_epochs_mean": float(part["kd_labelled_epochs"].mean()),
                        "steps_mean": float(part["kd_steps"].mean())})
    if scratch is not None:
        out.append({**_row("scratch", {"schedule": "", "metric": "", "guide_init": "", "rank": None}, scratch, score),
                    "labelled_epochs_mean": float(by_seed["scratch_labelled_epochs"].mean()),
                    "steps_mean": float(by_seed["scratch_steps"].mean())})
    return pd.DataFrame(out)


def scratch_of(scratch: pd.Series | None, seeds: pd.Index) -> pd.Series | None:
    """The scratch scores of ``seeds`` (in their order), None without a scratch baseline."""
    return None if scratch is None else scratch.reindex(seeds)


def _mean(values: pd.Series) -> float | int | None:
    """The mean over seeds: an int when every seed has the same whole number, None when there is none."""
    values = values.dropna()
    if values.empty:
        return None
    if values.nunique() == 1 and float(values.iloc[0]).is_integer():
        return int(values.iloc[0])
    return round(float(values.mean()), 3)


def headline(runs: pd.DataFrame, score: str, higher: bool) -> dict[str, Any]:
    """The summary's numbers for the first arm over seeds: each role's mean score with its std and 95 % t
    interval (``converted_<score>``, ``converted_<score>_std``, ``_low``, ``_high``, ...), converted −
    scratch paired by seed (``gain_over_scratch`` and its ``_std``, ``_low``, ``_high``,
    ``gain_beyond_noise``), the budgets (means over seeds) and ``still_improving`` flags (any seed)."""
    first = runs.iloc[0]
    arm = runs[(runs[ARM] == first[ARM]).all(axis=1)].set_index("seed")
    out: dict[str, Any] = {}
    for role in ROLES:
        column = f"{role}_{score}"
        if column in arm.columns and arm[column].notna().any():
            out.update(_interval_fields(t_interval(arm[column].astype(float)), column))
    gain: Interval | None = None
    if f"scratch_{score}" in arm.columns and arm[f"scratch_{score}"].notna().any():
        gain = paired_gain(arm[f"converted_{score}"].astype(float).to_numpy(),
                           arm[f"scratch_{score}"].astype(float).to_numpy(), higher)
    out.update(_interval_fields(gain, "gain_over_scratch") if gain is not None else {"gain_over_scratch": None})
    out["gain_beyond_noise"] = beyond_noise(gain) if gain is not None else None
    budgets = {"converted_steps": "steps", "align_steps": "align_steps", "labelled_epochs": "labelled_epochs",
               "scratch_steps": "scratch_steps", "scratch_labelled_epochs": "scratch_labelled_epochs",
               "kd_steps": "kd_steps", "kd_labelled_epochs": "kd_labelled_epochs"}
    for key, column in budgets.items():
        out[key] = _mean(arm[column]) if column in arm.columns else None
    for key in ("still_improving", "scratch_still_improving"):
        out[key] = bool(arm[key].fillna(False).astype(bool).any()) if key in arm.columns else None
    out["seeds"] = [int(s) for s in arm.index]
    return out
