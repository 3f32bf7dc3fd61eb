"""The baselines of one seed of ``convert``: the target from scratch and logit distillation from each
guide init, with the fine-tuning recipe and a budget at least the conversion's.

Under the ``plateau`` rule (the default) each trains until it is no longer still improving on validation,
at least max(the converted arm's labelled epochs ``floor_epochs``, the longest converted arm's labelled
steps — for a language model its alignment steps included) and at most ``cap_epochs``. Under the earlier
rules each trains for max(the longest conversion arm's optimizer steps — all of them, or its labelled-training
steps with ``baseline_budget="labelled"`` —, ``baseline_epochs`` epochs capped by
``baseline_max_epochs``) steps. Every baseline keeps the weights of its best validation epoch and is flagged
``still_improving`` by the same rule as the converted arm's fine-tuning
(:meth:`~simkit.conversion.context.RunContext.still_improving`). Distillation is ``kd_alpha``·CE on the
labels + (1 − ``kd_alpha``)·T²·KL to the guide (:func:`~simkit.conversion.finetune.distill`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from simkit.conversion.context import EVAL_BATCH, Rows, RunContext
from simkit.conversion.finetune import distill, score, train_task
from simkit.conversion.modules import reinitialise
from simkit.conversion.plans import Slot, build_target
from simkit.errors import SimkitError
from simkit.seeding import derive_seed
from simkit.training import TrainHistory, ValidationMonitor


@dataclass
class Student:
    """A baseline's student: the target architecture (``guide`` with the first rank's ``slots``), and for
    distillation the guide init ``gi`` whose ``logits`` (on the training rows) it learns (scratch: ``gi``
    empty)."""

    guide: nn.Module
    slots: list[Slot]
    gi: str = ""
    logits: Tensor | None = None


@dataclass
class _Baseline:
    """One baseline run: ``kind`` (scratch, kd), its student, the optimizer steps it trains at least
    (the longest conversion arm's) and the rank its rows are labelled with."""

    kind: str
    student: Student
    min_steps: int
    rank: int

    @property
    def name(self) -> str:
        """Its checkpoint name: ``scratch`` or ``kd-<init>``."""
        return "scratch" if self.kind == "scratch" else f"kd-{self.student.gi}"

    @property
    def labels(self) -> dict[str, Any]:
        """The columns that name this baseline in the curves and validation tables."""
        return {"schedule": "", "metric": "", "guide_init": "" if self.kind == "scratch" else self.student.gi,
                "rank": self.rank}


def kd_baseline(ctx: RunContext, student: Student, rows_: Rows, init_runs: list[dict[str, Any]]) -> None:
    """Logit distillation from one guide init for at least its longest arm's steps; fills its arms' rows."""
    kd_score = _train_baseline(ctx, _Baseline("kd", student, _min_steps(ctx, init_runs), ctx.sweep.ranks[0]), rows_)
    _fill(rows_, init_runs, "kd", kd_score)


def scratch_baseline(ctx: RunContext, student: Student, rows_: Rows) -> float | None:
    """The target trained from scratch for at least the longest arm's steps (None when not asked for);
    fills every arm's scratch columns and its gain over scratch."""
    if "scratch" not in ctx.sweep.baselines:
        return None
    scratch_score = _train_baseline(ctx, _Baseline("scratch", student, _min_steps(ctx, rows_.runs), ctx.sweep.ranks[0]),
                                    rows_)
    _fill(rows_, rows_.runs, "scratch", scratch_score)
    for r in rows_.runs:
        r["gain_over_scratch"] = gain(r[f"converted_{rows_.s}"], scratch_score, ctx.task.higher_is_better)
    return scratch_score


def _min_steps(ctx: RunContext, runs: list[dict[str, Any]]) -> int:
    """The optimizer steps a baseline trains at least: the longest arm's total (``baseline_budget``
    ``steps``), its labelled-training steps, head + fine-tuning (``labelled``), or (``plateau``) the
    longest arm's labelled steps (a language model's alignment counted) and never fewer than the floor's."""
    rule = ctx.settings.baseline_budget
    if rule == "plateau":
        return max([ctx.steps_of(ctx.settings.floor_epochs)] + [r["labelled_steps"] for r in runs])
    if rule == "labelled":
        return max(r["head_steps"] + r["finetune_steps"] for r in runs)
    return max(r["steps"] for r in runs)


def _fill(rows_: Rows, runs: list[dict[str, Any]], kind: str, test_score: float) -> None:
    """The ``<kind>_`` columns (score, steps, labelled epochs, still improving) of ``runs`` from the last
    baseline row."""
    base = rows_.baselines[-1]
    for r in runs:
        r[f"{kind}_{rows_.s}"], r[f"{kind}_steps"] = test_score, base["steps"]
        r[f"{kind}_labelled_epochs"] = base["labelled_epochs"]
        r[f"{kind}_still_improving"] = base["still_improving"]
        r[f"{kind}_stopped"] = base["stop"]


def _train_baseline(ctx: RunContext, base: _Baseline, rows_: Rows) -> float:
    """Scratch or distillation with a fair budget: under the plateau rule until no longer still improving
    (at least ``min_steps``, at most the cap), else the fine-tuning recipe (AdamW, cosine decay) for
    max(``min_steps`` — the longest conversion arm —, ``baseline_epochs``) optimizer steps; the weights of
    the best validation epoch kept; returns its test score."""
    settings, student, name = ctx.settings, base.student, base.name
    with ctx.timed(name):
        model = reinitialise(build_target(student.guide, student.slots), derive_seed(ctx.seed, base.kind))
        floor = base.min_steps if settings.plateau_budget else \
            max(base.min_steps, int(math.ceil(settings.baseline_budget_epochs * ctx.per_epoch)))
        budget = ctx.budget(floor)
        mon = ctx.monitor(model, budget)
        fit_b = ctx.fit(name, **ctx.training(budget))
        if base.kind == "scratch":
            hist = train_task(model, ctx.task, ctx.data.train, fit_b, monitor=mon)
        else:
            if student.logits is None:
                raise SimkitError("internal: logit distillation needs the guide's logits cache")
            hist = distill(model, ctx.task, ctx.data.train, student.logits, fit_b, settings.kd_temperature,
                           alpha=settings.kd_alpha, monitor=mon)
        test_score = score(model, ctx.task, ctx.data.test[0], ctx.data.test[1], EVAL_BATCH)
    rows_.add_curve(name, hist, base.labels)
    rows_.add_validation(name, mon, base.labels)
    rows_.baselines.append(_baseline_row(ctx, base, hist, mon, test_score) | {"stop": budget.stop(hist.stopped)})
    return test_score


def _baseline_row(ctx: RunContext, base: _Baseline, hist: TrainHistory, mon: ValidationMonitor | None,
                  test_score: float) -> dict[str, Any]:
    """The ``baselines`` row of one baseline run: its steps and labelled epochs, why it stopped, its best
    validation epoch and whether it was still improving, its validation and test scores."""
    best_step, improving = ctx.still_improving(mon, hist.steps)
    s = ctx.task.score
    return {"baseline": base.kind, "guide_init": base.labels["guide_init"], "steps": hist.steps,
            "labelled_epochs": round(hist.steps / ctx.per_epoch, 3),
            "min_steps": base.min_steps, "stopped": hist.stopped, "best_step": best_step,
            "still_improving": improving, f"val_{s}": mon.best if mon is not None else None,
            f"test_{s}": test_score, "seconds": round(ctx.seconds(base.name), 2), "seed": ctx.seed}


def gain(converted: float, scratch: float | None, higher_is_better: bool) -> float | None:
    """Improvement of the converted score over scratch, in the score's own direction."""
    if scratch is None:
        return None
    return converted - scratch if higher_is_better else scratch - converted
