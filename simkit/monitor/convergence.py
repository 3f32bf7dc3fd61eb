"""When each layer settles: the step from which its similarity stays within δ of its final value, and
whether layers settle bottom-up (SVCCA's observation, Raghu et al. 2017).

``convergence(steps, delta)`` → one row per metric × layer pair: ``final_value`` (at the last step),
``stable_step`` (the first step after which every value is within ``delta`` of the final one; NaN
values never are), ``final_step``. ``depth_order(convergence, metric)`` → the order of the same-position
pairs' stable steps over depth: ``bottom-up`` (never earlier for a deeper layer, and later for at least
one), ``top-down``, ``together`` (all equal) or ``mixed``, with Spearman's rank correlation of depth and
stable step (NaN with fewer than three layers or no spread).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

CONVERGENCE_COLUMNS = ("metric", "layer", "reference_layer", "depth", "reference_depth", "final_value",
                       "stable_step", "final_step")


def stable_step(steps: np.ndarray, values: np.ndarray, delta: float) -> float:
    """The first of ``steps`` (ascending) from which every value is within ``delta`` of the last value."""
    final = values[-1]
    if not math.isfinite(final):
        return math.nan
    with np.errstate(invalid="ignore"):
        within = np.abs(values - final) <= delta
    outside = np.flatnonzero(~within)
    first = 0 if outside.size == 0 else int(outside[-1]) + 1
    return float(steps[first])


def convergence(steps: pd.DataFrame, delta: float) -> pd.DataFrame:
    """One row per metric × layer pair of ``steps`` (the long table): :data:`CONVERGENCE_COLUMNS`."""
    rows = []
    keys = ["metric", "layer", "reference_layer", "depth", "reference_depth"]
    for key, part in steps.groupby(keys, sort=False):
        part = part.sort_values("step", kind="stable")
        step_values = part["step"].to_numpy()
        values = part["value"].to_numpy(dtype=np.float64)
        rows.append({**dict(zip(keys, key, strict=True)), "final_value": float(values[-1]),
                     "stable_step": stable_step(step_values, values, delta), "final_step": int(step_values[-1])})
    frame = pd.DataFrame(rows, columns=list(CONVERGENCE_COLUMNS))
    return frame.sort_values(["metric", "depth", "reference_depth"], kind="stable").reset_index(drop=True)


def depth_order(table: pd.DataFrame, metric: str) -> dict[str, Any]:
    """``{"order", "rank_correlation", "stable_steps"}`` of ``metric``'s same-position pairs by depth."""
    same = table[(table["metric"] == metric) & (table["depth"] == table["reference_depth"])].sort_values("depth")
    steps = same["stable_step"].to_numpy(dtype=np.float64)
    known = steps[np.isfinite(steps)]
    order = "unknown"
    if known.size >= 2 and known.size == steps.size:
        gaps = np.diff(steps)
        order = ("together" if np.all(gaps == 0) else "bottom-up" if np.all(gaps >= 0)
                 else "top-down" if np.all(gaps <= 0) else "mixed")
    return {"order": order, "rank_correlation": rank_correlation(same["depth"].to_numpy(), steps),
            "stable_steps": {str(layer): (None if not math.isfinite(s) else int(s))
                             for layer, s in zip(same["layer"], steps, strict=True)}}


def rank_correlation(depths: np.ndarray, steps: np.ndarray) -> float:
    """Spearman's ρ of depth and stable step over the layers with a finite step (NaN without 3 of them or
    without spread)."""
    from scipy.stats import spearmanr

    keep = np.isfinite(steps)
    if keep.sum() < 3 or np.ptp(steps[keep]) == 0:
        return math.nan
    return float(spearmanr(depths[keep], steps[keep]).statistic)
