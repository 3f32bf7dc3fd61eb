"""Report context for ``simkit graft`` (kind "graft"): tables plus α(t), undo distance, loss and E3 plots."""

from __future__ import annotations

from typing import Any

from simkit.report.figures import img, new_figure

ARM_COLORS = {"shadow": "#1f77b4", "net2net": "#2ca02c", "double_zero": "#d62728"}


def _e2_figure(e2, column: str, ylabel: str, title: str, log: bool = False):
    fig, ax = new_figure(6.4, 3.4)
    for arm, part in e2.groupby("arm", sort=False):
        ax.plot(part["step"], part[column], label=str(arm), color=ARM_COLORS.get(str(arm)), lw=1.3)
    if log:
        ax.set_yscale("symlog", linthresh=1e-8)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(frameon=False)
    return img(fig, title)


def _f3_figure(f3):
    fig, ax = new_figure(6.4, 3.4)
    ax.plot(f3["step"], f3["loss_uninterrupted"], label="uninterrupted", lw=2.2, color="#98a2b3")
    ax.plot(f3["step"], f3["loss_killed_resumed"], label="killed + resumed", lw=1.0, ls="--", color="#1f77b4")
    ax.plot(f3["step"], f3["loss_resumed_without_moments"], label="resumed without moments", lw=1.0,
            color="#d62728")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("F3: losses of the three runs")
    ax.legend(frameon=False)
    return img(fig, "F3 losses")


def _e3_figure(e3):
    fig, ax = new_figure(5.0, 3.4)
    ax.scatter(e3["cone_nodes"], e3["recompute_s"] * 1e3, color="#1f77b4")
    for _, row in e3.iterrows():
        ax.annotate(str(row["site"]), (row["cone_nodes"], row["recompute_s"] * 1e3), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("nodes recomputed (graft + downstream cone)")
    ax.set_ylabel("recompute time (ms)")
    ax.set_title("E3: recompute cost vs cone size")
    return img(fig, "E3 cone cost")


def _records(frame) -> list[dict[str, Any]]:
    return frame.to_dict(orient="records") if frame is not None and len(frame) else []


def context(result) -> dict[str, Any]:
    tables = result.tables
    e2, e3, f3 = tables.get("e2"), tables.get("e3"), tables.get("f3")
    figures: dict[str, Any] = {}
    if e2 is not None and len(e2):
        figures["alpha"] = _e2_figure(e2, "alpha", "α", "α(t) per arm")
        figures["undo"] = _e2_figure(e2, "undo_distance", "|α|·mean‖R(x)‖", "undo distance per arm")
        figures["loss"] = _e2_figure(e2, "loss", "training loss", "E2 training loss per arm")
        figures["grads"] = _e2_figure(e2, "branch_max_abs_grad", "max |∂L/∂θ|", "branch gradient per arm", log=True)
    if f3 is not None and len(f3):
        figures["f3"] = _f3_figure(f3)
    if e3 is not None and len(e3):
        figures["e3"] = _e3_figure(e3)
    return {"figures": figures, "e1_rows": _records(tables.get("e1")), "e2_rows": _records(tables.get("e2_arms")),
            "e3_rows": _records(e3), "settings": result.meta.get("settings", {})}
