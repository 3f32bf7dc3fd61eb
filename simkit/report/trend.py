"""Report context of a ``trend`` result (``simkit.Monitor``, ``simkit trend``): findings (the order in which
layers stabilise, the last step against chance), one figure per measure (a line per layer over the steps,
coloured by depth, its chance band and the step it stabilises), the stable step by depth, then tables.

Reads only the result's ``steps`` and ``convergence`` tables and its summary (the stable steps and the
depth order were computed by ``simkit.monitor.convergence`` when the run ended).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from simkit.report.figures import format_number, html_table, img, new_figure

REFERENCE_WORDS = {"first": "the model at the first measured step", "final": "the model at the last step",
                   "fixed": "a fixed reference model", "alongside": "a second model trained alongside"}
FEW_STEPS = 3


def _reference_words(reference: str) -> str:
    return REFERENCE_WORDS.get(reference, f"the reference model {reference}")


def _same(frame: pd.DataFrame) -> pd.DataFrame:
    """The same-position pairs (each layer with the reference's layer at its depth) when there are any."""
    same = frame[frame["depth"] == frame["reference_depth"]] if "reference_depth" in frame.columns else frame
    return same if len(same) else frame


def _depth_colours(depths: list[int]) -> dict[int, Any]:
    """Viridis (colour-blind safe, readable in grey) from the first layer to the last."""
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    top = max(max(depths), 1) if depths else 1
    return {d: cmap(0.9 * d / top) for d in depths}


def trend_figure(steps: pd.DataFrame, convergence: pd.DataFrame, metric: str, reference: str):
    """One line per layer pair of ``metric`` over the steps, its chance band, a mark at its stable step."""
    rows = _same(steps[steps["metric"] == metric])
    stable = convergence[convergence["metric"] == metric].set_index(["layer", "reference_layer"])["stable_step"]
    pairs = list(dict.fromkeys(zip(rows["layer"], rows["reference_layer"], rows["depth"], strict=True)))
    colours = _depth_colours([int(p[2]) for p in pairs])
    fig, ax = new_figure(7.0, 3.8)
    banded = False
    for layer, reference_layer, depth in pairs:
        part = rows[(rows["layer"] == layer) & (rows["reference_layer"] == reference_layer)].sort_values("step")
        colour = colours[int(depth)]
        label = layer if layer == reference_layer else f"{layer} ~ {reference_layer}"
        ax.plot(part["step"], part["value"], color=colour, lw=1.5, marker="o", ms=2.5, label=label)
        banded = _chance_band(ax, part, colour) or banded
        at = stable.get((layer, reference_layer), math.nan)
        if isinstance(at, int | float) and math.isfinite(at):
            value = part.loc[part["step"] == at, "value"]
            ax.plot([at], [float(value.iloc[0])] if len(value) else [math.nan], marker="v", ms=8, color=colour,
                    markeredgecolor="black", ls="none")
    ax.set_xlabel("training step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} against {_reference_words(reference)} (▼ stable from)")
    handles, labels = ax.get_legend_handles_labels()
    if banded:
        from matplotlib.patches import Patch

        handles.append(Patch(color="#98a2b3", alpha=0.5, lw=0))
        labels.append("chance: null mean to p95")
    ax.legend(handles, labels, frameon=False, fontsize=9, title="layer (by depth)", title_fontsize=9, loc="best")
    return img(fig, f"{metric} over training")


def _chance_band(ax: Any, part: pd.DataFrame, colour: Any) -> bool:
    """Between the chance level and the null's 95th percentile when there is a null (True), else a dashed
    line at the chance level."""
    if "chance" not in part.columns or not np.isfinite(part["chance"].to_numpy(dtype=float)).any():
        return False
    if "null_p95" in part.columns and np.isfinite(part["null_p95"].to_numpy(dtype=float)).any():
        ax.fill_between(part["step"], part["chance"], part["null_p95"], color=colour, alpha=0.2, lw=0)
        return True
    ax.plot(part["step"], part["chance"], color=colour, lw=0.8, ls="--")
    return False


def stable_figure(convergence: pd.DataFrame):
    """The step each layer stabilises at, by depth, one line per measure."""
    fig, ax = new_figure(5.6, 3.2)
    for metric, part in _same(convergence).groupby("metric", sort=False):
        part = part.sort_values("depth")
        ax.plot(part["depth"], part["stable_step"], marker="o", lw=1.5, label=str(metric))
    layers = _same(convergence).drop_duplicates("depth").sort_values("depth")
    ax.set_xticks(layers["depth"].tolist(), [str(name) for name in layers["layer"]], rotation=30, ha="right")
    ax.set_xlabel("layer (input → output)")
    ax.set_ylabel("stable from step")
    ax.set_title("When each layer stabilises")
    ax.legend(frameon=False, fontsize=9)
    return img(fig, "stable step by depth")


def order_sentence(summary: dict[str, Any], metric: str) -> str:
    """"layers converge bottom-up: blocks.0 stabilises at step 100, blocks.1 at step 300, ..."."""
    steps = summary.get("stable_steps") or {}
    order = summary.get("convergence_order", "unknown")
    delta = format_number(summary.get("delta"))
    listed = ", ".join(f"{layer}{' stabilises' if i == 0 else ''} at step {step}" if step is not None
                       else f"{layer} never{' stabilises' if i == 0 else ''}"
                       for i, (layer, step) in enumerate(steps.items()))
    how = f"({metric} within δ = {delta} of its value at step {summary.get('last_step')})"
    if order == "bottom-up":
        return f"Layers converge bottom-up: {listed} {how}."
    if order == "top-down":
        return f"Layers converge top-down, the last layer first: {listed} {how}."
    if order == "together":
        return f"Layers converge together: {listed} {how}."
    if order == "mixed":
        rho = summary.get("depth_rank_correlation")
        corr = f"; Spearman ρ of depth and stable step {format_number(rho, 2)}" if rho is not None else ""
        return f"Layers converge in no depth order{corr}: {listed} {how}."
    return f"Too few steps or layers to order the layers' convergence: {listed or 'no layer'} {how}."


def last_step_sentence(steps: pd.DataFrame, metric: str, reference: str) -> str:
    """The last measured step's values against the reference, and how many beat chance."""
    rows = _same(steps[steps["metric"] == metric])
    last = rows[rows["step"] == rows["step"].max()].sort_values("depth")
    values = ", ".join(f"{layer} {format_number(value, 3)}" for layer, value in zip(last["layer"], last["value"],
                                                                                     strict=True))
    beats = int(last["beats_chance"].astype(bool).sum()) if "beats_chance" in last.columns else 0
    chance = (f"; {beats} of {len(last)} beat chance" if "beats_chance" in last.columns else "")
    return (f"At the last step ({int(last['step'].iloc[0])}) {metric} against {_reference_words(reference)}: "
            f"{values}{chance}.")


def cautions(result: Any, steps: pd.DataFrame) -> list[str]:
    """What to distrust: few steps, a final reference, missing values, layers at chance."""
    summary = result.summary
    out = []
    if int(summary.get("steps") or 0) < FEW_STEPS:
        out.append(f"Only {summary.get('steps')} measured steps: when a layer stabilises is known only to within "
                   "the spacing of the steps.")
    if summary.get("reference") == "final":
        out.append("The reference is the last step itself, so every layer's last value is the maximum by "
                   "construction; read how early each layer approaches it.")
    missing = int(steps["value"].isna().sum())
    if missing:
        out.append(f"{missing} values are missing (NaN): constant activations on the probe set (see the warnings).")
    last = steps[steps["step"] == steps["step"].max()]
    if "beats_chance" in last.columns and not last["beats_chance"].astype(bool).all():
        out.append("Some layers are within their chance band at the last step: their similarity to the reference "
                   "is not told apart from a random pairing of samples.")
    return out


def context(result: Any) -> dict[str, Any]:
    """Findings, cautions, figures and tables of a trend result."""
    steps, convergence = result.tables["steps"], result.tables["convergence"]
    summary = result.summary
    metrics = list(dict.fromkeys(steps["metric"]))
    reference = str(summary.get("reference", ""))
    if not metrics:
        return {"findings": ["No step was measured."], "cautions": [], "figures": [], "stable": None,
                "convergence_table": "", "last_table": ""}
    last = steps[steps["step"] == steps["step"].max()]
    return {
        "findings": [order_sentence(summary, metrics[0]), last_step_sentence(steps, metrics[0], reference)],
        "cautions": cautions(result, steps),
        "figures": [trend_figure(steps, convergence, m, reference) for m in metrics],
        "stable": stable_figure(convergence) if len(convergence) else None,
        "reference_words": _reference_words(reference),
        "convergence_table": html_table(convergence, numeric=("depth", "reference_depth", "final_value",
                                                              "stable_step", "final_step")),
        "last_table": html_table(last, numeric=("step", "depth", "reference_depth", "value", "chance", "null_p95")),
    }
