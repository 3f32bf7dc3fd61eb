"""Channel-wise against layer-wise accuracy at matched NAPL (or matched fraction of units linearized),
per seed and over seeds.

Within one seed, runs of a granularity that reach the same NAPL (to :data:`NAPL_DIGITS` decimals) are
one point: the run with the weakest ω that reaches it (``duplicates="weakest"``, the default: the
lightest penalty that gets the network there, so a harsher ω that overshoots in accuracy loss is not
mixed in), or the mean of their accuracies (``duplicates="mean"``, the earlier rule); never an
interpolation over duplicate x values. Every point carries the mean |1 − α| over units of the run(s)
behind it (``layer_mean_abs_one_minus_alpha`` / ``channel_mean_abs_one_minus_alpha``, interpolated like
the accuracy; NaN when the runs table has no ``mean_abs_one_minus_alpha``), so how linear the "nonlinear"
units really are is read beside every matched point. Every distinct layer-wise NAPL is then matched with the
channel-wise accuracy at that NAPL: the channel-wise point itself when one lies there (``exact``),
linear interpolation between the two channel-wise points around it (``interpolated``), or, outside
the channel-wise range, the nearest channel-wise point (``nearest``: not a match, only a hint).
The same matching on another x (``x="linearized_fraction"``: the fraction of units whose slope is 1)
gives the comparison at equal fraction linearized; its tables name that column instead of ``napl``.
The same matching of another accuracy column (``value="accuracy_recovered"``: after recovery
fine-tuning) keeps the column names ``layer_accuracy`` / ``channel_accuracy``. ``channel_omega`` names
the ω of the channel-wise runs a match comes from (both neighbours' when interpolated, "a | b"), beside
``layer_omega``, so the penalty strengths behind every matched point can be compared.

Over seeds, the channel − layer difference is paired by seed (both granularities start from the same
network of that seed): its mean, std, 95 % t interval (``difference_low``, ``difference_high``) and the
verdict of "channel-wise keeps more accuracy" come from :mod:`simkit.stats`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from simkit.errors import SimkitError
from simkit.linearization.aggregate import napl_key, spread
from simkit.linearization.labels import omega_text
from simkit.stats import paired_difference, verdict

MATCHED_COLUMNS = ["seed", "napl", "layer_omega", "layer_runs", "layer_accuracy", "channel_accuracy",
                   "channel_runs", "difference", "how", "channel_omega", "layer_mean_abs_one_minus_alpha",
                   "channel_mean_abs_one_minus_alpha"]
MATCHED_MEAN_COLUMNS = ["napl", "seeds", "matched_seeds", "layer_accuracy_mean", "layer_accuracy_std",
                        "channel_accuracy_mean", "channel_accuracy_std", "difference_mean", "difference_std",
                        "difference_low", "difference_high", "difference_min", "difference_max", "verdict",
                        "layer_mean_abs_one_minus_alpha_mean", "channel_mean_abs_one_minus_alpha_mean"]
#: how runs of one granularity at one NAPL become one point
DUPLICATE_RULES = ("weakest", "mean")
DEVIATION = "mean_abs_one_minus_alpha"


def _columns(columns: list[str], x: str) -> list[str]:
    return [x if c == "napl" else c for c in columns]


def _points(runs: pd.DataFrame, x: str = "napl", value: str = "accuracy", duplicates: str = "weakest") -> pd.DataFrame:
    """One row per distinct ``x`` of ``runs`` (one granularity, one seed), sorted by it: ``value`` of the
    run with the smallest ω there (``duplicates="weakest"``) or the mean over its runs (``"mean"``), how
    many runs reached it, the ω value(s) used as text and their mean |1 − α| (NaN without that column);
    the columns are called ``napl``, ``accuracy``, ``runs``, ``omega``, ``deviation`` here."""
    if duplicates not in DUPLICATE_RULES:
        raise SimkitError(f"`duplicates` must be one of {', '.join(DUPLICATE_RULES)}, got {duplicates!r}")
    keyed = runs.assign(key=[napl_key(v) for v in runs[x]])
    if DEVIATION not in keyed.columns:
        keyed = keyed.assign(**{DEVIATION: float("nan")})
    rows = []
    for key, group in keyed.groupby("key", sort=True):
        used = group.nsmallest(1, "omega") if duplicates == "weakest" else group
        rows.append({"napl": key, "accuracy": float(used[value].mean()), "runs": len(group),
                     "omega": ", ".join(omega_text(w) for w in sorted(used["omega"])),
                     "deviation": float(used[DEVIATION].mean())})
    return pd.DataFrame(rows, columns=["napl", "accuracy", "runs", "omega", "deviation"])


def _match(napl: float, channel: pd.DataFrame) -> tuple[float, int, str, str, float]:
    """(channel-wise accuracy at ``napl``, channel runs it comes from, how, their ω, their mean |1 − α|)
    from the channel points."""
    xs, ys, counts, omegas, devs = (channel[c].to_numpy() for c in ("napl", "accuracy", "runs", "omega", "deviation"))
    at = np.flatnonzero(xs == napl)
    if at.size:
        return float(ys[at[0]]), int(counts[at[0]]), "exact", str(omegas[at[0]]), float(devs[at[0]])
    if xs[0] < napl < xs[-1]:
        right = int(np.searchsorted(xs, napl))
        return (float(np.interp(napl, xs, ys)), int(counts[right - 1] + counts[right]), "interpolated",
                f"{omegas[right - 1]} | {omegas[right]}", float(np.interp(napl, xs, devs)))
    nearest = int(np.abs(xs - napl).argmin())
    return float(ys[nearest]), int(counts[nearest]), "nearest", str(omegas[nearest]), float(devs[nearest])


def matched_napl(runs: pd.DataFrame, x: str = "napl", value: str = "accuracy",
                 duplicates: str = "weakest") -> pd.DataFrame:
    """Channel-wise accuracy at each distinct layer-wise NAPL of each seed, and the difference
    (channel − layer); columns :data:`MATCHED_COLUMNS`, sorted by seed, then NAPL.

    runs: the runs table (granularity, omega, napl, accuracy and, for several seeds, seed). A seed
    without runs of both granularities has no rows. x: the column matched on (default ``napl``;
    ``linearized_fraction`` for equal fraction linearized), which replaces ``napl`` in the columns.
    value: the accuracy column compared (default ``accuracy``; ``accuracy_recovered`` after recovery);
    the columns keep their names. ``channel_omega``: the ω of the channel-wise point(s) used ("a | b"
    for the two neighbours of an interpolation). duplicates: ``weakest`` (the run with the smallest ω at
    one ``x``) or ``mean`` (the mean of its runs); ``*_mean_abs_one_minus_alpha``: the mean |1 − α| of the
    run(s) behind each point (the runs table's ``mean_abs_one_minus_alpha``).
    """
    runs = runs if "seed" in runs.columns else runs.assign(seed=0)
    rows: list[dict[str, Any]] = []
    for seed, group in runs.groupby("seed", sort=True):
        channel = _points(group[group["granularity"] == "channel"], x, value, duplicates)
        layer = _points(group[group["granularity"] == "layer"], x, value, duplicates)
        if channel.empty or layer.empty:
            continue
        for point in layer.itertuples(index=False):
            accuracy, count, how, omegas, deviation = _match(float(point.napl), channel)
            rows.append({"seed": int(seed), x: float(point.napl), "layer_omega": point.omega,
                         "layer_runs": int(point.runs), "layer_accuracy": float(point.accuracy),
                         "channel_accuracy": accuracy, "channel_runs": count,
                         "difference": accuracy - float(point.accuracy), "how": how, "channel_omega": omegas,
                         "layer_mean_abs_one_minus_alpha": float(point.deviation),
                         "channel_mean_abs_one_minus_alpha": deviation})
    return pd.DataFrame(rows, columns=_columns(MATCHED_COLUMNS, x))


def matched_over_seeds(matched: pd.DataFrame, x: str = "napl") -> pd.DataFrame:
    """Mean ± spread over seeds of :func:`matched_napl`'s rows at each layer-wise ``x``; columns
    :data:`MATCHED_MEAN_COLUMNS` (``x`` in place of ``napl``): ``seeds`` that reached it,
    ``matched_seeds`` of them with a real match (exact or interpolated), and over those matched seeds
    (over every seed when none matched: then the values are only nearest-run hints) the mean and std
    (ddof = 1) of each accuracy, the mean of each granularity's mean |1 − α|, the paired channel − layer difference with its 95 % t interval
    (``difference_low``/``difference_high``, NaN with one seed), its min and max, and ``verdict``:
    :func:`simkit.stats.verdict` of "channel-wise keeps more accuracy" (``too few seeds`` with one)."""
    rows = []
    for value, group in matched.groupby(x, sort=True):
        real = group[group["how"] != "nearest"]
        use = real if len(real) else group
        interval = paired_difference(use["channel_accuracy"], use["layer_accuracy"])
        rows.append({x: float(value), "seeds": len(group), "matched_seeds": len(real),
                     "layer_accuracy_mean": float(use["layer_accuracy"].mean()),
                     "layer_accuracy_std": spread(use["layer_accuracy"]),
                     "channel_accuracy_mean": float(use["channel_accuracy"].mean()),
                     "channel_accuracy_std": spread(use["channel_accuracy"]),
                     "difference_mean": float(use["difference"].mean()), "difference_std": spread(use["difference"]),
                     "difference_low": interval.low, "difference_high": interval.high,
                     "difference_min": float(use["difference"].min()), "difference_max": float(use["difference"].max()),
                     "verdict": verdict(interval, higher=True),
                     "layer_mean_abs_one_minus_alpha_mean": _mean(use["layer_mean_abs_one_minus_alpha"]),
                     "channel_mean_abs_one_minus_alpha_mean": _mean(use["channel_mean_abs_one_minus_alpha"])})
    return pd.DataFrame(rows, columns=_columns(MATCHED_MEAN_COLUMNS, x))


def _mean(values: pd.Series) -> float:
    """The mean of the finite ``values`` (NaN when none is: a runs table without |1 − α|)."""
    finite = values[np.isfinite(values.to_numpy(dtype=float))]
    return float(finite.mean()) if len(finite) else float("nan")


def lowest_matched(over_seeds: pd.DataFrame, seeds: int, original_napl: float) -> dict[str, Any] | None:
    """The row of :func:`matched_over_seeds` at the lowest NAPL in (0, ``original_napl``) matched (exact
    or interpolated) in all ``seeds`` seeds, as a dict; None when there is none. NAPL 0 is left out
    (both granularities are then the same fully linear network), and so is the original NAPL (nothing
    was linearized there)."""
    napl = over_seeds["napl"]
    ok = over_seeds[(napl > 0) & (napl < napl_key(original_napl)) & (over_seeds["matched_seeds"] == seeds)]
    return None if ok.empty else ok.sort_values("napl").iloc[0].to_dict()


def highest_matched(over_seeds: pd.DataFrame, seeds: int) -> dict[str, Any] | None:
    """The row of ``matched_over_seeds(..., x="linearized_fraction")`` at the highest fraction in (0, 1)
    matched in all ``seeds`` seeds, as a dict; None when there is none (fraction 0: nothing linearized,
    fraction 1: the same fully linear network at either granularity)."""
    if "linearized_fraction" not in over_seeds.columns or over_seeds.empty:
        return None
    fraction = over_seeds["linearized_fraction"]
    ok = over_seeds[(fraction > 0) & (fraction < 1) & (over_seeds["matched_seeds"] == seeds)]
    return None if ok.empty else ok.sort_values("linearized_fraction").iloc[-1].to_dict()


__all__ = ["DUPLICATE_RULES", "MATCHED_COLUMNS", "MATCHED_MEAN_COLUMNS", "highest_matched", "lowest_matched", "matched_napl",
           "matched_over_seeds"]
