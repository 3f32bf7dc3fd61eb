"""Channel-wise against layer-wise accuracy at matched NAPL, per seed and over seeds.

Within one seed, runs of a granularity that reach the same NAPL (to :data:`NAPL_DIGITS` decimals) are
one point: the mean of their accuracies (never one of them picked arbitrarily, and never an
interpolation over duplicate x values). Every distinct layer-wise NAPL is then matched with the
channel-wise accuracy at that NAPL: the channel-wise point itself when one lies there (``exact``),
linear interpolation between the two channel-wise points around it (``interpolated``), or, outside
the channel-wise range, the nearest channel-wise point (``nearest``: not a match, only a hint).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from simkit.linearization.aggregate import napl_key, spread
from simkit.linearization.labels import omega_text

MATCHED_COLUMNS = ["seed", "napl", "layer_omega", "layer_runs", "layer_accuracy", "channel_accuracy",
                   "channel_runs", "difference", "how"]
MATCHED_MEAN_COLUMNS = ["napl", "seeds", "matched_seeds", "layer_accuracy_mean", "layer_accuracy_std",
                        "channel_accuracy_mean", "channel_accuracy_std", "difference_mean", "difference_std",
                        "difference_min", "difference_max"]


def _points(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct NAPL of ``runs`` (one granularity, one seed), sorted by NAPL: the mean
    accuracy, how many runs, and their ω values as text."""
    keyed = runs.assign(key=[napl_key(v) for v in runs["napl"]])
    rows = [{"napl": key, "accuracy": float(group["accuracy"].mean()), "runs": len(group),
             "omega": ", ".join(omega_text(w) for w in sorted(group["omega"]))}
            for key, group in keyed.groupby("key", sort=True)]
    return pd.DataFrame(rows, columns=["napl", "accuracy", "runs", "omega"])


def _match(napl: float, channel: pd.DataFrame) -> tuple[float, int, str]:
    """(channel-wise accuracy at ``napl``, channel runs it comes from, how) from the channel points."""
    xs, ys, counts = (channel[c].to_numpy() for c in ("napl", "accuracy", "runs"))
    at = np.flatnonzero(xs == napl)
    if at.size:
        return float(ys[at[0]]), int(counts[at[0]]), "exact"
    if xs[0] < napl < xs[-1]:
        right = int(np.searchsorted(xs, napl))
        return float(np.interp(napl, xs, ys)), int(counts[right - 1] + counts[right]), "interpolated"
    nearest = int(np.abs(xs - napl).argmin())
    return float(ys[nearest]), int(counts[nearest]), "nearest"


def matched_napl(runs: pd.DataFrame) -> pd.DataFrame:
    """Channel-wise accuracy at each distinct layer-wise NAPL of each seed, and the difference
    (channel − layer); columns :data:`MATCHED_COLUMNS`, sorted by seed, then NAPL.

    runs: the runs table (granularity, omega, napl, accuracy and, for several seeds, seed). A seed
    without runs of both granularities has no rows.
    """
    runs = runs if "seed" in runs.columns else runs.assign(seed=0)
    rows: list[dict[str, Any]] = []
    for seed, group in runs.groupby("seed", sort=True):
        channel = _points(group[group["granularity"] == "channel"])
        layer = _points(group[group["granularity"] == "layer"])
        if channel.empty or layer.empty:
            continue
        for point in layer.itertuples(index=False):
            accuracy, count, how = _match(float(point.napl), channel)
            rows.append({"seed": int(seed), "napl": float(point.napl), "layer_omega": point.omega,
                         "layer_runs": int(point.runs), "layer_accuracy": float(point.accuracy),
                         "channel_accuracy": accuracy, "channel_runs": count,
                         "difference": accuracy - float(point.accuracy), "how": how})
    return pd.DataFrame(rows, columns=MATCHED_COLUMNS)


def matched_over_seeds(matched: pd.DataFrame) -> pd.DataFrame:
    """Mean ± spread over seeds of :func:`matched_napl`'s rows at each layer-wise NAPL; columns
    :data:`MATCHED_MEAN_COLUMNS`: ``seeds`` that reached the NAPL, ``matched_seeds`` of them with a
    real match (exact or interpolated), and the mean, std (ddof = 1), min and max over those matched
    seeds (over every seed when none matched: then the values are only nearest-run hints)."""
    rows = []
    for napl, group in matched.groupby("napl", sort=True):
        real = group[group["how"] != "nearest"]
        use = real if len(real) else group
        rows.append({"napl": float(napl), "seeds": len(group), "matched_seeds": len(real),
                     "layer_accuracy_mean": float(use["layer_accuracy"].mean()),
                     "layer_accuracy_std": spread(use["layer_accuracy"]),
                     "channel_accuracy_mean": float(use["channel_accuracy"].mean()),
                     "channel_accuracy_std": spread(use["channel_accuracy"]),
                     "difference_mean": float(use["difference"].mean()), "difference_std": spread(use["difference"]),
                     "difference_min": float(use["difference"].min()), "difference_max": float(use["difference"].max())})
    return pd.DataFrame(rows, columns=MATCHED_MEAN_COLUMNS)


def lowest_matched(over_seeds: pd.DataFrame, seeds: int, original_napl: float) -> dict[str, Any] | None:
    """The row of :func:`matched_over_seeds` at the lowest NAPL in (0, ``original_napl``) matched (exact
    or interpolated) in all ``seeds`` seeds, as a dict; None when there is none. NAPL 0 is left out
    (both granularities are then the same fully linear network), and so is the original NAPL (nothing
    was linearized there)."""
    napl = over_seeds["napl"]
    ok = over_seeds[(napl > 0) & (napl < napl_key(original_napl)) & (over_seeds["matched_seeds"] == seeds)]
    return None if ok.empty else ok.sort_values("napl").iloc[0].to_dict()


__all__ = ["MATCHED_COLUMNS", "MATCHED_MEAN_COLUMNS", "lowest_matched", "matched_napl", "matched_over_seeds"]
