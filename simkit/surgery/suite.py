"""``simkit graft``: the exact-surgery paper's verification suite (E1, E2, E3, F3) on any model.

:func:`run_graft_suite` returns a :class:`GraftResult` (kind "graft") with tables ``e1`` (one row per
gate), ``e2`` (one row per arm and step: loss, α, gradients, ‖R(x)‖, undo distance |α|·mean‖R(x)‖),
``e2_arms`` (one row per arm: first steps with gradient, final α), ``e3`` (one row per graft depth) and ``f3`` (per-step losses of the three F3 runs). With ``resume`` the
E2 arms continue from their checkpoints in the run directory (bit-identically); E1 and E3 are cheap and
recomputed; F3 is about interruption itself and is always redone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simkit.results import GraftResult
from simkit.runinfo import Timer, run_meta
from simkit.surgery.tasks import SuiteSettings


def run_graft_suite(settings: SuiteSettings, out: str | Path, *, resume: bool = False) -> GraftResult:
    """Run E1, E2, E3 and F3 for ``settings``; checkpoints and worker files go under ``out``."""
    from simkit.forward import check_accepts
    from simkit.surgery.experiments import e1_shortfall, probe_rows, run_e1, run_e2, run_e3, run_f3
    from simkit.surgery.tasks import make_task

    s = settings.resolved()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    timer = Timer()
    with timer("setup"):
        task = make_task(s)
        check_accepts(task.make_model(), task.probe, "the model")
    with timer("e1"):
        e1 = run_e1(task, s)
    with timer("e2"):
        e2, e2_arms, e2_summary = run_e2(task, s, out, resume)
    with timer("e3"):
        e3, e3_summary = run_e3(task, s)
    with timer("f3"):
        f3, f3_summary = run_f3(task, s, out)
    main = e1[e1["gate"] == s.gate].iloc[0]
    summary: dict[str, Any] = {
        "e1_values_compared": int(main["values_compared"]),
        "e1_mismatches": int(main["mismatches"]),
        "e1_site_mismatches": int(main["site_mismatches"]),
        "e1_precondition_violations": int(main["violations"]),
        "e1_stream_negative_zeros": int(main["stream_negative_zeros"]),
        "e1_stream_nonfinite": int(main["stream_nonfinite"]),
        **e2_summary, **e3_summary, **f3_summary,
        "loss_kind": task.loss_kind,
    }
    e1_note = e1_shortfall(summary["e1_values_compared"], probe_rows(task.probe))
    if e1_note:  # the count is e1_values_compared; the note says why it matters (shown in the report)
        summary["e1_note"] = e1_note
    meta = run_meta(settings=s.to_dict(), model=s.model, data=s.data or "markov-chain tokens (seeded)",
                    seed=s.seed, loss_kind=task.loss_kind, timings=timer.seconds,
                    e2_optimizer="sgd", f3_optimizer="adamw")
    tables = {"e1": e1, "e2": e2, "e2_arms": e2_arms, "e3": e3, "f3": f3}
    return GraftResult(summary=summary, tables=tables, meta=meta)
