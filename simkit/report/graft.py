"""Report context for ``simkit graft`` (kind "graft"): findings (the verdict and what each check
measured) and cautions computed from the summary, then α(t), undo distance, loss, E3 and F3 plots,
then the tables."""

from __future__ import annotations

import math
from typing import Any

from simkit.report.figures import format_number, img, new_figure

PAPER_E2_STEPS = 600  # the paper's E2 arms run 600 SGD steps (spec §4)

ARM_COLORS = {"shadow": "#0072B2", "net2net": "#E69F00", "double_zero": "#D55E00"}  # Okabe–Ito: colour-blind safe


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


def _n(value: Any) -> str:
    return format_number(value) if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


def verdict_sentence(summary: dict[str, Any], settings: dict[str, Any]) -> str:
    """"graft on M (gate, branch after SITE, N steps): E1, E2, E3, F3 pass." (the summary's verdict)."""
    where = (f"graft on {settings.get('model', 'the model')} ({settings.get('gate', '?')} gate, "
             f"{settings.get('branch', '?')} branch after {settings.get('after', '?')}, "
             f"{summary.get('e2_steps', settings.get('steps', '?'))} steps)")
    return f"{where}: {summary.get('verdict', '?')}."


def _finite(*values: Any) -> bool:
    return all(isinstance(v, int | float) and math.isfinite(v) for v in values)


def _e3_interval(summary: dict[str, Any]) -> str:
    """`` (95 % interval [low, high], Fisher z)`` when the summary has it, else nothing."""
    low, high = summary.get("e3_cone_cost_correlation_low"), summary.get("e3_cone_cost_correlation_high")
    return f" (95 % interval [{low:.3f}, {high:.3f}], Fisher z)" if _finite(low, high) else ""


def _bookkeeping(summary: dict[str, Any]) -> str:
    """``; bookkeeping …`` (its median, slope per depth with its 95 % interval and verdict) when measured."""
    keys = ("e3_bookkeeping_median_s", "e3_bookkeeping_slope_s", "e3_bookkeeping_slope_low", "e3_bookkeeping_slope_high")
    values: list[Any] = [summary.get(k) for k in keys]
    if not _finite(*values):
        return ""
    median_ms, slope_us, low_us, high_us = (scale * float(v) for scale, v in zip((1e3, 1e6, 1e6, 1e6), values, strict=True))
    return (f"; the graft's bookkeeping took a median {median_ms:.3g} ms, {slope_us:+.3g} µs per depth "
            f"(95 % interval [{low_us:+.3g}, {high_us:+.3g}]): {summary.get('e3_bookkeeping_verdict')}")


def findings(summary: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """Three sentences: the verdict; E1 and E2 as measured; E3 and F3 as measured."""
    if "verdict" not in summary:  # a result from before the verdict keys existed
        return []
    out = [verdict_sentence(summary, settings)]
    dz = summary.get("e2_double_zero_max_abs_grad")
    out.append(f"The graft changed {_n(summary.get('e1_mismatches'))} of {_n(summary.get('e1_values_compared'))} "
               f"output values' bits; under plain SGD the shadow gate's α first had a gradient at step "
               f"{_n(summary.get('e2_shadow_alpha_first_grad_step'))} and its branch at step "
               f"{_n(summary.get('e2_shadow_branch_first_grad_step'))}, the net2net branch at step "
               f"{_n(summary.get('e2_net2net_branch_first_grad_step'))}, and the double-zero arm's largest "
               f"gradient was {_n(dz)}{' (exactly zero: nothing trains)' if dz == 0 else ''}.")
    corr = summary.get("e3_cone_cost_correlation")
    e3 = (f"recompute time against cone size correlates at {corr:.3f}{_e3_interval(summary)} over "
          f"{_n(summary.get('e3_sites'))} graft depths{_bookkeeping(summary)}"
          if isinstance(corr, int | float) and math.isfinite(corr) else "E3 measured no correlation")
    f3 = (f"the run killed after step {_n(summary.get('f3_killed_after_step'))} and resumed in a new process "
          f"from step {_n(summary.get('f3_resumed_from_step'))} is "
          f"{'bit-identical to' if summary.get('f3_resume_bit_identical') else 'not bit-identical to'} the "
          "uninterrupted run")
    diverge = summary.get("f3_without_moments_diverges_at_step")
    f3 += (f", and without the optimizer moments it diverges at step {_n(diverge)}" if diverge is not None
           else ", but without the optimizer moments it never diverges")
    out.append(f"{e3[0].upper()}{e3[1:]}; {f3}.")
    return out


def cautions(summary: dict[str, Any], e3_rows: list[dict[str, Any]]) -> list[str]:
    """What to distrust: fewer E1 values than the paper's, fewer E2 steps, E3 timings (a wall-clock
    measurement), a recompute slower than the full forward pass, E3 not measured."""
    out = []
    if summary.get("e1_note"):
        out.append(str(summary["e1_note"]))
    steps = summary.get("e2_steps")
    if isinstance(steps, int) and steps < PAPER_E2_STEPS:
        out.append(f"E2 and F3 ran {steps} steps, fewer than the paper's {PAPER_E2_STEPS}: the first-gradient "
                   "steps are the same, the final α and losses are not comparable to the paper's.")
    if summary.get("e3_note"):
        out.append(f"E3 was not measured: {summary['e3_note']}")
    elif not summary.get("e3_pass", True):
        out.append("E3's correlation comes from wall-clock timings (the fastest of several calls after a "
                   "warm-up) and falls below the pass threshold; a busy machine blurs it, so rerun on an idle "
                   "one before concluding that recompute cost does not follow the cone.")
    # the shallowest site's cone is the whole network plus the graft: only deeper ones must be cheaper
    slow = [r for r in e3_rows[1:] if r.get("recompute_s", 0) > r.get("full_forward_s", math.inf)]
    if slow:
        worst = max(slow, key=lambda r: r["recompute_s"] / r["full_forward_s"])
        out.append(f"Recomputing the cone after {worst['site']} took {_n(worst['recompute_s'])} s, more than a "
                   f"full forward pass ({_n(worst['full_forward_s'])} s), at {len(slow)} of the "
                   f"{len(e3_rows) - 1} graft depths below the first: the cached runner's overhead exceeds "
                   "what it saves there, or the timings are noisy.")
    return out


def context(result) -> dict[str, Any]:
    """Everything ``graft.html.j2`` shows, prepared from ``result`` (a GraftResult)."""
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
    settings = result.meta.get("settings", {})
    e3_rows = _records(e3)
    return {"figures": figures, "e1_rows": _records(tables.get("e1")), "e2_rows": _records(tables.get("e2_arms")),
            "e3_rows": e3_rows, "settings": settings, "findings": findings(result.summary, settings),
            "cautions": cautions(result.summary, e3_rows)}
