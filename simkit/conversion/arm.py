"""One conversion arm of ``convert``: a (guide init, rank, schedule, metric) aligned stage by stage,
recalibrated and scored after every stage, then its head trained alone and everything fine-tuned.

:class:`GuideView`: one guide init at one rank (the guide, its plan's slots and head, the cached guide
activations). :class:`Arm`: a view with a schedule and a metric. :func:`convert_arm` runs one arm,
adding its rows to a :class:`~simkit.conversion.context.Rows`, and returns an :class:`ArmOutcome`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from simkit.conversion.context import EVAL_BATCH, Rows, RunContext
from simkit.conversion.finetune import score, train_head, train_task
from simkit.conversion.plans import Slot, install
from simkit.conversion.schedules import (
    GuideCache,
    Stage,
    fresh_modules,
    hybrid_outputs,
    isolated_output,
    plan_stages,
    run_stage,
)
from simkit.conversion.task import Inputs
from simkit.errors import SimkitError
from simkit.metrics.cka import linear_cka
from simkit.seeding import derive_seed
from simkit.settings.convert import ConvertSettings
from simkit.training import recalibrate_batchnorm


def _has_bn(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def recalibrate(model: nn.Module, inputs: Inputs, batch_size: int) -> None:
    """BatchNorm running statistics recomputed on ``inputs`` (spec §1); no-op without BatchNorm."""
    if not _has_bn(model):
        return
    if isinstance(inputs, dict):
        raise SimkitError("BatchNorm recalibration needs tensor inputs; this model mixes BatchNorm with "
                          "tokenised dict inputs")
    recalibrate_batchnorm(model, inputs, batch_size)


def _cka_rows(values: list[Tensor], guide: list[Tensor], slots: Sequence[Slot], replaced: set[int],
              only: Sequence[int] | None = None,
              loss: Callable[[Tensor, Tensor], Tensor] | None = None) -> list[dict[str, Any]]:
    """One row per slot (or per slot in ``only``, whose values ``values`` holds in that order): linear
    CKA (``value``) of the converted representation (n, *shape) vs the guide's, and with ``loss`` the
    arm's alignment loss on the same rows (``loss``: what the stage minimised, on held-out data)."""
    chosen = list(range(len(slots))) if only is None else list(only)
    out = []
    for x, j in zip(values, chosen, strict=True):
        y = guide[j]
        row = {"layer": slots[j].label, "alignment_metric": "cka",
               "value": linear_cka(x.reshape(len(x), -1), y.reshape(len(y), -1)), "replaced": j in replaced}
        if loss is not None:
            with torch.no_grad():
                row["loss"] = float(loss(x, y))
        out.append(row)
    return out


@dataclass
class GuideView:
    """One guide init (``trained``/``random``) at one rank: the guide, its plan's slots and head, and its
    frozen activations on the training inputs (``cache``) and on the CKA rows (``eval_cache``)."""

    init: str
    rank: int
    guide: nn.Module
    slots: list[Slot]
    head: str
    cache: GuideCache
    eval_cache: GuideCache
    rank_suffix: str  # "-rank<R>" in a rank sweep, else ""


@dataclass
class Arm:
    """One conversion arm: a guide view, a schedule and an alignment metric with its loss."""

    view: GuideView
    schedule: str
    metric: str
    loss: Callable[[Tensor, Tensor], Tensor]

    @property
    def labels(self) -> dict[str, Any]:
        """The columns that name this arm in every table."""
        return {"schedule": self.schedule, "metric": self.metric, "guide_init": self.view.init,
                "rank": self.view.rank}

    @property
    def prefix(self) -> str:
        """The checkpoint-name prefix of this arm's training calls."""
        return f"{self.view.init}-{self.schedule}-{self.metric}{self.view.rank_suffix}"


@dataclass
class Finetuned:
    """The converted arm's labelled training: head and fine-tuning steps, the probe score, the
    fine-tuning's best validation step, whether it was still improving, its validation score and why it
    stopped (:meth:`~simkit.conversion.context.Budget.stop`)."""

    head_steps: int
    probe: float
    steps: int
    best_step: int
    still_improving: bool
    val_score: float | None
    stopped: str = "fixed"


@dataclass
class ArmOutcome:
    """A converted model, the optimizer steps and seconds of its alignment, and its labelled training."""

    model: nn.Module
    align_steps: int
    align_seconds: float
    tuned: Finetuned

    @property
    def probe(self) -> float:
        """The linear-probe score (the head trained alone on the aligned features)."""
        return self.tuned.probe

    @property
    def head_steps(self) -> int:
        return self.tuned.head_steps

    @property
    def finetune_steps(self) -> int:
        return self.tuned.steps

    @property
    def steps(self) -> int:
        """All optimizer steps of the arm: alignment, head, fine-tuning."""
        return self.align_steps + self.head_steps + self.finetune_steps


@dataclass
class _Hybrid:
    """The guide copy an arm converts in place, its fresh target modules and which slots are installed."""

    model: nn.Module
    modules: list[nn.Module]
    installed: set[int]


def convert_arm(ctx: RunContext, arm: Arm, rows: Rows) -> ArmOutcome:
    """Align, recalibrate, head-first, fine-tune one (guide, schedule, metric, rank) arm.

    Adds to ``rows``: the per-layer rows after each stage (linear CKA ``value`` and the arm's own
    alignment ``loss`` on held-out data, plus why the stage stopped) to ``stages``, one row per stage to
    ``stage_summary``, and the loss curves. Returns the converted model, its probe score and step counts."""
    hybrid = _Hybrid(copy.deepcopy(arm.view.guide), fresh_modules(arm.view.slots), set())
    align_steps, align_seconds = _align(ctx, arm, hybrid, rows)
    if arm.schedule == "independent":
        _assemble_independent(ctx, arm, hybrid, rows)
    return ArmOutcome(hybrid.model, align_steps, align_seconds, _finetune(ctx, arm, hybrid, rows))


def _align(ctx: RunContext, arm: Arm, hybrid: _Hybrid, rows: Rows) -> tuple[int, float]:
    """Every alignment stage of the arm's schedule in turn; returns (optimizer steps, seconds)."""
    settings = ctx.settings
    stop_loss = settings.effective_stop_loss
    align_steps, align_seconds = 0, 0.0
    for stage in plan_stages(arm.schedule, len(arm.view.slots), settings.stage_steps):
        fit_stage = ctx.fit(f"{arm.prefix}-{stage.name}", steps=stage.steps, batch_size=settings.batch_size,
                            lr=settings.lr, plateau_window=settings.plateau_window,
                            plateau_factor=settings.plateau_factor, stop_loss=stop_loss)
        start = time.perf_counter()
        outcome = run_stage(hybrid.model, arm.view.slots, hybrid.modules, stage, arm.view.cache,
                            ctx.data.align_x, arm.loss, fit_stage)
        align_seconds += time.perf_counter() - start
        hybrid.installed.update(stage.install)
        layer_rows, hybrid_score = _score_stage(ctx, arm, hybrid, stage)
        hist = outcome.history
        align_steps += hist.steps
        info = {"steps": hist.steps, "stopped": hist.stopped,
                "rule": _stop_rule(hist.stopped, stop_loss, settings, stage.steps),
                "final_loss": hist.losses[-1] if hist.losses else float("nan")}
        labels = arm.labels
        rows.stages.extend({**labels, "stage": stage.name, **r, **info} for r in layer_rows)
        rows.stage_summary.append({
            **labels, "stage": stage.name, **info, "max_steps": stage.steps, "stop_loss": stop_loss,
            "final_lr": hist.lrs[-1] if hist.lrs else float("nan"), f"hybrid_{rows.s}": hybrid_score,
            "trainable": ";".join(outcome.trainable), "changed": ";".join(outcome.changed),
            "seconds": round(time.perf_counter() - start, 3)})
        rows.add_curve(stage.name, hist, labels)
    return align_steps, align_seconds


def _score_stage(ctx: RunContext, arm: Arm, hybrid: _Hybrid,
                 stage: Stage) -> tuple[list[dict[str, Any]], float]:
    """The per-layer CKA rows after a stage and the hybrid's task score (NaN for an isolated stage,
    which scores only its own module on the guide's inputs)."""
    view, batch_size = arm.view, ctx.settings.batch_size
    if stage.isolated:
        (j,) = stage.train
        if view.eval_cache.inputs is None:
            raise SimkitError("internal: the independent schedule needs the guide inputs cache")
        value = isolated_output(view.slots[j], hybrid.modules[j], view.eval_cache.inputs[j], batch_size)
        layer_rows = _cka_rows([value], view.eval_cache.outputs, view.slots, {j}, only=[j], loss=arm.loss)
        return layer_rows, float("nan")
    recalibrate(hybrid.model, ctx.data.align_x, batch_size)
    layer_rows = _layer_rows(ctx, arm, hybrid)
    # the hybrid as it stands (guide modules downstream, the guide's head): its task score
    test_x, test_t = ctx.data.test
    return layer_rows, score(hybrid.model, ctx.task, test_x, test_t, EVAL_BATCH)


def _layer_rows(ctx: RunContext, arm: Arm, hybrid: _Hybrid) -> list[dict[str, Any]]:
    """CKA rows of every slot of the hybrid as it stands, on the held-out CKA inputs."""
    view = arm.view
    return _cka_rows(hybrid_outputs(hybrid.model, view.slots, ctx.data.eval_x, ctx.settings.batch_size),
                     view.eval_cache.outputs, view.slots, hybrid.installed, loss=arm.loss)


def _assemble_independent(ctx: RunContext, arm: Arm, hybrid: _Hybrid, rows: Rows) -> None:
    """The independent schedule's modules, trained in isolation, installed together and recalibrated."""
    for j, slot in enumerate(arm.view.slots):
        install(hybrid.model, slot, hybrid.modules[j])
    recalibrate(hybrid.model, ctx.data.align_x, ctx.settings.batch_size)
    hybrid.installed = set(range(len(arm.view.slots)))
    rows.stages.extend({**arm.labels, "stage": "assembled", **r} for r in _layer_rows(ctx, arm, hybrid))


def _finetune(ctx: RunContext, arm: Arm, hybrid: _Hybrid, rows: Rows) -> Finetuned:
    """Head first (linear probe), then everything: under the plateau rule until no longer still improving
    (at least ``floor_epochs`` labelled epochs with the head's, at most ``cap_epochs``), otherwise for
    ``effective_finetune_epochs`` (as many labelled epochs as the baselines when they are longer); the
    weights of the best validation epoch kept, as for the baselines; BatchNorm was recalibrated after the
    last stage."""
    settings, labels = ctx.settings, arm.labels
    fit_head = ctx.fit(f"{arm.prefix}-head", epochs=settings.effective_head_epochs, **ctx.ft)
    head_hist, probe = train_head(hybrid.model, arm.view.head, ctx.task, ctx.data.train, ctx.data.test,
                                  fit_head, batch_size=EVAL_BATCH, seed=derive_seed(ctx.seed, "head"))
    rows.add_curve("head", head_hist, labels)
    budget = ctx.budget(max(0, ctx.steps_of(settings.floor_epochs) - head_hist.steps), spent=head_hist.steps)
    mon = ctx.monitor(hybrid.model, budget)
    config = ctx.training(budget) if settings.plateau_budget else \
        {**ctx.ft, "epochs": settings.effective_finetune_epochs}  # the earlier rules, as they were
    hist = train_task(hybrid.model, ctx.task, ctx.data.train, ctx.fit(f"{arm.prefix}-finetune", **config),
                      monitor=mon)
    rows.add_curve("finetune", hist, labels)
    rows.add_validation("finetune", mon, labels)
    rows.stages.extend({**labels, "stage": "finetuned", **r} for r in _layer_rows(ctx, arm, hybrid))
    best_step, improving = ctx.still_improving(mon, hist.steps)
    return Finetuned(head_hist.steps, probe, hist.steps, best_step, improving,
                     mon.best if mon is not None else None, budget.stop(hist.stopped))


def _stop_rule(stopped: str, stop_loss: float | None, settings: ConvertSettings, steps: int) -> str:
    """Why a stage ended, in words: the loss threshold, the step cap or the fixed step count (``steps``:
    the stage's budget; joint: the per-stage budget times the number of modules)."""
    if stopped == "stop_loss":
        return f"loss EMA < {stop_loss:g}"
    if stopped == "min_lr":
        return "learning rate below its floor"
    if settings.auto_stages:
        return f"step cap {steps}"
    return f"fixed {steps} steps"
