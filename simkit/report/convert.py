"""Report context of a ``convert`` result (Network of Theseus).

Draws only from the result's tables (``runs``, ``stages``, ``stage_summary``, ``curves``,
``layer_cka``), summary and extra: a stage × layer CKA heatmap per arm, loss curves per stage, the
final table (guide, probe, converted, scratch, distillation per schedule/metric/guide init) and the
converted × guide layer CKA heatmap.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from simkit.report.figures import bar_plot, heatmap_svg, img, new_figure

_ROLES = ("guide", "probe", "converted", "scratch", "kd")
_ROLE_LABELS = {"guide": "guide", "probe": "linear probe (before fine-tuning)", "converted": "converted",
                "scratch": "target from scratch", "kd": "logit distillation"}


def _text(value: Any) -> str:
    if isinstance(value, float):
        return "n/a" if value != value else f"{value:.4g}"
    if value is None:
        return "n/a"
    return str(value)


def _arm_label(row: pd.Series) -> str:
    return f"{row['schedule']} · {row['metric']} · {row['guide_init']} guide"


def stage_heatmaps(stages: pd.DataFrame) -> list[dict[str, Any]]:
    """One (stage × layer) CKA heatmap per (schedule, metric, guide_init) arm."""
    out: list[dict[str, Any]] = []
    if stages.empty:
        return out
    for (schedule, metric, init), part in stages.groupby(["schedule", "metric", "guide_init"], sort=False):
        wide = part.pivot_table(index="stage", columns="layer", values="value", aggfunc="first", sort=False)
        wide = wide.reindex(index=list(dict.fromkeys(part["stage"])), columns=list(dict.fromkeys(part["layer"])))
        wide.index.name, wide.columns.name = "stage", "replaced layer"
        title = f"{schedule} · {metric} · {init} guide"
        out.append({"title": title, "svg": heatmap_svg(wide, title=title, vmin=0.0, vmax=1.0)})
    return out


def loss_curves(curves: pd.DataFrame) -> list[dict[str, Any]]:
    """Per arm: one plot of the alignment loss per stage, one of the task loss (head, fine-tune)."""
    out: list[dict[str, Any]] = []
    if curves.empty:
        return out
    frame = curves.fillna({"schedule": "", "metric": "", "guide_init": ""})
    for (schedule, metric, init), part in frame.groupby(["schedule", "metric", "guide_init"], sort=False):
        if not schedule:
            continue
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
            out.append({"title": f"{label}: {schedule} · {metric} · {init} guide",
                        "img": _multi_line(xs, series, f"{label}: {schedule} · {metric} · {init} guide",
                                           logy and (sub["loss"] > 0).all())})
    base = frame[frame["schedule"] == ""]
    if not base.empty:
        xs = [rows["step"].to_numpy() for _, rows in base.groupby("phase", sort=False)]
        series = {phase: rows["loss"].to_numpy() for phase, rows in base.groupby("phase", sort=False)}
        out.append({"title": "baselines: training loss", "img": _multi_line(xs, series, "baselines: training loss", False)})
    return out


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
    header = ["schedule", "metric", "guide init"] + [f"{_ROLE_LABELS[r]} {score}" for r in roles] + ["seconds"]
    body = []
    for _, row in runs.iterrows():
        body.append([str(row["schedule"]), str(row["metric"]), str(row["guide_init"])]
                    + [_text(row[f"{r}_{score}"]) for r in roles] + [_text(row.get("seconds"))])
    return header, body


def score_plot(runs: pd.DataFrame, score: str):
    roles = [r for r in _ROLES if f"{r}_{score}" in runs.columns and runs[f"{r}_{score}"].notna().any()]
    if runs.empty or not roles:
        return None
    labels = [_arm_label(r) for _, r in runs.iterrows()]
    series = {_ROLE_LABELS[r]: runs[f"{r}_{score}"].astype(float).tolist() for r in roles}
    return bar_plot(labels, series, title=f"{score} per arm", ylabel=score)


def layer_heatmap(table: pd.DataFrame | None):
    if table is None or table.empty:
        return None
    wide = table.pivot_table(index="layer_converted", columns="layer_guide", values="value", aggfunc="first",
                             sort=False)
    wide = wide.reindex(index=list(dict.fromkeys(table["layer_converted"])),
                        columns=list(dict.fromkeys(table["layer_guide"])))
    wide.index.name, wide.columns.name = "converted target", "guide"
    return heatmap_svg(wide, title="linear CKA: converted target × guide", vmin=0.0, vmax=1.0)


def context(result) -> dict[str, Any]:
    summary, extra, tables = result.summary, result.extra, result.tables
    score = extra.get("score", "accuracy")
    runs = tables.get("runs", pd.DataFrame())
    header, body = final_table(runs, score) if not runs.empty else ([], [])
    stage_summary = tables.get("stage_summary", pd.DataFrame())
    stage_rows = []
    for _, row in stage_summary.iterrows():
        stage_rows.append([_arm_label(row), str(row["stage"]), _text(row["steps"]), str(row["stopped"]),
                           _text(row["final_loss"]), _text(row["final_lr"]), _text(row["seconds"])])
    return {
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
