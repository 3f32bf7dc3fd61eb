"""Report context of a ``linearize`` result: findings, accuracy vs NAPL with error bars over seeds,
path-length histograms with their Binomial fit, nonlinear fractions and CKA heatmaps, then tables.

Reads only the result's tables and summary: the means and spreads over seeds come from the
``aggregate``, ``matched_mean``, ``distributions_mean``, ``layers_mean`` and ``cka_mean`` tables the
runner wrote (a result written before seeds existed is read as one seed). The Binomial fit of a
histogram is the one Binomial with the histogram's support and mean: k_min + Binomial(n, p) with
n = k_max − k_min and p = (NAPL − k_min) / n (a stem plus n one-activation residual blocks gives
exactly 1 + Binomial(n, ½)).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from simkit.report.figures import format_number, heatmap_svg, img, line_plot, new_figure
from simkit.stats import Interval, beyond_noise, binomial_se, paired_difference, verdict

_COLOURS = {"channel": "#0072B2", "layer": "#D55E00"}  # Okabe–Ito blue and vermillion: colour-blind safe
NEAR_CHANCE = 0.1   # an original within this much of chance accuracy is flagged
KEPT = 0.01         # "keeps the original's accuracy": within 0.01 of it (accuracies are fractions)


def _num(value: Any) -> float:
    """``value`` as a float (None and missing as NaN)."""
    return float("nan") if value is None else float(value)


def _pm(mean: float, std: float, digits: int = 3) -> str:
    """``mean ± std`` (``mean`` alone when std is NaN: one seed)."""
    return f"{mean:.{digits}f}" if math.isnan(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def _runs(result) -> pd.DataFrame:
    """The runs table with ``seed`` and ``run`` columns (added for results of one seed written before them)."""
    runs = result.tables["runs"]
    if "seed" not in runs.columns:
        runs = runs.assign(seed=0)
    if "run" not in runs.columns:
        runs = runs.assign(run=[f"{g} ω={w:g}" for g, w in zip(runs["granularity"], runs["omega"], strict=True)])
    return runs


def _aggregate(result, runs: pd.DataFrame) -> pd.DataFrame:
    """The aggregate table; for an older one-seed result its runs under the aggregate's names (std NaN)."""
    if "aggregate" in result.tables:
        return result.tables["aggregate"]
    frame = runs[["run", "granularity", "omega"]].assign(seeds=1)
    for name in ("napl", "accuracy", "nonlinear_fraction", "apl", "frozen_fraction"):
        frame[f"{name}_mean"] = runs[name] if name in runs.columns else float("nan")
        frame[f"{name}_std"] = float("nan")
    return frame


# ---------------------------------------------------------------------------------------------------
# findings and cautions


def _interval(row: pd.Series | dict[str, Any], per_seed: pd.DataFrame | None, x: str) -> Interval:
    """The paired channel − layer interval of a matched-mean row: its stored ``difference_low`` /
    ``_high`` (n = matched seeds), else (a result written before them) from the per-seed matched rows
    at that x (``simkit.stats.paired_difference``)."""
    value = float(row[x])
    if "difference_low" in row:
        n = int(row["matched_seeds"]) or int(row["seeds"])
        return Interval(_num(row["difference_mean"]), _num(row["difference_std"]), _num(row["difference_low"]),
                        _num(row["difference_high"]), n)
    seeds = per_seed if per_seed is not None and not per_seed.empty else pd.DataFrame(columns=[x, "how"])
    at = seeds[np.isclose(seeds[x].astype(float), value)] if len(seeds) else seeds
    real = at[at["how"] != "nearest"]
    use = real if len(real) else at
    if use.empty:
        return Interval(_num(row["difference_mean"]), math.nan, math.nan, math.nan, 1)
    return paired_difference(use["channel_accuracy"], use["layer_accuracy"])


def _se_of_difference(a: float, b: float, n_test: Any) -> float:
    """Binomial standard error of the difference of two test accuracies on ``n_test`` samples each."""
    if n_test is None:
        return math.nan
    return math.hypot(binomial_se(a, int(n_test)), binomial_se(b, int(n_test)))


def _difference_text(interval: Interval, a: float, b: float, n_test: Any) -> str:
    """A difference with its noise: the 95 % t interval over seeds, or with one seed ± the binomial
    standard error of the two test accuracies (``a`` − ``b``, ``n_test`` samples)."""
    if interval.n >= 2:
        return interval.text(digits=3)
    se = _se_of_difference(a, b, n_test)
    if math.isnan(se):
        return f"{interval.mean:+.3f} (one seed, no interval)"
    return f"{interval.mean:+.3f} ± {se:.3f} (one seed; ± the binomial standard error on {int(n_test)} test samples)"


def _noise_text(interval: Interval) -> str:
    """Beyond noise only when the 95 % interval excludes 0 (``simkit.stats.beyond_noise``)."""
    if interval.n < 2:
        return "one seed: no seed interval, so no verdict"
    if beyond_noise(interval):
        side = "channel-wise" if interval.mean > 0 else "layer-wise"
        return f"beyond noise, {side} ahead; verdict on channel-wise ahead: {verdict(interval, higher=True)}"
    return f"within noise, the interval includes 0; verdict on channel-wise ahead: {verdict(interval, higher=True)}"


def _matched_sentence(row: pd.Series, interval: Interval, seeds: int, where: str, n_test: Any) -> str:
    over = f"mean ± std over {seeds} seeds" if seeds > 1 else "one seed"
    channel, layer = _num(row["channel_accuracy_mean"]), _num(row["layer_accuracy_mean"])
    return (f"{where}, channel-wise slopes keep test accuracy {_pm(channel, _num(row['channel_accuracy_std']))} "
            f"against {_pm(layer, _num(row['layer_accuracy_std']))} layer-wise ({over}): channel − layer = "
            f"{_difference_text(interval, channel, layer, n_test)}, {_noise_text(interval)}.")


def _unmatched_sentence(summary: dict[str, Any], matched_mean: pd.DataFrame, seeds: int) -> str:
    """Why no NAPL is compared, naming what the matched table's rows are."""
    original = round(float(summary["original_napl"]), 9)   # as the runner keys NAPL values
    napl = matched_mean["napl"].astype(float) if not matched_mean.empty else pd.Series(dtype=float)
    shown = []
    if (napl >= original).any():
        shown.append(f"NAPL {summary['original_napl']:.3g} is the original's (runs that linearized nothing)")
    if (napl == 0).any():
        shown.append("NAPL 0 is fully linear (the same network at either granularity)")
    inside = matched_mean[(napl > 0) & (napl < original)] if not matched_mean.empty else matched_mean
    if len(inside):
        shown.append("the rows in between are matched in fewer than all seeds or only by the nearest run (hints)")
    rows = f" The matched table's rows: {'; '.join(shown)}." if shown else ""
    every = " in every seed" if seeds > 1 else ""
    return (f"No layer-wise NAPL strictly between 0 and the original's {summary['original_napl']:.3g} lies within the "
            f"channel-wise runs' NAPL range{every}, so the granularities are not compared at a matched, partly "
            f"linearized NAPL; widen the ω range.{rows}")


def _matched_finding(summary: dict[str, Any], aggregate: pd.DataFrame, tables: dict[str, pd.DataFrame],
                     n_test: Any) -> str:
    """The first finding: channel − layer at the lowest matched NAPL (and at the highest matched
    fraction linearized), each with its interval and verdict; or why there is none."""
    seeds = len(summary.get("seeds", [0]))
    granularities = set(aggregate["granularity"])
    matched_mean = tables["matched_mean"]
    napl = summary.get("lowest_matched_napl")
    if napl is not None:
        row = matched_mean[np.isclose(matched_mean["napl"].astype(float), float(napl))].iloc[0]
        out = _matched_sentence(row, _interval(row, tables.get("matched"), "napl"), seeds,
                                f"At the lowest matched NAPL ({napl:.3g})", n_test)
    elif granularities >= {"channel", "layer"}:
        out = _unmatched_sentence(summary, matched_mean, seeds)
    else:
        return f"Only {'/'.join(sorted(granularities))}-wise runs: nothing to compare at matched NAPL."
    fraction = summary.get("highest_matched_fraction")
    by_fraction = tables.get("matched_fraction_mean")
    if fraction is not None and by_fraction is not None and not by_fraction.empty:
        row = by_fraction[np.isclose(by_fraction["linearized_fraction"].astype(float), float(fraction))].iloc[0]
        out += " " + _matched_sentence(row, _interval(row, tables.get("matched_fraction"), "linearized_fraction"),
                                       seeds, f"At the highest matched fraction of units linearized ({fraction:.3g})",
                                       n_test)
    return out


def _linear_stats(row: pd.Series) -> str:
    """``linearized fraction 0.50 ± 0.00, mean |1 − α| 0.42 ± 0.01`` of an aggregate row (the fraction
    read as 1 − nonlinear fraction for a result written before the column existed)."""
    if "linearized_fraction_mean" in row:
        text = f"linearized fraction {_pm(row['linearized_fraction_mean'], row['linearized_fraction_std'], 2)}"
    else:
        text = f"linearized fraction {_pm(1 - row['nonlinear_fraction_mean'], row['nonlinear_fraction_std'], 2)}"
    if "mean_abs_one_minus_alpha_mean" in row:
        text += f", mean |1 − α| {_pm(row['mean_abs_one_minus_alpha_mean'], row['mean_abs_one_minus_alpha_std'], 2)}"
    return text


def _recovery_text(row: pd.Series, epochs: Any, n_test: Any) -> str:
    """`` After 2 epochs of recovery ...`` for an aggregate row with ``accuracy_recovered_mean``, else ''."""
    if "accuracy_recovered_mean" not in row or "recovery_gain_mean" not in row:
        return ""
    gain = Interval(_num(row["recovery_gain_mean"]), _num(row["recovery_gain_std"]), _num(row["recovery_gain_low"]),
                    _num(row["recovery_gain_high"]), int(row["seeds"]))
    after, before = _num(row["accuracy_recovered_mean"]), _num(row["accuracy_mean"])
    noise = ("" if gain.n < 2 else
             "; beyond noise" if beyond_noise(gain) else "; within noise, the interval includes 0")
    count = _num(epochs)
    return (f" After {format_number(count)} epoch{'' if count == 1 else 's'} of recovery (slopes fixed, no penalty) its accuracy is "
            f"{_pm(after, _num(row['accuracy_recovered_std']))}: recovery gain "
            f"{_difference_text(gain, after, before, n_test)}{noise}.")


def _findings(summary: dict[str, Any], aggregate: pd.DataFrame, tables: dict[str, pd.DataFrame],
              meta: dict[str, Any]) -> list[str]:
    """Three findings: the matched gain, the most linear run that keeps accuracy, the original.
    Accuracies are fractions throughout; every difference comes with its interval (or standard error)."""
    n_test = meta.get("n_test")
    out = [_matched_finding(summary, aggregate, tables, n_test)]
    original = _num(summary.get("original_accuracy"))
    linearized = aggregate[aggregate["napl_mean"] < summary["original_napl"] - 1e-9]
    kept = linearized[linearized["accuracy_mean"] >= original - KEPT]
    recover = (meta.get("settings") or {}).get("recover")
    if linearized.empty:
        out.append(f"No run linearized anything: NAPL stayed at the original {summary['original_napl']:.3g}.")
    elif not kept.empty:
        best = kept.sort_values("napl_mean", kind="stable").iloc[0]
        out.append(f"The most linear run within {KEPT:g} of the original's accuracy is {best['run']}: "
                   f"NAPL {_pm(best['napl_mean'], best['napl_std'], 2)} of {summary['original_napl']:.3g}, "
                   f"{_linear_stats(best)}, accuracy {_pm(best['accuracy_mean'], best['accuracy_std'])}."
                   + _recovery_text(best, recover, n_test))
    else:
        best = linearized.sort_values("accuracy_mean", kind="stable").iloc[-1]
        out.append(f"No linearized run keeps the original's accuracy to within {KEPT:g}; the most "
                   f"accurate is {best['run']} at {_pm(best['accuracy_mean'], best['accuracy_std'])} "
                   f"(NAPL {_pm(best['napl_mean'], best['napl_std'], 2)}, {_linear_stats(best)})."
                   + _recovery_text(best, recover, n_test))
    accuracies = summary.get("original_accuracies", [original])
    out.append(f"The original network (every ReLU nonlinear) has NAPL {summary['original_napl']:.3g} and test "
               f"accuracy {_pm(original, _num(np.std(accuracies, ddof=1)) if len(accuracies) > 1 else math.nan)}.")
    return out


def _cautions(result, runs: pd.DataFrame, matched_mean: pd.DataFrame) -> list[str]:
    summary, meta = result.summary, result.meta
    out = []
    seeds = len(summary.get("seeds", [0]))
    unchanged = summary.get("unchanged_runs")
    if unchanged is None:
        unchanged = list(runs.loc[runs["frozen_fraction"] == 0, "run"]) if "frozen_fraction" in runs else []
    if unchanged:
        shown = ", ".join(unchanged[:6]) + (f" and {len(unchanged) - 6} more" if len(unchanged) > 6 else "")
        out.append(f"{len(unchanged)} of {len(runs)} runs linearized nothing (no slope reached α = 1, so NAPL stays at "
                   f"the original {summary['original_napl']:.3g}): {shown}. Raise ω, the post-training epochs or the "
                   "slope learning rate.")
    if seeds < 2:
        out.append("One seed: differences smaller than the seed-to-seed variation cannot be told from noise; run "
                   "several seeds (--seeds 3) for error bars.")
    chance = summary.get("chance_accuracy")
    original = _num(summary.get("original_accuracy"))
    if chance is not None and original <= chance + NEAR_CHANCE:
        out.append(f"The original network's test accuracy ({original:.3f}) is near chance ({chance:.3f}): linearizing "
                   "an untrained network says little; train it first (--train EPOCHS) or load trained weights.")
    if "bit_exact_at_start" in runs.columns and not runs["bit_exact_at_start"].astype(bool).all():
        bad = list(runs.loc[~runs["bit_exact_at_start"].astype(bool), "run"])
        out.append(f"The swapped network did not reproduce the original bit for bit at α = 0 in {', '.join(bad)}.")
    hints = matched_mean[matched_mean["matched_seeds"] < matched_mean["seeds"]] if not matched_mean.empty else matched_mean
    if not hints.empty:
        out.append("At layer-wise NAPL " + ", ".join(f"{v:.3g}" for v in hints["napl"]) + " the channel-wise runs of "
                   "some seeds do not reach that NAPL: their channel-wise accuracy is the nearest run's, a hint, not a "
                   "match.")
    others = [w for w in summary.get("warnings") or [] if "linearized nothing" not in w]   # those are above
    out += [f"Warning of the run: {w}" for w in others]
    if seeds > 1 and str(meta.get("seed_models", "")).startswith("copies"):
        out.append("Every seed started from the same initial weights (copies of one model): the spread covers the "
                   "batch order only, not the initialisation.")
    return out


# ---------------------------------------------------------------------------------------------------
# figures


def _accuracy_vs_napl(aggregate: pd.DataFrame, runs: pd.DataFrame, summary: dict[str, Any]):
    """Mean accuracy against mean NAPL per granularity × ω, error bars one std over seeds both ways;
    every seed's run a faint dot; the original a star."""
    fig, ax = new_figure(6.8, 4.2)
    several = aggregate["seeds"].max() > 1 if not aggregate.empty else False
    for granularity, group in aggregate.groupby("granularity", sort=False):
        colour = _COLOURS.get(str(granularity))
        group = group.sort_values("napl_mean")
        ax.errorbar(group["napl_mean"], group["accuracy_mean"],
                    xerr=group["napl_std"].fillna(0) if several else None,
                    yerr=group["accuracy_std"].fillna(0) if several else None,
                    marker="o", ms=4, capsize=3, lw=1.2, color=colour, label=f"{granularity}-wise")
        if several:
            seeds = runs[runs["granularity"] == granularity]
            ax.scatter(seeds["napl"], seeds["accuracy"], s=9, color=colour, alpha=0.3, lw=0)
        for _, row in group.iterrows():
            ax.annotate(f"ω={row['omega']:g}", (row["napl_mean"], row["accuracy_mean"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
    accuracies = summary.get("original_accuracies", [summary["original_accuracy"]])
    ax.errorbar([summary["original_napl"]], [summary["original_accuracy"]],
                yerr=[np.std(accuracies, ddof=1)] if len(accuracies) > 1 else None, marker="*", ms=12,
                color="black", capsize=3, lw=0, elinewidth=1, label="original (all ReLU)", zorder=3)
    chance = summary.get("chance_accuracy")
    if chance is not None:
        ax.axhline(chance, color="#98a2b3", lw=0.8, ls=":", label="chance")
    ax.set_xlabel("NAPL (normalised average path length)")
    ax.set_ylabel("test accuracy")
    ax.set_title("Accuracy against NAPL" + (" (mean ± std over seeds)" if several else ""), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    return img(fig, "accuracy against NAPL, channel-wise and layer-wise, error bars over seeds")


def _binomial(length: int, p: float) -> np.ndarray:
    return np.array([math.comb(length, k) * p**k * (1 - p) ** (length - k) for k in range(length + 1)])


def binomial_fit(lengths: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(k, P(k)) of k_min + Binomial(k_max − k_min, p) with the same mean as ``probs`` over ``lengths``
    (k_min, k_max: the shortest and longest lengths of probability > 1e-12); None for one length."""
    support = lengths[probs > 1e-12]
    lo, hi = int(support.min()), int(support.max())
    if hi == lo:
        return None
    p = min(max((float(lengths @ probs) - lo) / (hi - lo), 0.0), 1.0)
    return np.arange(lo, hi + 1), _binomial(hi - lo, p)


def _histograms(dists: pd.DataFrame, order: list[str]):
    """One panel per run label: mean probability per path length (error bars: std over seeds) and
    the Binomial(n, NAPL/n) fit."""
    labels = [r for r in order if r in set(dists["run"])]
    cols = min(4, len(labels))
    rows = -(-len(labels) // cols)
    fig, _ = new_figure(3.0 * cols, 2.3 * rows)
    fig.clear()
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(labels):]:
        ax.axis("off")
    fitted = []
    for ax, label in zip(axes.flat, labels, strict=False):
        frame = dists[dists["run"] == label].sort_values("length")
        lengths = frame["length"].to_numpy(dtype=int)
        probs = frame["probability_mean"].to_numpy(dtype=float)
        errors = frame["probability_std"].to_numpy(dtype=float)
        napl = float(lengths @ probs)
        ax.bar(lengths, probs, color="#8fb3d9", label="path lengths",
               yerr=None if np.isnan(errors).all() else np.nan_to_num(errors), capsize=2,
               error_kw={"elinewidth": 0.8})
        fit = binomial_fit(lengths, probs)
        if fit is not None:
            ax.plot(*fit, "k.--", lw=0.8, ms=4, label="Binomial fit")
            fitted.append(ax)
        ax.set_xticks(lengths)
        ax.set_title(f"{label}  (NAPL {napl:.3g})", fontsize=8)
        ax.set_xlabel("nonlinear units on a path", fontsize=7)
        ax.tick_params(labelsize=7)
    (fitted[0] if fitted else axes.flat[0]).legend(fontsize=6, frameon=False)   # the first panel with a fit
    fig.tight_layout()
    return img(fig, "path-length distributions with their Binomial fit")


def _wide(frame: pd.DataFrame, index: str, columns: str, values: str, col_order: list[str]) -> pd.DataFrame:
    wide = frame.pivot(index=index, columns=columns, values=values)
    return wide.reindex(index=list(dict.fromkeys(frame[index])), columns=[c for c in col_order if c in wide.columns])


def _layer_heatmap(layers: pd.DataFrame, order: list[str], several: bool):
    if layers.empty:
        return None
    wide = _wide(layers, "layer", "run", "nonlinear_fraction_mean", order)
    wide.index.name, wide.columns.name = "activation site", "run"
    return heatmap_svg(wide, title="units still nonlinear" + (" (mean of seeds)" if several else ""),
                       vmin=0.0, vmax=1.0)


def _cka_figures(cka: pd.DataFrame | None, aggregate: pd.DataFrame, order: list[str], several: bool) -> dict[str, Any]:
    if cka is None or cka.empty:
        return {"cka_diagonal": None, "cka_matrices": []}
    same = cka[cka["layer_a"] == cka["layer_b"]]
    diagonal = _wide(same, "layer_a", "run", "linear_cka_mean", order)
    diagonal.index.name, diagonal.columns.name = "activation site", "run"
    mean = " (mean of seeds)" if several else ""
    matrices = []
    for _, group in aggregate.groupby("granularity", sort=False):
        partly = group[group["napl_mean"] > 0]     # a fully linear run is the same at either granularity
        label = (partly if len(partly) else group).sort_values("napl_mean", kind="stable").iloc[0]["run"]
        rows = cka[cka["run"] == label]
        if rows.empty:
            continue
        wide = _wide(rows, "layer_a", "layer_b", "linear_cka_mean", list(dict.fromkeys(rows["layer_a"])))
        wide.index.name, wide.columns.name = "original site", f"site of {label}"
        matrices.append({"label": label, "svg": heatmap_svg(wide, title=f"CKA{mean}", vmin=0.0, vmax=1.0)})
    return {"cka_diagonal": heatmap_svg(diagonal, title=f"CKA with the original{mean}", vmin=0.0, vmax=1.0),
            "cka_matrices": matrices}


def _loss_plot(history: pd.DataFrame | None, runs: pd.DataFrame):
    """Post-training loss of each run of the first seed (every seed's curve would crowd the plot)."""
    if history is None or history.empty:
        return None
    first = runs[runs["seed"] == runs["seed"].min()]
    steps = sorted(history["step"].unique())
    series = {}
    for label in first["run"]:
        frame = history[history["run"] == label].set_index("step")["loss"]
        series[label] = frame.reindex(steps).to_numpy()
    return line_plot(steps, series, title="post-training loss (CE + ω·penalty)", xlabel="step", ylabel="loss",
                     logy=True)


# ---------------------------------------------------------------------------------------------------
# tables


def _optional(r: pd.Series, name: str) -> str:
    """``mean ± std`` of ``<name>_mean`` / ``_std`` when the aggregate has them, else ''."""
    return _pm(r[f"{name}_mean"], r[f"{name}_std"]) if f"{name}_mean" in r else ""


def _gain(r: pd.Series) -> str:
    """The recovery gain of an aggregate row: its mean and 95 % interval over seeds ('' without recovery)."""
    if "recovery_gain_mean" not in r:
        return ""
    if math.isnan(_num(r["recovery_gain_low"])):
        return f"{_num(r['recovery_gain_mean']):+.3f}"
    return f"{_num(r['recovery_gain_mean']):+.3f} [{_num(r['recovery_gain_low']):+.3f}, {_num(r['recovery_gain_high']):+.3f}]"


def _aggregate_rows(aggregate: pd.DataFrame) -> list[dict[str, str]]:
    return [{"run": str(r["run"]), "seeds": str(r["seeds"]),
             "napl": _pm(r["napl_mean"], r["napl_std"]), "nonlinear": _pm(r["nonlinear_fraction_mean"],
                                                                           r["nonlinear_fraction_std"]),
             "linearized": _optional(r, "linearized_fraction"), "deviation": _optional(r, "mean_abs_one_minus_alpha"),
             "accuracy": _pm(r["accuracy_mean"], r["accuracy_std"]), "frozen": _pm(r["frozen_fraction_mean"],
                                                                                   r["frozen_fraction_std"]),
             "recovered": _optional(r, "accuracy_recovered"), "gain": _gain(r)}
            for _, r in aggregate.iterrows()]


def _note(value: float, x: str, original_napl: float, matched: int, seeds: int) -> str:
    """What a matched-mean row is: the original's NAPL, fully linear, a hint, or a partial match."""
    if x == "napl" and value >= round(float(original_napl), 9):
        return "original NAPL: nothing linearized"
    if (x == "napl" and value == 0) or (x == "linearized_fraction" and value >= 1):
        return "fully linear: the same network at either granularity"
    if x == "linearized_fraction" and value == 0:
        return "nothing linearized"
    if matched == 0:
        return "nearest-run hint, not a match"
    return "" if matched == seeds else f"matched in {matched} of {seeds} seeds"


def _matched_mean_rows(matched_mean: pd.DataFrame, x: str = "napl", original_napl: float = math.nan,
                       per_seed: pd.DataFrame | None = None) -> list[dict[str, str]]:
    rows = []
    for _, r in matched_mean.iterrows():
        interval = _interval(r, per_seed, x)
        rows.append({"napl": format_number(float(r[x])), "seeds": f"{r['matched_seeds']} of {r['seeds']}",
                     "layer": _pm(r["layer_accuracy_mean"], r["layer_accuracy_std"]),
                     "channel": _pm(r["channel_accuracy_mean"], r["channel_accuracy_std"]),
                     "difference": _pm(r["difference_mean"], r["difference_std"]),
                     "interval": "n/a (one seed)" if interval.n < 2 else f"{interval.low:+.3f} … {interval.high:+.3f}",
                     "verdict": str(r["verdict"]) if "verdict" in r else verdict(interval, higher=True),
                     "range": f"{r['difference_min']:+.3f} … {r['difference_max']:+.3f}",
                     "note": _note(float(r[x]), x, original_napl, int(r["matched_seeds"]), int(r["seeds"]))})
    return rows


def context(result) -> dict[str, Any]:
    """Template context of a LinearizeResult: findings, figures, tables, from its tables and summary only."""
    runs = _runs(result)
    aggregate = _aggregate(result, runs)
    several = bool(len(aggregate) and aggregate["seeds"].max() > 1)
    order = list(aggregate["run"])
    matched = result.tables.get("matched", pd.DataFrame())
    matched_mean = result.tables.get("matched_mean", pd.DataFrame(
        columns=["napl", "seeds", "matched_seeds", "difference_mean", "difference_std"]))
    dists = result.tables.get("distributions_mean")
    if dists is None and "distributions" in result.tables:   # an older one-seed result
        dists = result.tables["distributions"].assign(probability_mean=lambda f: f["probability"],
                                                      probability_std=float("nan"))
    tables = {**result.tables, "matched_mean": matched_mean}
    by_fraction = result.tables.get("matched_fraction_mean")
    return {
        "findings": _findings(result.summary, aggregate, tables, result.meta),
        "cautions": _cautions(result, runs, matched_mean),
        "several_seeds": several,
        "runs_columns": list(runs.columns),
        "runs_rows": runs.to_dict(orient="records"),
        "aggregate_rows": _aggregate_rows(aggregate),
        "accuracy_plot": _accuracy_vs_napl(aggregate, runs, result.summary) if not aggregate.empty else None,
        "matched": matched.to_dict(orient="records"),
        "matched_mean": _matched_mean_rows(matched_mean, "napl", result.summary["original_napl"], matched)
        if "difference_min" in matched_mean.columns else [],
        "matched_fraction": _matched_mean_rows(by_fraction, "linearized_fraction",
                                               per_seed=result.tables.get("matched_fraction"))
        if by_fraction is not None and not by_fraction.empty else [],
        "has_linearized": "linearized_fraction_mean" in aggregate.columns,
        "has_deviation": "mean_abs_one_minus_alpha_mean" in aggregate.columns,
        "has_recovery": "accuracy_recovered_mean" in aggregate.columns,
        "recover_epochs": (result.meta.get("settings") or {}).get("recover"),
        "histograms": _histograms(dists, ["original"] + order) if dists is not None and not dists.empty else None,
        "layer_heatmap": _layer_heatmap(_layers_mean(result), order, several),
        "loss_plot": _loss_plot(result.tables.get("history"), runs),
        **_cka_figures(_cka_mean(result), aggregate, order, several),
    }


def _layers_mean(result) -> pd.DataFrame:
    if "layers_mean" in result.tables:
        return result.tables["layers_mean"]
    layers = result.tables.get("layers", pd.DataFrame())
    return layers.assign(nonlinear_fraction_mean=layers["nonlinear_fraction"]) if not layers.empty else layers


def _cka_mean(result) -> pd.DataFrame | None:
    if "cka_mean" in result.tables:
        return result.tables["cka_mean"]
    cka = result.tables.get("cka")
    return None if cka is None else cka.assign(linear_cka_mean=cka["linear_cka"])
