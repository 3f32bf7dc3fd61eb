"""Report context of a stitch run: findings and cautions first, then standard vs invariance-aware
penalties side by side per layer and objective (a figure), penalty heatmaps (objective × layer pair)
per setting, penalties over depth, the mean table with 95 % t intervals over seeds, the paired
IRI − standard differences, IRI quality (relative-error histograms, distances from their seeds, B's
labels on them, IRIs beside their originals) and the run's settings.

One unit throughout: accuracies and penalties are in points (percent of the evaluation set) in the
figures, heatmaps, tables and findings. Every difference quoted comes with its 95 % t interval over
seeds (the runner's ``stitching_mean``, ``iri_differences`` tables and summary intervals, from
:mod:`simkit.stats`) or, with one seed, a binomial standard error on the evaluation samples; a finding
says "beyond noise" only where the interval excludes 0.

A ``stitching`` table may carry a ``models`` column (which model pair, e.g. ``A→S``) and a ``seed``
column, as an example's combined result does: rows are then averaged over seeds (spread = standard
deviation over seeds) and the findings say which model pairs the invariance-aware arm separates.
Everything is drawn from the result's summary, tables and ``extra``; nothing is computed here but
means over seeds and layout.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from simkit.plotting import PALETTE
from simkit.report.figures import heatmap_svg, img, line_plot, new_figure, plain_text
from simkit.stats import Interval, binomial_se


def _pair_label(row) -> str:
    return f"{row['layer_a']} → {row['layer_b']}"


def _pair_order(table: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(table.apply(_pair_label, axis=1))) if len(table) else []


def penalty_frames(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """setting → DataFrame (objective × layer pair) of penalties in points (mean over seeds), pairs in
    run order."""
    if not len(table):
        return {}
    table = table.assign(pair=table.apply(_pair_label, axis=1))
    order = _pair_order(table)
    frames = {}
    for setting, part in table.groupby("setting", sort=False):
        frame = 100 * part.pivot_table(index="objective", columns="pair", values="penalty", aggfunc="mean")
        objectives = list(dict.fromkeys(part.objective))
        frame = frame.reindex(index=objectives, columns=[p for p in order if p in frame.columns])
        frame.index.name, frame.columns.name = "objective", "layer of A → layer of B"
        frames[str(setting)] = frame
    return frames


def _heatmaps(frames: dict[str, pd.DataFrame]) -> list[dict[str, Any]]:
    values = [f.to_numpy(dtype=float) for f in frames.values()]
    finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.array([])
    lo = float(min(0.0, finite.min())) if finite.size else 0.0
    # penalties are in points: the colour range spans at least one point, so all-zero tables get
    # readable ticks
    hi = float(max(finite.max(), lo + 1.0)) if finite.size else 100.0
    return [{"setting": setting,
             "svg": heatmap_svg(frame, title=f"Stitching penalty, {setting} stitching (points)", vmin=lo, vmax=hi,
                                cmap="magma_r")}
            for setting, frame in frames.items()]


def _depth_plot(table: pd.DataFrame):
    if not len(table):
        return None
    order = _pair_order(table)
    table = table.assign(pair=table.apply(_pair_label, axis=1))
    series = {}
    for (objective, setting), part in table.groupby(["objective", "setting"], sort=False):
        values = 100 * part.groupby("pair").penalty.mean().reindex(order)
        series[f"{objective} ({setting})"] = values.tolist()
    return line_plot(order, series, title="Stitching penalty over depth", xlabel="layer pair (A → B)",
                     ylabel="penalty, points (B acc − stitched acc)")


SEPARATION = 0.10  # an invariance-aware penalty this much above the reference pair's (and beyond 2 spreads)


def _with_groups(table: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """``table`` with ``models`` (the model pair) and ``seed`` columns filled in for a single run."""
    if "models" not in table.columns:
        table = table.assign(models=f"{meta.get('model_a')} → {meta.get('model_b')}")
    if "seed" not in table.columns:
        table = table.assign(seed=meta.get("seed", 0))
    return table.assign(pair=table.apply(_pair_label, axis=1))


def mean_penalty_and_spread(table: pd.DataFrame) -> pd.DataFrame:
    """Mean and spread (standard deviation over seeds, 0 for one seed) of the penalty and the stitched
    accuracy per (models, pair, objective, setting), in run order; ``table`` as :func:`_with_groups` gives."""
    keys = ["models", "pair", "objective", "setting"]
    grouped = table.groupby(keys, sort=False)
    frame = grouped.agg(penalty=("penalty", "mean"), stitched_accuracy=("stitched_accuracy", "mean"),
                        b_accuracy=("b_accuracy", "mean"), seeds=("seed", "nunique")).reset_index()
    spread = grouped.penalty.std(ddof=1).fillna(0.0).reset_index(drop=True)
    return frame.assign(penalty_spread=spread.to_numpy())


def arms_figure(agg: pd.DataFrame):
    """One panel per objective: for every layer pair, the standard and invariance-aware penalties of each
    model pair side by side (bars, error bars = spread over seeds)."""
    if not len(agg):
        return None
    objectives = list(dict.fromkeys(agg.objective))
    pairs = list(dict.fromkeys(agg.pair))
    series = list(dict.fromkeys(zip(agg.models, agg.setting, strict=True)))
    from matplotlib.figure import Figure

    ncols = min(len(objectives), 2)
    nrows = -(-len(objectives) // ncols)
    fig = Figure(figsize=(5.2 * ncols, 3.4 * nrows + 0.4))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    fig.subplots_adjust(hspace=0.55)
    width = 0.8 / max(len(series), 1)
    colors = PALETTE  # colour-blind safe
    for k, objective in enumerate(objectives):
        ax = axes[k // ncols][k % ncols]
        part = agg[agg.objective == objective]
        for i, (models, setting) in enumerate(series):
            rows = part[(part.models == models) & (part.setting == setting)].set_index("pair").reindex(pairs)
            ax.bar(np.arange(len(pairs)) + (i - (len(series) - 1) / 2) * width, 100 * rows.penalty.to_numpy(float),
                   width, yerr=100 * rows.penalty_spread.to_numpy(float), capsize=2,
                   color=colors[(i // 2) % len(colors)], alpha=1.0 if setting == "standard" else 0.5,
                   hatch="" if setting == "standard" else "//", label=f"{models} ({setting})")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(np.arange(len(pairs)), pairs, rotation=20, fontsize=7)
        ax.set_title(objective, fontsize=9)
        ax.set_ylabel("penalty (points)", fontsize=8)
    for k in range(len(objectives), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.06), ncol=min(len(labels), 4),
               fontsize=7, frameon=False)
    fig.suptitle("Standard vs invariance-aware stitching penalty per layer and objective, in points "
                 "(B's accuracy − stitched accuracy; error bars: one standard deviation over seeds)", fontsize=9)
    return img(fig, "standard and invariance-aware penalties side by side per layer and objective")


def separation(agg: pd.DataFrame) -> tuple[str, dict[str, list[str]]] | None:
    """(reference model pair, {other pair: the cells "layer pair objective" where its invariance-aware
    penalty exceeds the reference's by ≥ SEPARATION and by more than twice the larger seed spread});
    None without an IRI arm or with one model pair. The reference is the pair with the lowest mean
    invariance-aware penalty."""
    iri = agg[agg.setting == "iri"]
    groups = list(dict.fromkeys(iri.models))
    if len(groups) < 2:
        return None
    reference = min(groups, key=lambda g: float(iri[iri.models == g].penalty.mean()))
    ref = iri[iri.models == reference].set_index(["pair", "objective"])
    separated = {}
    for group in groups:
        if group == reference:
            continue
        other = iri[iri.models == group].set_index(["pair", "objective"]).reindex(ref.index)
        gap = other.penalty - ref.penalty
        bar = np.maximum(SEPARATION, 2 * np.maximum(other.penalty_spread, ref.penalty_spread))
        separated[group] = [f"{pair} {objective}" for (pair, objective), ok in (gap >= bar).items() if ok]
    return reference, separated


def _points(value: float) -> str:
    return f"{100 * value:.1f}"


def _interval_text(interval: dict[str, Any]) -> str:
    """``+1.2 points (95 % CI −0.3 to +2.7, 3 seeds)`` from an :meth:`Interval.as_dict` in fractions."""
    scaled = Interval(**{k: (100 * v if k in ("mean", "std", "low", "high") else v)
                         for k, v in interval.items() if k in ("mean", "std", "low", "high", "n", "confidence")})
    return scaled.text(1, " points")


def _se_points(accuracies: list[float], n_test: int | None) -> float:
    """√(Σ SE²) in points of the binomial standard errors of ``accuracies`` on ``n_test`` samples."""
    if not n_test:
        return math.nan
    return 100 * math.sqrt(sum(binomial_se(a, int(n_test)) ** 2 for a in accuracies))


def _level_sentence(summary: dict[str, Any], table: pd.DataFrame, n_test: int | None) -> str | None:
    """Mean penalty_min (and penalty) per arm over layers and objectives, with its interval over seeds
    or, with one seed, the binomial SE of the stitched accuracy."""
    levels = summary.get("penalty_over_seeds") or {}
    parts = []
    for setting, name in (("standard", "standard"), ("iri", "invariance-aware")):
        if setting not in levels:
            continue
        low_floor, plain = levels[setting]["penalty_min"], levels[setting]["penalty"]
        if low_floor["n"] >= 2:
            parts.append(f"{name} {_interval_text(low_floor)} (penalty {_points(plain['mean'])})")
        else:
            acc = float(table[table.setting == setting].stitched_accuracy.mean())
            parts.append(f"{name} {_points(low_floor['mean'])} ± {_se_points([acc], n_test):.1f} points "
                         f"(binomial SE; penalty {_points(plain['mean'])})")
    if not parts:
        return None
    return ("Mean penalty_min over layers and objectives (the lower of A's and B's accuracy minus the "
            "stitched accuracy, so a perfect stitch from a weaker front does not pay A's gap): "
            + "; ".join(parts) + ".")


def _difference_sentence(summary: dict[str, Any], table: pd.DataFrame, n_test: int | None) -> str | None:
    """IRI − standard penalty per objective, paired by seed, with its interval (one seed: binomial SE);
    "beyond noise" only where the interval excludes 0."""
    diffs = summary.get("iri_minus_standard") or {}
    if not diffs:
        return None
    parts = []
    for objective, interval in diffs.items():
        if interval["n"] >= 2:
            tag = "beyond noise" if interval.get("beyond_noise") else "within noise"
            parts.append(f"{objective} {_interval_text(interval)}, {tag}")
        else:
            accs = [float(table[(table.setting == arm) & (table.objective == objective)].stitched_accuracy.mean())
                    for arm in ("standard", "iri")]
            parts.append(f"{objective} {100 * interval['mean']:+.1f} ± {_se_points(accs, n_test):.1f} points "
                         "(one seed: binomial SE, no interval over seeds)")
    return ("Invariance-aware minus standard penalty, paired by seed and averaged over layers (the same for "
            "penalty and penalty_min, whose reference both arms share): " + "; ".join(parts) + ".")


def iri_search(iris: pd.DataFrame | None) -> str:
    """How the run's IRIs were searched, from its ``iris`` table: "unbounded search", or "inside an L∞
    ball of radius 0.1 around their seeds" (a bounded run's table has ``radius`` and ``norm``)."""
    if iris is None or "radius" not in iris.columns or not len(iris):
        return "unbounded search"
    norm = {"linf": "L∞", "l2": "L2"}.get(str(iris.norm.iloc[0]), str(iris.norm.iloc[0]))
    return f"inside an {norm} ball of radius {float(iris.radius.iloc[0]):.3g} around their seeds"


def _iri_sentence(summary: dict[str, Any], iris: pd.DataFrame | None) -> str | None:
    converged = summary.get("iri_converged_fraction")
    if converged is None:
        return None
    text = (f"IRIs ({iri_search(iris)}) reached their tolerance on at least {100 * converged:.1f} % of inputs "
            "at every layer of A")
    if iris is not None and "seed_linf_median" in iris.columns and len(iris):
        text += (f"; they lie a median L∞ {iris.seed_linf_median.median():.3g} (L2 {iris.seed_l2_median.median():.3g}) "
                 f"from the inputs they started from, in input units, and B labels "
                 f"{100 * iris.b_target_class_fraction.mean():.1f} % of them as the input they represent, "
                 f"{100 * iris.b_seed_class_fraction.mean():.1f} % as their seed's")
    return text + "."


def findings(summary: dict[str, Any], agg: pd.DataFrame, table: pd.DataFrame | None = None,
             n_test: int | None = None, iris: pd.DataFrame | None = None) -> list[str]:
    """Two or three sentences from the summary and the tables: which model pairs the invariance-aware
    arm separates (a combined result with several pairs); else the penalty_min level per arm and the
    paired IRI − standard difference, each with its interval (or binomial SE), and the IRI quality."""
    out = []
    sep = separation(agg)
    if sep is not None:
        reference, separated = sep
        cells = len(agg[(agg.setting == "iri") & (agg.models == reference)])
        hit = {g: c for g, c in separated.items() if c}
        if hit:
            parts = [f"{g} at {len(c)} of {cells} layer × objective cells ({', '.join(c[:4])}"
                     f"{', …' if len(c) > 4 else ''})" for g, c in hit.items()]
            out.append(f"Invariance-aware stitching separates {'; '.join(parts)} from {reference}: its penalty "
                       f"there is at least {SEPARATION * 100:.0f} points higher, beyond twice the seed spread.")
        else:
            out.append(f"Invariance-aware stitching separates none of the model pairs from {reference}: no "
                       f"penalty is {SEPARATION * 100:.0f} points higher beyond twice the seed spread.")
    if table is not None and "penalty_min" in table.columns and summary.get("penalty_over_seeds"):
        out += [s for s in (_level_sentence(summary, table, n_test), _difference_sentence(summary, table, n_test),
                            _iri_sentence(summary, iris)) if s]
        return out[:3]
    for setting, name in (("standard", "standard"), ("iri", "invariance-aware")):
        part = agg[agg.setting == setting]
        if not len(part):
            continue
        means = part.groupby("models", sort=False).penalty.mean()
        spreads = part.groupby("models", sort=False).penalty_spread.mean()
        text = ", ".join(f"{g}: {100 * v:.1f} (± {100 * spreads[g]:.1f} spread over seeds)" for g, v in means.items())
        out.append(f"Mean {name} stitching penalty (B's accuracy − stitched accuracy) over layers and "
                   f"objectives, in points: {text}.")
    converged = summary.get("iri_converged_fraction")
    if converged is not None and sep is None:
        out.append(f"IRIs reached their tolerance on at least {100 * converged:.1f} % of inputs at every layer of A.")
    return out[:3]


def cautions(summary: dict[str, Any]) -> list[str]:
    """The run's warnings (a model at chance, IRIs that missed the tolerance), as the summary has them."""
    return [str(w) for w in summary.get("warnings") or []]


def _histogram(histograms: dict[str, dict[str, list[float]]], tol: float | None):
    if not histograms:
        return None
    fig, ax = new_figure(6.5, 3.4)
    for layer, hist in histograms.items():
        edges = np.asarray(hist["log10_edges"], dtype=float)
        ax.stairs(np.asarray(hist["counts"], dtype=float), 10 ** edges, label=layer)
    if tol:
        ax.axvline(tol, color="k", ls="--", lw=1, label=f"tolerance {tol:g}")
    ax.set_xscale("log")
    ax.set_xlabel("relative error ‖a(x′) − a(x)‖ / ‖a(x)‖")
    ax.set_ylabel("IRIs")
    ax.set_title("IRI relative error per stitch layer of A", fontsize=10)
    ax.legend(fontsize=7, frameon=False)
    return img(fig, "IRI relative error histogram")


def _examples_figure(layer: str, ex: dict[str, Any]):
    """Originals, seeds and IRIs side by side: images (C, H, W) as pictures, (C, L) as curves."""
    shape = ex.get("shape", [])
    k = len(ex["original"])
    if not k or len(shape) not in (2, 3):
        return None
    columns = [("original x", ex["original"]), ("seed", ex["seed"]), ("IRI x′", ex["iri"])]
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1.6 * len(columns) + 0.6, 1.4 * k + 0.4))
    axes = fig.subplots(k, len(columns), squeeze=False)
    for i in range(k):
        for j, (name, values) in enumerate(columns):
            ax = axes[i][j]
            sample = values[i]
            if sample is None:
                ax.axis("off")
                continue
            array = np.asarray(sample, dtype=float)
            if len(shape) == 3:
                picture = array[0] if array.shape[0] == 1 else np.moveaxis(array[:3], 0, -1)
                lo, hi = _limits(ex)
                ax.imshow(np.clip(picture, lo, hi), cmap="gray" if array.shape[0] == 1 else None, vmin=lo, vmax=hi)
                ax.set_xticks([])
                ax.set_yticks([])
            else:
                for channel in array:
                    ax.plot(channel, lw=1)
                ax.tick_params(labelsize=6)
            if i == 0:
                ax.set_title(name, fontsize=8)
        axes[i][0].set_ylabel(f"r = {ex['rel_error'][i]:.3g}", fontsize=7)
    fig.suptitle(f"IRIs at A.{layer}", fontsize=9)
    return img(fig, f"IRIs beside their originals at {layer}")


def _limits(ex: dict[str, Any]) -> tuple[float, float]:
    values = np.asarray(ex["original"], dtype=float)
    return float(values.min()), float(values.max())


POINT_COLUMNS = ("stitched_accuracy", "b_accuracy", "a_accuracy", "penalty", "penalty_min")
PERCENT_COLUMNS = ("reached_fraction", "iri_converged_fraction", "b_target_class_fraction", "b_seed_class_fraction",
                   "reached_inside_radius_fraction")


def _in_points(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """``rows`` with the values of ``columns`` (fractions) times 100."""
    return [{k: (100 * v if k in columns and isinstance(v, int | float) and not isinstance(v, bool) else v)
             for k, v in row.items()} for row in rows]


def _mean_rows(result, agg: pd.DataFrame) -> tuple[list[dict[str, Any]], bool]:
    """(rows of the mean table in points, whether they carry t intervals): the runner's
    ``stitching_mean`` when present, else the mean ± spread of :func:`mean_penalty_and_spread` (combined
    results)."""
    means = result.tables.get("stitching_mean")
    if means is None or not len(means):
        rows = _in_points(agg.to_dict("records"), ("penalty", "stitched_accuracy", "b_accuracy", "penalty_spread"))
        return rows, False
    frame = means.assign(pair=means.apply(_pair_label, axis=1))
    scaled = [c for c in frame.columns if c.split("_")[0] in ("stitched", "penalty", "a", "b")
              and not c.startswith("chosen")]
    frame[scaled] = 100 * frame[scaled].astype(float)
    return frame.to_dict("records"), True


def _headline(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    """The summary's scalar keys (lists of numbers kept), accuracies and penalties in points."""
    rows = []
    for key, value in summary.items():
        if key == "warnings" or isinstance(value, dict):
            continue
        if ("accuracy" in key or "accuracies" in key or "penalty" in key) and value is not None:
            label = f"{key} (points)"
            if isinstance(value, list):
                value = [100 * v for v in value]
            elif isinstance(value, int | float) and not isinstance(value, bool):
                value = 100 * value
            rows.append((label, value))
        else:
            rows.append((key, value))
    return rows


def context(result) -> dict[str, Any]:
    """Everything ``stitch.html.j2`` shows, prepared from ``result`` (a StitchResult)."""
    table = result.tables.get("stitching", pd.DataFrame())
    meta, extra = result.meta, result.extra
    grouped = _with_groups(table, meta) if len(table) else table
    agg = mean_penalty_and_spread(grouped) if len(table) else pd.DataFrame()
    single = not len(table) or grouped.models.nunique() == 1
    frames = penalty_frames(table) if single else {}
    iri_meta = meta.get("iri") or {}
    seeds = meta.get("seeds") or [meta.get("seed")]
    validation = meta.get("validation")
    settings_rows = [("model A (front)", meta.get("model_a")), ("model B (back)", meta.get("model_b")),
                     ("data", meta.get("data")),
                     ("train / validation / test samples",
                      f"{meta.get('n_train')} / {meta.get('n_val', 0)} / {meta.get('n_test')}"),
                     ("objectives", ", ".join(meta.get("objectives", []))),
                     ("settings", ", ".join(meta.get("settings", []))), ("stitch init", meta.get("init")),
                     ("stitch training", meta.get("train")),
                     ("stitch budget", validation if validation else "all steps (no validation split)"),
                     ("IRI generation", iri_meta or "not run"),
                     ("IRI search", iri_search(result.tables.get("iris")) if iri_meta else "not run"),
                     ("input value range", f"{' to '.join(map(plain_text, meta.get('value_range') or []))} "
                                           f"({meta.get('value_range_source')})"),
                     ("how B was cut", meta.get("cut")), ("seeds", seeds),
                     ("models per seed", meta.get("seed_models", "the given models"))]
    settings_rows = [(label, plain_text(value)) for label, value in settings_rows]  # key=value, never a repr
    summary = result.summary
    iris = result.tables.get("iris")
    mean_rows, intervals = _mean_rows(result, agg) if len(table) else ([], False)
    differences = result.tables.get("iri_differences")
    return {
        "findings": findings(summary, agg, table, meta.get("n_test"), iris) if len(agg) else [],
        "cautions": cautions(summary),
        "arms_figure": arms_figure(agg) if len(agg) else None,
        "mean_rows": mean_rows,
        "mean_intervals": intervals,
        "multi_seed": bool(len(agg)) and int(agg.seeds.max()) > 1,
        "difference_rows": _in_points(differences.to_dict("records"), ("mean", "std", "low", "high"))
        if differences is not None else [],
        "headline": _headline(summary),
        "heatmaps": _heatmaps(frames),
        "depth_plot": _depth_plot(table) if single else None,
        "rows": _in_points(table.to_dict("records"), POINT_COLUMNS),
        "iri_table": _in_points(iris.to_dict("records"), PERCENT_COLUMNS) if iris is not None else [],
        "iri_histogram": _histogram(extra.get("iri_histograms", {}), iri_meta.get("tol")),
        "iri_examples": [fig for layer, ex in extra.get("iri_examples", {}).items()
                         if (fig := _examples_figure(layer, ex)) is not None],
        "objective_descriptions": extra.get("objective_descriptions", {}),
        "settings_rows": settings_rows,
        "training_rows": result.tables["training"].to_dict("records") if "training" in result.tables else [],
    }
