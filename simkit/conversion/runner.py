"""``convert``: Network of Theseus (spec §1) from a guide module and a dataset to a :class:`ConvertResult`.

Flow: validate everything (settings, the data against the guide, the plan by a dry run per rank) →
start the run directory → carve the validation split from the training split (seeded; every arm
trains on the rest; the test split chooses nothing) → (optionally train the guide, keeping its best
validation epoch) → per guide init (trained/random) and rank: cache the frozen guide's activations once
→ per (schedule, metric): align stage by stage through the shared training loop (automatic stages: loss
EMA below a threshold or a step cap, plateau LR halving; or a fixed step count), recalibrate BatchNorm
and score the hybrid after every stage, train the head alone (linear probe), fine-tune everything →
logit distillation from that guide init, then the target from scratch: each with the fine-tuning recipe
for at least the longest conversion arm's optimizer steps, its best validation epoch kept → tables and a
converted-vs-guide CKA matrix (the engine's compare).

Every training call has a unique checkpoint name (``guide``, ``<init>-<schedule>-<metric>[-rank<R>]-stageK``,
``...-head``, ``...-finetune``, ``scratch``, ``kd-<init>``), so ``resume=True`` restores finished
stages without training and continues an interrupted one bit-identically (the baselines' validation
monitors included).

Phases (each its own function, passing the objects of :mod:`simkit.conversion.context`): prepare
(:func:`_check_arguments`, :func:`_prepare`: validate, split, plan) → :func:`_guide_phase` →
:func:`_arms_phase` (per guide init its arms through :func:`simkit.conversion.arm.convert_arm`, then its
distillation baseline) → :func:`_scratch_baseline` → :func:`_assemble` (tables, summary, extra, meta).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import Tensor, nn

from simkit.conversion.arm import Arm, GuideView, convert_arm, recalibrate
from simkit.conversion.context import EVAL_BATCH, Fitter, Rows, RunContext, Splits, Sweep
from simkit.conversion.finetune import distill, score, train_task
from simkit.conversion.modules import fresh_copy, reinitialise
from simkit.conversion.plans import ReplacementPlan, Slot, build_target, resolve_plan
from simkit.conversion.recipes import RECIPES, block_count, find_blocks, make_plan
from simkit.conversion.schedules import GuideCache, guide_cache
from simkit.conversion.settings import ConvertSettings
from simkit.conversion.task import Inputs, Task, rows, run_model, take
from simkit.data import Dataset, check_finite
from simkit.engine import compare
from simkit.errors import SimkitError, unknown_name_error
from simkit.forward import check_accepts, resolve_device, to_device
from simkit.provenance import Timer, run_meta
from simkit.results import ConvertResult
from simkit.rundir import RunDir, fingerprint, open_run_dir
from simkit.seeding import derive_seed
from simkit.training import TrainHistory, ValidationMonitor
from simkit.training.denormals import flush_denormals

PlanEntry = tuple[ReplacementPlan, list[Slot], str]  # (plan, its resolved slots, head) of one rank


@flush_denormals()  # denormals made prototype runs up to 10x slower on CPU; restored on return
def convert(guide: nn.Module, data: Dataset, settings: ConvertSettings | None = None, *,
            plan: ReplacementPlan | dict[Any, Any] | None = None, run_dir: RunDir | str | Path | None = None,
            resume: bool = False, device: str | torch.device = "cpu", progress: bool = True,
            checkpoint_every: int = 0, guide_name: str | None = None,
            data_name: str | None = None) -> ConvertResult:
    """Convert ``guide`` into the target architecture of ``settings.recipe`` (or ``plan``) on ``data``.

    guide: the guide network (moved to ``device``, where it stays; trained in place when
    ``settings.train_guide`` > 0). data: a ``simkit.data.Dataset``, labelled for classification or
    token ids (n, T) for a causal LM; its first ``settings.n`` samples are used, then split (a native
    test split is kept whole, otherwise the seeded 80/20 split of those n samples).
    settings: a :class:`ConvertSettings` (default: the CLI defaults).
    plan: a ReplacementPlan (or a dict {guide name(s): factory}) replacing the recipe; a plan file is
    loaded with ``simkit.conversion.load_plan_file(text, guide)`` and its text kept in ``settings.plan``.
    run_dir: where checkpoints and inputs.json go (needed for resume): a path, checked against these
    inputs (a resume with other settings, guide, data or plan is refused), or a ``RunDir``.
    device: ``cpu``, ``cuda`` or ``cuda:N``: the guide, every target module, the data and all losses.
    checkpoint_every: steps between checkpoints inside a phase (0: at its end only).
    guide_name / data_name: recorded in ``meta`` (the CLI passes the spec strings).
    Everything is validated before the run directory is started, so a run that fails its checks
    leaves an earlier run in ``run_dir`` as it was. Returns a ConvertResult.
    """
    timer = Timer()
    settings = (settings if settings is not None else ConvertSettings()).validate()  # once per run
    sweep = _check_arguments(guide, data, settings, plan)
    device = resolve_device(device)
    inputs = _run_inputs(guide, data, settings, run_dir)
    prep = _prepare(guide, data, settings, plan, sweep.ranks, device, timer)
    if inputs and plan is not None:  # a plan object: what it builds is part of the inputs
        inputs["plan_targets"] = fingerprint([[list(sl.names), sl.align, fingerprint(sl.target)]
                                              for sl in prep.slots])

    # validated: from here on the run directory is this run's
    opened = open_run_dir(run_dir, "convert", inputs, resume=resume)
    if opened is not None:
        opened.start()
    fitter = Fitter(opened.path if opened else None, opened.resume if opened else False, settings.seed,
                    progress, checkpoint_every)
    ctx = RunContext(settings, sweep, prep.task, prep.splits, fitter, timer, device)
    rows_, outcome = Rows(prep.task.score), _Outcome()
    _guide_phase(ctx, guide, rows_, outcome)
    _arms_phase(ctx, guide, prep, rows_, outcome)
    outcome.scratch_score = _scratch_baseline(ctx, _Student(guide, prep.slots), rows_)
    names = (guide_name or type(guide).__name__, data_name or prep.data.spec)
    return _assemble(ctx, prep, rows_, outcome, names)


# ------------------------------------------------------------------------------------------- prepare

@dataclass
class _Prepared:
    """The validated inputs of a run: the data as used (capped), its task and device tensors, the plan of
    every rank and the recipe as recorded (``plan:<file>`` for a plan)."""

    data: Dataset
    task: Task
    splits: Splits
    plans: dict[int, PlanEntry]
    recipe: str | None

    @property
    def first(self) -> PlanEntry:
        """The plan of the first rank (the baselines' architecture, the slots of the tables)."""
        return next(iter(self.plans.values()))

    @property
    def slots(self) -> list[Slot]:
        """The first rank's resolved slots."""
        return self.first[1]


def _check_arguments(guide: nn.Module, data: Dataset, settings: ConvertSettings,
                     plan: ReplacementPlan | dict[Any, Any] | None) -> Sweep:
    """The argument types and the plan/recipe choice checked (``settings``: validated); returns the arms."""
    if not isinstance(guide, nn.Module):
        raise SimkitError(f"`guide` must be a torch.nn.Module, got {type(guide).__name__}; load a spec with "
                          "simkit.models.load_model")
    if not isinstance(data, Dataset):
        raise SimkitError(f"`data` must be a simkit.data.Dataset, got {type(data).__name__}; load a spec with "
                          "simkit.data.load_data")
    if plan is None and settings.plan:
        raise SimkitError(f"`plan` {settings.plan!r} is only the record of a plan file; pass the plan itself "
                          "(simkit.conversion.load_plan_file(text, guide)) as `plan`")
    if plan is None and settings.recipe is None:
        raise unknown_name_error("recipe", "None", RECIPES, "or pass a `plan`")
    sweep = Sweep.of(settings)
    if plan is not None and sweep.sweeps_ranks:
        raise SimkitError(f"a rank sweep (`rank` {sweep.ranks}) needs a recipe; a plan fixes its own target "
                          "modules")
    sweep.resolve_losses()
    return sweep


def _run_inputs(guide: nn.Module, data: Dataset, settings: ConvertSettings,
                run_dir: RunDir | str | Path | None) -> dict[str, Any]:
    """What a Python caller's run directory is tied to (the CLI passes a RunDir made from spec strings)."""
    if run_dir is not None and not isinstance(run_dir, RunDir):
        return {**settings.to_dict(), "guide": fingerprint(guide), "data": fingerprint(data)}
    return {}


def _prepare(guide: nn.Module, data: Dataset, settings: ConvertSettings,
             plan: ReplacementPlan | dict[Any, Any] | None, ranks: list[int], device: torch.device,
             timer: Timer) -> _Prepared:
    """The guide moved to ``device``; the data capped, split (train − validation, test) and moved; the
    plan of every rank resolved by a dry run of the guide."""
    seed = settings.seed
    with timer("load"):
        guide.to(device)
        data = data.cap(settings.n)  # `n` means the same for every Dataset: cap, then split
        check_finite(data)
        train_all, test = data.train_test(seed=seed)
        train, val = split_validation(train_all, settings.val_fraction, seed)
        task = Task.infer(train.inputs, train.labels)
        splits = _splits(task, (train, test, val), settings.eval_samples, device)
    with timer("plan"):
        plans = _resolve_plans(guide, plan, settings, ranks, splits.train[0])
    recipe = settings.recipe if plan is None else f"plan:{settings.plan or 'object'}"
    return _Prepared(data, task, splits, plans, recipe)


def _splits(task: Task, parts: tuple[Dataset, Dataset, Dataset | None], eval_samples: int,
            device: torch.device) -> Splits:
    """The (train, test, validation) datasets as input and target tensors on ``device``, plus the first
    ``eval_samples`` test inputs for the CKA tables."""
    train, test, val = parts
    train_x, test_x = to_device(train.inputs, device), to_device(test.inputs, device)
    train_t = task.targets(train_x, train.labels).to(device)
    test_t = task.targets(test_x, test.labels).to(device)
    val_xt: tuple[Inputs, Tensor] | None = None
    if val is not None:
        val_x = to_device(val.inputs, device)
        val_xt = (val_x, task.targets(val_x, val.labels).to(device))
    eval_x = take(test_x, slice(0, min(eval_samples, rows(test_x))))
    if rows(train_x) < 4 or rows(eval_x) < 4:
        raise SimkitError(f"conversion needs at least 4 training and 4 test samples, got "
                          f"{rows(train_x)} and {rows(eval_x)}; raise `n`")
    return Splits((train_x, train_t), (test_x, test_t), val_xt, eval_x)


def _resolve_plans(guide: nn.Module, plan: ReplacementPlan | dict[Any, Any] | None, settings: ConvertSettings,
                   ranks: list[int], train_x: Inputs) -> dict[int, PlanEntry]:
    """Per rank: the plan (``plan`` itself, or the recipe's at that rank), its slots and head."""
    sample = take(train_x, slice(0, min(4, rows(train_x))))
    check_accepts(guide, sample, "the guide")
    seed = settings.seed
    plans: dict[int, PlanEntry] = {}
    for rank in ranks:
        plan_obj = ReplacementPlan.coerce(plan) if plan is not None else make_plan(
            settings.recipe, guide, rank=rank, group=settings.group, cell=settings.cell, seed=seed)
        slots_r, head_r = resolve_plan(plan_obj, guide, lambda m: run_model(m, sample), seed=seed)
        plans[rank] = (plan_obj, list(slots_r), head_r)
    return plans


def split_validation(train: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset | None]:
    """(train − validation, validation): a seeded random ``fraction`` of the training split held out
    (None when ``fraction`` is 0). The test split is never touched."""
    if fraction <= 0:
        return train, None
    n_val = int(round(len(train) * fraction))
    if n_val < 1 or len(train) - n_val < 4:
        raise SimkitError(f"`val_fraction` {fraction:g} of {len(train)} training samples leaves no validation "
                          "split or too little to train on; raise `n` or set `val_fraction` to 0")
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(derive_seed(seed, "validation")))
    kept, held = train.take(order[n_val:].sort().values), train.take(order[:n_val].sort().values)
    kept.test = held.test = None
    return kept, held


# ----------------------------------------------------------------------------------- guide and arms

@dataclass
class _Outcome:
    """What the phases leave for the result: the guide's training, the first arm's converted model and
    its guide (``primary``, for the layer CKA table), the last guide cache, the scratch score."""

    guide_steps: int = 0
    guide_stopped: str = ""
    guide_val: float | None = None
    primary: tuple[nn.Module, nn.Module] | None = None
    cache: GuideCache | None = None
    scratch_score: float | None = None


def _guide_phase(ctx: RunContext, guide: nn.Module, rows_: Rows, outcome: _Outcome) -> None:
    """Optionally train the guide (its best validation epoch kept), then freeze it and score it on the
    validation split."""
    settings, task = ctx.settings, ctx.task
    if settings.train_guide:
        with ctx.timer("guide"):
            mon = ctx.monitor(guide)
            fit_guide = ctx.fit("guide", epochs=settings.train_guide,
                                **{**ctx.ft, "lr": settings.effective_guide_lr})
            hist = train_task(guide, task, ctx.data.train, fit_guide, monitor=mon)
            outcome.guide_steps, outcome.guide_stopped = hist.steps, hist.stopped
            rows_.add_validation("guide", mon, {"schedule": "", "metric": "", "guide_init": "trained",
                                                "rank": ctx.sweep.ranks[0]})
    guide.eval()
    for p in guide.parameters():
        p.requires_grad_(False)
    if ctx.data.val is not None:
        outcome.guide_val = score(guide, task, ctx.data.val[0], ctx.data.val[1], EVAL_BATCH)


def _arms_phase(ctx: RunContext, guide: nn.Module, prep: _Prepared, rows_: Rows, outcome: _Outcome) -> None:
    """Per guide init: every (rank, schedule, metric) arm, then its logit-distillation baseline."""
    for gi in ctx.sweep.guide_inits:
        g = guide if gi == "trained" else _random_guide(guide, ctx.seed, ctx.data.train[0],
                                                        ctx.settings.batch_size)
        first_of_init = len(rows_.runs)
        logits = _guide_init_arms(ctx, g, gi, prep.plans, rows_, outcome)
        if "kd" in ctx.sweep.baselines:
            _kd_baseline(ctx, _Student(guide, prep.slots, gi, logits), rows_, rows_.runs[first_of_init:])


def _guide_init_arms(ctx: RunContext, g: nn.Module, gi: str, plans: dict[int, PlanEntry], rows_: Rows,
                     outcome: _Outcome) -> Tensor | None:
    """The arms of one guide init ``gi`` (guide ``g``), rank by rank; returns the guide's logits on the
    training inputs (first rank; None unless distillation needs them)."""
    test_x, test_t = ctx.data.test
    guide_score = score(g, ctx.task, test_x, test_t, EVAL_BATCH)
    ranks = ctx.sweep.ranks
    logits: Tensor | None = None
    for rank in ranks:
        view = _guide_view(ctx, g, gi, rank, plans[rank])
        outcome.cache = view.cache
        if rank == ranks[0]:
            logits = view.cache.logits
        for schedule, metric in itertools.product(ctx.sweep.schedules, ctx.sweep.metrics):
            _run_arm(ctx, Arm(view, schedule, metric, ctx.sweep.losses[metric]), guide_score, rows_, outcome)
    return logits


def _guide_view(ctx: RunContext, g: nn.Module, gi: str, rank: int, plan: PlanEntry) -> GuideView:
    """The frozen guide's activations cached once per (guide init, rank), on the training inputs and on
    the CKA rows (the guide's inputs too for the independent schedule, its logits for distillation)."""
    _, slots, head = plan
    sweep, batch_size = ctx.sweep, ctx.settings.batch_size
    suffix = f"-rank{rank}" if sweep.sweeps_ranks else ""
    with ctx.timer(f"cache-{gi}" + suffix):
        independent = "independent" in sweep.schedules
        cache = guide_cache(g, slots, ctx.data.train[0], batch_size, want_inputs=independent,
                            want_logits="kd" in sweep.baselines and rank == sweep.ranks[0])
        eval_cache = guide_cache(g, slots, ctx.data.eval_x, batch_size, want_inputs=independent)
    return GuideView(gi, rank, g, slots, head, cache, eval_cache, suffix)


def _run_arm(ctx: RunContext, arm: Arm, guide_score: float, rows_: Rows, outcome: _Outcome) -> None:
    """One arm converted and scored on the test split: its ``runs`` row (baseline columns empty until the
    baselines fill them); the first arm's model is kept as ``outcome.primary``."""
    start = time.perf_counter()
    arm_out = convert_arm(ctx, arm, rows_)
    test_x, test_t = ctx.data.test
    converted_score = score(arm_out.model, ctx.task, test_x, test_t, EVAL_BATCH)
    s = rows_.s
    rows_.runs.append({**arm.labels, f"guide_{s}": guide_score, f"probe_{s}": arm_out.probe,
                       f"converted_{s}": converted_score, f"scratch_{s}": None, f"kd_{s}": None,
                       "gain_over_scratch": None, "align_steps": arm_out.align_steps,
                       "head_steps": arm_out.head_steps, "finetune_steps": arm_out.finetune_steps,
                       "steps": arm_out.steps, "scratch_steps": None, "kd_steps": None,
                       "align_seconds": round(arm_out.align_seconds, 2),
                       "seconds": round(time.perf_counter() - start, 2), "seed": ctx.seed})
    ctx.timer.seconds[arm.prefix] = time.perf_counter() - start
    if outcome.primary is None:
        outcome.primary = (arm_out.model, arm.view.guide)


def _random_guide(guide: nn.Module, seed: int, inputs: Inputs, batch_size: int) -> nn.Module:
    """An untrained copy of the guide (fresh init from ``seed``), BatchNorm statistics recomputed on the
    unlabeled inputs [ours: an untrained guide's default BN statistics are arbitrary]."""
    g = fresh_copy(guide, derive_seed(seed, "random guide"))
    recalibrate(g, inputs, batch_size)
    g.eval()
    for p in g.parameters():
        p.requires_grad_(False)
    return g


# ------------------------------------------------------------------------------------------- baselines

@dataclass
class _Student:
    """A baseline's student: the target architecture (``guide`` with the first rank's ``slots``), and for
    distillation the guide init ``gi`` whose ``logits`` it learns (scratch: ``gi`` empty)."""

    guide: nn.Module
    slots: list[Slot]
    gi: str = ""
    logits: Tensor | None = None


@dataclass
class _Baseline:
    """One baseline run: ``kind`` (scratch, kd), its student, the optimizer steps it trains at least
    (the longest conversion arm's) and the rank its rows are labelled with."""

    kind: str
    student: _Student
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


def _kd_baseline(ctx: RunContext, student: _Student, rows_: Rows, init_runs: list[dict[str, Any]]) -> None:
    """Logit distillation from one guide init for at least its longest arm's steps; fills its arms' rows."""
    min_steps = max(r["steps"] for r in init_runs)
    kd_score = _train_baseline(ctx, _Baseline("kd", student, min_steps, ctx.sweep.ranks[0]), rows_)
    kd_steps = rows_.baselines[-1]["steps"]
    for r in init_runs:
        r[f"kd_{rows_.s}"], r["kd_steps"] = kd_score, kd_steps


def _scratch_baseline(ctx: RunContext, student: _Student, rows_: Rows) -> float | None:
    """The target trained from scratch for at least the longest arm's steps (None when not asked for);
    fills every arm's scratch columns and its gain over scratch."""
    if "scratch" not in ctx.sweep.baselines:
        return None
    s = rows_.s
    min_steps = max(r["steps"] for r in rows_.runs)
    scratch_score = _train_baseline(ctx, _Baseline("scratch", student, min_steps, ctx.sweep.ranks[0]), rows_)
    for r in rows_.runs:
        r[f"scratch_{s}"], r["scratch_steps"] = scratch_score, rows_.baselines[-1]["steps"]
        r["gain_over_scratch"] = _gain(r[f"converted_{s}"], scratch_score, ctx.task.higher_is_better)
    return scratch_score


def _train_baseline(ctx: RunContext, base: _Baseline, rows_: Rows) -> float:
    """Scratch or distillation with a fair budget: the fine-tuning recipe (AdamW, cosine decay) for
    max(``min_steps`` — the longest conversion arm —, ``baseline_epochs``) optimizer steps, the
    weights of the best validation epoch kept; returns its test score."""
    settings, student, name = ctx.settings, base.student, base.name
    with ctx.timer(name):
        model = reinitialise(build_target(student.guide, student.slots), derive_seed(ctx.seed, base.kind))
        epochs = min(settings.baseline_epochs, settings.baseline_max_epochs)
        steps = max(base.min_steps, int(math.ceil(epochs * ctx.per_epoch)))
        mon = ctx.monitor(model)
        fit_b = ctx.fit(name, steps=steps, **ctx.ft)
        if base.kind == "scratch":
            hist = train_task(model, ctx.task, ctx.data.train, fit_b, monitor=mon)
        else:
            if student.logits is None:
                raise SimkitError("internal: logit distillation needs the guide's logits cache")
            hist = distill(model, ctx.task, ctx.data.train[0], student.logits, fit_b, settings.kd_temperature,
                           monitor=mon)
        test_score = score(model, ctx.task, ctx.data.test[0], ctx.data.test[1], EVAL_BATCH)
    rows_.add_curve(name, hist, base.labels)
    rows_.add_validation(name, mon, base.labels)
    rows_.baselines.append(_baseline_row(ctx, base, hist, mon, test_score))
    return test_score


def _baseline_row(ctx: RunContext, base: _Baseline, hist: TrainHistory, mon: ValidationMonitor | None,
                  test_score: float) -> dict[str, Any]:
    """The ``baselines`` row of one baseline run: its steps, why it stopped, its best validation epoch
    and whether it was still improving, its validation and test scores."""
    best_step = mon.best_step if mon is not None else hist.steps
    # still improving: the best validation epoch lies within the last `baseline_patience` epochs
    improving = mon is not None and best_step > hist.steps - ctx.settings.baseline_patience * ctx.per_epoch
    s = ctx.task.score
    return {"baseline": base.kind, "guide_init": base.labels["guide_init"], "steps": hist.steps,
            "min_steps": base.min_steps, "stopped": hist.stopped, "best_step": best_step,
            "still_improving": improving, f"val_{s}": mon.best if mon is not None else None,
            f"test_{s}": test_score, "seconds": round(ctx.timer.seconds.get(base.name, 0.0), 2)}


def _gain(converted: float, scratch: float | None, higher_is_better: bool) -> float | None:
    """Improvement of the converted score over scratch, in the score's own direction."""
    if scratch is None:
        return None
    return converted - scratch if higher_is_better else scratch - converted


# -------------------------------------------------------------------------------------------- assemble

def _assemble(ctx: RunContext, prep: _Prepared, rows_: Rows, outcome: _Outcome,
              names: tuple[str, str]) -> ConvertResult:
    """The result: tables (with the converted × guide layer CKA matrix), summary, extra and meta
    (``names``: the guide and data as recorded)."""
    settings = ctx.settings
    tables = rows_.tables()
    if settings.compare_layers and outcome.primary is not None:
        converted, guide = outcome.primary
        with ctx.timer("compare"):
            tables["layer_cka"] = _layer_cka(converted, guide, prep.slots, ctx.data.eval_x, settings.batch_size,
                                             ctx.seed, ctx.device)
    return ConvertResult(summary=_summary(ctx, prep, rows_, outcome), tables=tables,
                         meta=_meta(ctx, names), extra=_extra(ctx, prep, outcome))


def _summary(ctx: RunContext, prep: _Prepared, rows_: Rows, outcome: _Outcome) -> dict[str, Any]:
    """The headline numbers: the first arm's, with the baselines asked for."""
    s, baselines, first = rows_.s, ctx.sweep.baselines, rows_.runs[0]
    summary: dict[str, Any] = {f"guide_{s}": first[f"guide_{s}"], f"converted_{s}": first[f"converted_{s}"]}
    if "scratch" in baselines:
        summary[f"scratch_{s}"] = outcome.scratch_score
    if "kd" in baselines:
        summary[f"kd_{s}"] = first[f"kd_{s}"]
    summary.update({"schedule": first["schedule"], "metric": first["metric"], "recipe": prep.recipe,
                    "guide_init": first["guide_init"], f"probe_{s}": first[f"probe_{s}"],
                    "task": ctx.task.kind, "runs": len(rows_.runs), "rank": first["rank"],
                    "gain_over_scratch": first["gain_over_scratch"], f"guide_val_{s}": outcome.guide_val,
                    "guide_steps": outcome.guide_steps, "converted_steps": first["steps"],
                    "align_steps": first["align_steps"], "scratch_steps": first["scratch_steps"],
                    "kd_steps": first["kd_steps"], "val_samples": ctx.data.n_val})
    return summary


def _extra(ctx: RunContext, prep: _Prepared, outcome: _Outcome) -> dict[str, Any]:
    """The first rank's slots (shapes, target types, parameter counts), head and plan, and run facts."""
    plan_obj, slots, head = prep.first
    return {
        "slots": [{"layer": sl.label, "names": list(sl.names), "in_shape": list(sl.in_shape),
                   "out_shape": list(sl.out_shape), "target": type(sl.target).__name__, "align": sl.align,
                   "target_params": sum(p.numel() for p in sl.target.parameters()),
                   "guide_params": sum(p.numel() for m in sl.guide_modules for p in m.parameters())}
                  for sl in slots],
        "head": head, "plan": getattr(plan_obj, "description", ""), "score": ctx.task.score,
        "higher_is_better": ctx.task.higher_is_better,
        "guide_forward_batches": outcome.cache.batches if outcome.cache is not None else 0,
        "guide_stopped": outcome.guide_stopped, "ranks": ctx.sweep.ranks,
    }


def _meta(ctx: RunContext, names: tuple[str, str]) -> dict[str, Any]:
    """Run metadata: the settings with what they resolved to, the split sizes and the phase timings."""
    settings, data = ctx.settings, ctx.data
    # the settings resolved (stop_loss, stage_steps, head epochs, fine-tuning lr, eval rows, device);
    # settings_given: as given (what inputs.json records)
    recorded = {**settings.resolved(), "eval_samples": rows(data.eval_x), "device": str(ctx.device)}
    # one entry per phase: the training calls by checkpoint name, then the other phases
    timings = {**ctx.fit.seconds, **ctx.timer.seconds}
    return run_meta(guide=names[0], data=names[1], seed=ctx.seed, n=settings.n, n_train=rows(data.train[0]),
                    n_val=data.n_val, n_test=rows(data.test[0]), settings=recorded,
                    settings_given=settings.to_dict(),
                    timings={k: round(v, 3) for k, v in timings.items()})


def _layer_cka(converted: nn.Module, guide: nn.Module, slots: list[Slot], inputs: Inputs,
               batch_size: int, seed: int, device: torch.device) -> pd.DataFrame:
    """Long table (layer_converted, layer_guide, value): minibatch linear CKA through the engine's compare.

    Layers: every block of the guide's block container (when it has one) and every replaced output.
    """
    names = [sl.output_name for sl in slots]
    try:
        container = find_blocks(guide)
        names += [f"{container}.{i}" for i in range(block_count(guide, container))]
    except SimkitError:
        pass
    order = [n for n, _ in guide.named_modules()]
    names = sorted(set(names), key=order.index)
    result = compare(converted, guide, inputs, layers_a=names, layers_b=names, metrics=["linear_cka"],
                     mode="minibatch", batch_size=batch_size, null=0, seed=seed, progress=False, device=device)
    wide = result.matrix("linear_cka")
    frame = wide.stack(future_stack=True).reset_index()
    frame.columns = ["layer_converted", "layer_guide", "value"]
    return frame
