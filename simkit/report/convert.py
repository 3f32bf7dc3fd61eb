"""Report context of a ``convert`` result (Network of Theseus).

Draws only from the result's tables (``runs``, ``stages``, ``stage_summary``, ``curves``,
``baselines``, ``validation``, ``layer_cka``, ``aggregate``), summary and extra. Order: findings (the
headline: converted vs the converged scratch baseline, the difference paired by seed with its 95 % t
interval, "beyond noise" only when that interval excludes 0; the budgets) and cautions, then figures
(every seed's score beside the mean and its interval, and the paired differences
(:mod:`simkit.report.convert_seeds`), score per arm, the rank sweep, the alignment loss per stage and layer — the paper's Figure 5 —, the hybrid's
score after each stage, stage × layer CKA heatmaps, loss curves of every phase, validation curves of
the baselines, the converted × guide CKA heatmap), then the tables.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from simkit.report.convert_seeds import aggregate_rows, budget_rows, seed_plot
from simkit.report.figures import bar_plot, heatmap_svg, img, new_figure
from simkit.stats import beyond_noise, interval_of

_ROLES = ("guide", "probe", "converted", "scratch", "kd")
_ROLE_LABELS = {"guide": "guide", "probe": "linear probe (before fine-tuning)", "converted": "converted",
                "scratch": "target from scratch", "kd": "logit distillation"}


def _text(value: Any) -> str:
    if isinstance(value, float):
        return "n/a" if value != value else f"{value:.4g}"
    if value is None:
        return "n/a"
    return str(value)


ARM = ["schedule", "metric", "guide_init", "rank"]


def _arm_columns(frame: pd.DataFrame) -> list[str]:
    """The arm columns a table has (``rank`` is absent from runs made before rank sweeps)."""
    return [c for c in ARM if c in frame.columns]


def _rank_text(rank: Any) -> str:
    return "" if rank is None or rank == "" or rank != rank else f" · rank {int(rank)}"


def _arm_label(row: pd.Series | dict, ranks: bool = False) -> str:
    label = f"{row['schedule']} · {row['metric']} · {row['guide_init']} guide"
    return label + (_rank_text(row.get("rank")) if ranks else "")


def _sweep(runs: pd.DataFrame) -> bool:
    return "rank" in runs.columns and runs["rank"].nunique() > 1


def stage_heatmaps(stages: pd.DataFrame) -> list[dict[str, Any]]:
    """One (stage × layer) CKA heatmap per (schedule, metric, guide_init) arm."""
    out: list[dict[str, Any]] = []
    if stages.empty:
        return out
    cols = _arm_columns(stages)
    ranks = "rank" in stages.columns and stages["rank"].nunique() > 1
    for key, part in stages.groupby(cols, sort=False):
        wide = part.pivot_table(index="stage", columns="layer", values="value", aggfunc="first", sort=False)
        wide = wide.reindex(index=list(dict.fromkeys(part["stage"])), columns=list(dict.fromkeys(part["layer"])))
        wide.index.name, wide.columns.name = "stage", "replaced layer"
        title = _arm_label(dict(zip(cols, key, strict=True)), ranks)
        out.append({"title": title, "svg": heatmap_svg(wide, title=title, vmin=0.0, vmax=1.0)})
    return out


def loss_curves(curves: pd.DataFrame) -> list[dict[str, Any]]:
    """Per arm: one plot of the alignment loss per stage, one of the task loss (head, fine-tune)."""
    out: list[dict[str, Any]] = []
    if curves.empty:
        return out
    frame = curves.fillna({"schedule": "", "metric": "", "guide_init": ""})
    cols = _arm_columns(frame)
    ranks = "rank" in frame.columns and frame.loc[frame["schedule"] != "", "rank"].nunique() > 1
    for key, part in frame.groupby(cols, sort=False, dropna=False):
        arm = dict(zip(cols, key, strict=True))
        if not arm["schedule"]:
            continue
        name = _arm_label(arm, ranks)
        align = part[~part["phase"].isin(["head", "finetune"])]
        task = part[part["phase"].isin(["head", "finetune"])]
        for label, sub, logy in (("alignment loss", align, True), ("task loss", task, False)):
            if sub.empty:
                continue
            # phases run one after the other: plot them on one cumulative step axis
            xs, series, offset = [], {}, 0
            for phase, rows in sub.groupby("phase", sort=False):
                steps = rows["step"].to_numpy() + offset
                offset = int(steps.max())
                series[phase] = rows["loss"].to_numpy()
                xs.append(steps)
            out.append({"title": f"{label}: {name}",
                        "img": _multi_line(xs, series, f"{label}: {name}", logy and (sub["loss"] > 0).all())})
    base = frame[frame["schedule"] == ""]
    if not base.empty:
        xs = [rows["step"].to_numpy() for _, rows in base.groupby("phase", sort=False)]
        series = {phase: rows["loss"].to_numpy() for phase, rows in base.groupby("phase", sort=False)}
        out.append({"title": "baselines: training loss", "img": _multi_line(xs, series, "baselines: training loss", False)})
    return out


def finetune_curves(curves: pd.DataFrame):
    """Every arm's task loss (head, then fine-tuning) and the scratch baseline's on one step axis."""
    if curves.empty:
        return None
    frame = curves.fillna({"schedule": "", "metric": "", "guide_init": ""})
    cols = _arm_columns(frame)
    ranks = "rank" in frame.columns and frame.loc[frame["schedule"] != "", "rank"].nunique() > 1
    xs, series = [], {}
    for key, part in frame.groupby(cols, sort=False, dropna=False):
        arm = dict(zip(cols, key, strict=True))
        if arm["schedule"]:
            sub = part[part["phase"].isin(["head", "finetune"])]
            if sub.empty:
                continue
            head = sub[sub["phase"] == "head"]
            offset = int(head["step"].max()) if not head.empty else 0
            steps = sub["step"].to_numpy() + (sub["phase"] == "finetune").to_numpy() * offset
            xs.append(steps)
            series[f"NoT {_arm_label(arm, ranks)}"] = sub["loss"].to_numpy()
        else:  # the scratch baseline: the same cross-entropy (distillation's KL is on another scale)
            for phase, rows in part[part["phase"] == "scratch"].groupby("phase", sort=False):
                xs.append(rows["step"].to_numpy())
                series[str(phase)] = rows["loss"].to_numpy()
    if not series:
        return None
    return _multi_line(xs, series, "cross-entropy: head + fine-tuning of every arm, and scratch", False)


def validation_curves(validation: pd.DataFrame | None, score: str):
    """Validation score per epoch of the guide's training and of every baseline."""
    column = f"val_{score}"
    if validation is None or validation.empty or column not in validation.columns:
        return None
    xs, series = [], {}
    for phase, rows in validation.groupby("phase", sort=False):
        xs.append(rows["step"].to_numpy())
        series[str(phase)] = rows[column].to_numpy()
    fig, ax = new_figure(7.0, 3.2)
    for x, (name, values) in zip(xs, series.items(), strict=True):
        ax.plot(x, values, lw=1.2, label=name)
    ax.set_title(f"validation {score} per epoch (the split that stops the baselines)", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(f"validation {score}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    return img(fig, f"validation {score} per epoch")


def layer_loss_plots(stages: pd.DataFrame) -> list[dict[str, Any]]:
    """The paper's Figure 5: per arm, the held-out alignment loss of each layer after each stage (one
    line per replaced layer, x = stage): which layers are hardest to align."""
    out: list[dict[str, Any]] = []
    if stages.empty or "loss" not in stages.columns:
        return out
    cols = _arm_columns(stages)
    ranks = "rank" in stages.columns and stages["rank"].nunique() > 1
    for key, part in stages.groupby(cols, sort=False):
        arm = dict(zip(cols, key, strict=True))
        part = part[part["replaced"].astype(bool) & part["loss"].notna()]
        if part.empty:
            continue
        order = list(dict.fromkeys(part["stage"]))
        fig, ax = new_figure(6.0, 3.2)
        for layer, rows in part.groupby("layer", sort=False):
            ax.plot([order.index(v) for v in rows["stage"]], rows["loss"].to_numpy(), marker="o", lw=1.2, label=layer)
        ax.set_xticks(range(len(order)))
        ax.set_xticklabels(order, fontsize=8)
        positive = (part["loss"] > 0).all()
        if positive:
            ax.set_yscale("log")
        title = f"held-out {arm['metric']} loss per layer: {_arm_label(arm, ranks)}"
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("alignment loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
        out.append({"title": title, "img": img(fig, title)})
    return out


def hybrid_plot(stage_summary: pd.DataFrame, score: str):
    """The hybrid network's test score after each stage (guide modules downstream, the guide's head)."""
    column = f"hybrid_{score}"
    if stage_summary.empty or column not in stage_summary.columns or stage_summary[column].isna().all():
        return None
    cols = _arm_columns(stage_summary)
    ranks = "rank" in stage_summary.columns and stage_summary["rank"].nunique() > 1
    fig, ax = new_figure(6.0, 3.2)
    for key, part in stage_summary.groupby(cols, sort=False):
        part = part[part[column].notna()]
        if part.empty:
            continue
        arm = dict(zip(cols, key, strict=True))
        ax.plot(part["stage"].astype(str).tolist(), part[column].to_numpy(), marker="o", lw=1.2,
                label=_arm_label(arm, ranks))
    ax.set_title(f"hybrid {score} after each stage (before fine-tuning)", fontsize=10)
    ax.set_ylabel(score)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    return img(fig, f"hybrid {score} after each stage")


def rank_plot(runs: pd.DataFrame, stages: pd.DataFrame, score: str):
    """Rank sweep: converted and probe score, and the mean held-out alignment loss after the last stage,
    against the rank of the low-rank maps (one line per schedule · metric · guide init)."""
    if not _sweep(runs):
        return None
    fig, (left, right) = _two_axes()
    for key, part in runs.groupby(["schedule", "metric", "guide_init"], sort=False):
        label = " · ".join(map(str, key))
        part = part.sort_values("rank")
        left.plot(part["rank"], part[f"converted_{score}"], marker="o", label=f"converted {label}")
        left.plot(part["rank"], part[f"probe_{score}"], marker="s", ls="--", label=f"probe {label}")
        if "loss" in stages.columns and not stages.empty:
            sel = stages[(stages["schedule"] == key[0]) & (stages["metric"] == key[1])
                         & (stages["guide_init"] == key[2]) & stages["steps"].notna()]
            if not sel.empty:
                last = sel.groupby("rank")["stage"].agg(lambda v: list(dict.fromkeys(v))[-1])
                means = [sel[(sel["rank"] == r) & (sel["stage"] == st)]["loss"].mean() for r, st in last.items()]
                right.plot(list(last.index), means, marker="o", label=label)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rank")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    left.set_ylabel(score)
    left.set_title(f"{score} against rank", fontsize=10)
    right.set_ylabel("alignment loss (held-out, last stage)")
    right.set_title("alignment loss against rank", fontsize=10)
    return img(fig, "rank sweep")


def _two_axes():
    fig, _ = new_figure(10.0, 3.4)
    fig.clear()
    axes = fig.subplots(1, 2)
    fig.subplots_adjust(wspace=0.3)
    return fig, (axes[0], axes[1])


def _multi_line(xs, series: dict[str, Any], title: str, logy: bool):
    """Lines of different lengths on their own x values (line_plot needs one shared x)."""
    fig, ax = new_figure(7.0, 3.4)
    for x, (name, values) in zip(xs, series.items(), strict=True):
        ax.plot(x, values, lw=1.2, label=name)
    if logy:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=7, frameon=False)
    return img(fig, title)


def final_table(runs: pd.DataFrame, score: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the final table: one row per arm, one column per role that ran."""
    roles = [r for r in _ROLES if f"{r}_{score}" in runs.columns and runs[f"{r}_{score}"].notna().any()]
    extra = [c for c in ("gain_over_scratch", "steps", "scratch_steps", "kd_steps", "seconds")
             if c in runs.columns and runs[c].notna().any()]
    labels = {"gain_over_scratch": "gain over scratch", "steps": "conversion steps", "scratch_steps": "scratch steps",
              "kd_steps": "distillation steps", "seconds": "seconds"}
    header = ["seed", "schedule", "metric", "guide init", "rank"] + [f"{_ROLE_LABELS[r]} {score}" for r in roles] \
        + [labels[c] for c in extra]
    body = []
    for _, row in runs.iterrows():
        body.append([_text(_plain(row.get("seed"))), str(row["schedule"]), str(row["metric"]), str(row["guide_init"]),
                     _text(row.get("rank"))]
                    + [_text(row[f"{r}_{score}"]) for r in roles] + [_text(_plain(row.get(c))) for c in extra])
    return header, body


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers (integral floats of step counts as ints)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value == value and value.is_integer() and abs(value) >= 1:
        return int(value)
    return value


def score_plot(runs: pd.DataFrame, score: str):
    """Grouped bars of ``score``: one group per arm, one bar per role (guide, probe, converted, ...)."""
    roles = [r for r in _ROLES if f"{r}_{score}" in runs.columns and runs[f"{r}_{score}"].notna().any()]
    if runs.empty or not roles:
        return None
    cols = _arm_columns(runs)
    means = runs.groupby(cols, sort=False)[[f"{r}_{score}" for r in roles]].mean().reset_index()
    labels = [_arm_label(r) for _, r in means.iterrows()]
    series = {_ROLE_LABELS[r]: means[f"{r}_{score}"].astype(float).tolist() for r in roles}
    several = "seed" in runs.columns and runs["seed"].nunique() > 1
    return bar_plot(labels, series, title=f"{score} per arm" + (" (means over seeds)" if several else ""),
                    ylabel=score)


def layer_heatmap(table: pd.DataFrame | None):
    """Heatmap of linear CKA, converted target layers × guide layers; None without a layer_cka table."""
    if table is None or table.empty:
        return None
    wide = table.pivot_table(index="layer_converted", columns="layer_guide", values="value", aggfunc="first",
                             sort=False)
    wide = wide.reindex(index=list(dict.fromkeys(table["layer_converted"])),
                        columns=list(dict.fromkeys(table["layer_guide"])))
    wide.index.name, wide.columns.name = "converted target", "guide"
    return heatmap_svg(wide, title="linear CKA: converted target × guide", vmin=0.0, vmax=1.0)


def _points(value: float) -> str:
    return f"{100 * value:+.1f} points"


def headline(summary: dict[str, Any], score: str, higher: bool) -> str | None:
    """The report's first sentence: converted vs scratch (means over seeds), converted − scratch paired by
    seed with its 95 % t interval, "beyond noise" only when the interval excludes 0 (None without a
    scratch baseline)."""
    conv, guide = summary.get(f"converted_{score}"), summary.get(f"guide_{score}")
    scratch = summary.get(f"scratch_{score}")
    if conv is None or scratch is None or summary.get("gain_over_scratch") is None:
        return None
    seeds = len(summary.get("seeds") or [0])
    gain = interval_of(summary, "gain_over_scratch", seeds)
    # accuracies read as points, perplexities as numbers
    gain_text = gain.scaled(100).text(1, " points") if higher else gain.text(3, " lower perplexity")
    mean = f" (means over {seeds} seeds)" if seeds > 1 else ""
    noise = ("" if seeds < 2 else " — beyond noise: the interval excludes 0." if beyond_noise(gain)
             else " — not beyond noise: the interval includes 0.")
    arm = f"{summary.get('schedule')} · {summary.get('metric')} · {summary.get('guide_init')} guide"
    return (f"Converted target ({arm}): {score} {_text(conv)} vs {_text(scratch)}{mean} for the same "
            f"architecture trained from scratch for at least as many optimizer steps (best validation epoch); "
            f"converted − scratch, paired by seed: {gain_text}{noise or '.'} The guide has {_text(guide)}.")


def findings(summary: dict[str, Any], runs: pd.DataFrame, score: str, higher: bool) -> list[str]:
    """Two or three sentences from the summary: the headline (converted vs the converged scratch
    baseline, paired by seed with its interval), the probe and the distillation baseline, and the budgets."""
    out: list[str] = []
    conv, guide = summary.get(f"converted_{score}"), summary.get(f"guide_{score}")
    arm = f"{summary.get('schedule')} · {summary.get('metric')} · {summary.get('guide_init')} guide"
    if conv is None:
        return out
    first = headline(summary, score, higher)
    if first is not None:
        out.append(first)
    else:
        out.append(f"Converted target ({arm}): {score} {_text(conv)}; the guide has {_text(guide)} (no scratch "
                   "baseline was run).")
    probe, kd = summary.get(f"probe_{score}"), summary.get(f"kd_{score}")
    parts = []
    if probe is not None:
        parts.append(f"a linear probe on the aligned features before fine-tuning reaches {_text(probe)}")
    if kd is not None:
        parts.append(f"logit distillation from the guide reaches {_text(kd)}")
    if parts:
        out.append("; ".join(parts).capitalize() + ".")
    maybe = [f"conversion {summary['converted_steps']} optimizer steps ({summary.get('align_steps')} aligning)"
             if summary.get("converted_steps") is not None else None,
             f"scratch {summary['scratch_steps']}" if summary.get("scratch_steps") is not None else None,
             f"distillation {summary['kd_steps']}" if summary.get("kd_steps") is not None else None]
    steps = [t for t in maybe if t]
    arms = runs.groupby([c for c in ARM if c in runs.columns], sort=False)[f"converted_{score}"].mean()
    if len(arms) > 1:
        best_key = arms.idxmax() if higher else arms.idxmin()
        best = dict(zip([c for c in ARM if c in runs.columns], best_key, strict=True))
        out.append(f"Best of the {len(arms)} arms: {_arm_label(best, _sweep(runs))} with {_text(arms[best_key])}"
                   f"{' (mean over seeds)' if runs['seed'].nunique() > 1 else ''}. Budgets: {', '.join(steps)}.")
    elif steps:
        out.append(f"Budgets: {', '.join(steps)}.")
    return out


BUDGET_RULES = {
    "plateau": "every arm trains until it is no longer still improving on validation, at least {floor} and at "
               "most {cap} labelled epochs (a language model's alignment steps count as labelled steps)",
    "steps": "the baselines train the conversion's total optimizer steps (alignment included), with cosine decay",
    "labelled": "the baselines train the converted arm's head + fine-tuning steps, with cosine decay",
}


def budget_rule(settings: dict[str, Any]) -> str:
    """The run's budget rule in words (``meta.settings``; a run made before the rules were named: ``steps``)."""
    rule = settings.get("baseline_budget", "steps")
    return f"{rule}: " + BUDGET_RULES.get(rule, "").format(floor=_text(settings.get("floor_epochs")),
                                                          cap=_text(settings.get("cap_epochs")))


def cautions(summary: dict[str, Any], tables: dict[str, pd.DataFrame], meta: dict[str, Any],
             score: str) -> list[str]:
    """What to distrust: baselines without a validation split or stopped by their cap, stages stopped
    by the step cap with the loss still above the threshold, the baselines' cost."""
    out: list[str] = []
    baselines = tables.get("baselines", pd.DataFrame())
    if not baselines.empty:
        improving = baselines[baselines["still_improving"].astype(bool)] if "still_improving" in baselines else \
            baselines.iloc[0:0]
        if summary.get("val_samples") == 0:
            out.append("No validation split (val_fraction 0): the baselines' last epoch is scored, not their best.")
        elif not improving.empty:
            names = ", ".join(dict.fromkeys(
                f"{r['baseline']}{'-' + str(r['guide_init']) if r['guide_init'] == r['guide_init'] and r['guide_init'] else ''}"
                for _, r in improving.iterrows()))
            out.append(f"Baseline(s) {names} had their best validation epoch near the end of their budget: they "
                       "may still improve with more epochs (baseline_max_epochs, the cap of the plateau rule; "
                       "baseline_epochs under the earlier rules).")
    if summary.get("still_improving"):
        out.append("The converted arm's fine-tuning had its best validation epoch near the end of its budget (same "
                   "rule as the baselines): it may still improve with more epochs (finetune_epochs).")
    stage_summary = tables.get("stage_summary", pd.DataFrame())
    if not stage_summary.empty and "stop_loss" in stage_summary.columns:
        thr = stage_summary["stop_loss"]
        capped = stage_summary[thr.notna() & (stage_summary["stopped"] != "stop_loss")]
        if not capped.empty:
            out.append(f"{len(capped)} of {len(stage_summary)} alignment stages hit their step cap with the loss "
                       "still above the threshold (stages.csv: steps, final_loss, rule).")
    runs = tables.get("runs", pd.DataFrame())
    if not baselines.empty and not runs.empty and "seconds" in baselines.columns:
        base, arms = float(baselines["seconds"].sum()), float(runs["seconds"].sum())
        if base > arms:
            out.append(f"The baselines cost more than the conversion: {base:.3g} s of training against "
                       f"{arms:.3g} s for the converted arm(s) — each trains at least as many optimizer steps as "
                       "the longest conversion arm.")
    guide = summary.get(f"guide_{score}")
    if score == "accuracy" and guide is not None and summary.get("guide_init") == "trained" \
            and summary.get("guide_val_accuracy") is not None and guide < 0.5:
        out.append(f"The trained guide reaches only {_text(guide)} test accuracy "
                   f"(validation {_text(summary.get('guide_val_accuracy'))}); train it longer (train_guide).")
    return out


def context(result) -> dict[str, Any]:
    """Everything ``convert.html.j2`` shows, prepared from ``result`` (a ConvertResult)."""
    summary, extra, tables = result.summary, result.extra, result.tables
    score = extra.get("score", "accuracy")
    runs = tables.get("runs", pd.DataFrame())
    header, body = final_table(runs, score) if not runs.empty else ([], [])
    stage_summary = tables.get("stage_summary", pd.DataFrame())
    ranks = _sweep(runs) if not runs.empty else False
    stage_rows = []
    for _, row in stage_summary.iterrows():
        stage_rows.append([_arm_label(row, ranks), str(row["stage"]), _text(_plain(row["steps"])),
                           str(row.get("rule", row["stopped"])), _text(row["final_loss"]), _text(row["final_lr"]),
                           _text(row.get(f"hybrid_{score}")), _text(row["seconds"])])
    baselines = tables.get("baselines", pd.DataFrame())
    baseline_rows = [[str(r["baseline"]), str(r["guide_init"] or "—"), _text(_plain(r["steps"])),
                      _text(_plain(r["min_steps"])), _text(_plain(r["best_step"])),
                      "yes" if bool(r.get("still_improving", False)) else "no",
                      _text(r.get(f"val_{score}")), _text(r.get(f"test_{score}")), _text(r["seconds"])]
                     for _, r in baselines.iterrows()]
    higher = extra.get("higher_is_better", True)
    stages = tables.get("stages", pd.DataFrame())
    return {
        "findings": findings(summary, runs, score, higher) if not runs.empty else [],
        "seed_plot": seed_plot(runs, score, higher) if not runs.empty else None,
        "seeds": len(summary.get("seeds") or [0]),
        "aggregate_rows": aggregate_rows(tables.get("aggregate"), score),
        "budget_rows": budget_rows(runs, tables.get("baselines")) if not runs.empty else [],
        "budget_rule": budget_rule(result.meta.get("settings", {})),
        "cautions": cautions(summary, tables, result.meta, score),
        "baseline_rows": baseline_rows,
        "rank_plot": rank_plot(runs, stages, score) if not runs.empty else None,
        "layer_loss_plots": layer_loss_plots(stages),
        "hybrid_plot": hybrid_plot(stage_summary, score),
        "finetune_plot": finetune_curves(tables.get("curves", pd.DataFrame())),
        "validation_plot": validation_curves(tables.get("validation"), score),
        "summary_rows": [(k, _text(v)) for k, v in summary.items()],
        "final_header": header, "final_rows": body, "score": score,
        "lower_is_better": not extra.get("higher_is_better", True),
        "score_plot": score_plot(runs, score) if not runs.empty else None,
        "stage_heatmaps": stage_heatmaps(tables.get("stages", pd.DataFrame())),
        "loss_curves": loss_curves(tables.get("curves", pd.DataFrame())),
        "layer_heatmap": layer_heatmap(tables.get("layer_cka")),
        "stage_rows": stage_rows,
        "slots": extra.get("slots", []),
        "plan": extra.get("plan", ""), "head": extra.get("head", ""),
    }
