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

With ``settings.seeds`` > 1 all of it (guide training, every arm, every baseline) runs once per seed
``seed``, ``seed`` + 1, ... on the one data split of ``seed``; the tables get every seed's rows (a
``seed`` column), ``aggregate`` the mean, std and 95 % t interval per arm, and the summary the
converted − scratch difference paired by seed (:mod:`simkit.conversion.summary`).

Every training call has a unique checkpoint name (``guide``, ``<init>-<schedule>-<metric>[-rank<R>]-stageK``,
``...-head``, ``...-finetune``, ``scratch``, ``kd-<init>``; ``_s<seed>`` appended when several seeds
run), so ``resume=True`` restores finished stages without training and continues an interrupted one
bit-identically (the validation monitors included).

Phases (each its own function, passing the objects of :mod:`simkit.conversion.context`): prepare
(:func:`_check_arguments`, :func:`_prepare`: validate, split, plan) → per seed (:func:`_run_seed`):
:func:`_guide_phase` → :func:`_arms_phase` (per guide init its arms through
:func:`simkit.conversion.arm.convert_arm`, then its distillation baseline) → the scratch baseline
(:mod:`simkit.conversion.baselines`) → :func:`_assemble` (tables over seeds, summary, extra, meta).
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from simkit.conversion.arm import Arm, GuideView, convert_arm, recalibrate
from simkit.conversion.baselines import Student, kd_baseline, scratch_baseline
from simkit.conversion.context import EVAL_BATCH, Budget, Fitter, Rows, RunContext, Splits, Sweep
from simkit.conversion.finetune import score, train_task
from simkit.conversion.modules import fresh_copy
from simkit.conversion.plans import ReplacementPlan, Slot, resolve_plan
from simkit.conversion.recipes import block_count, find_blocks, make_plan
from simkit.conversion.schedules import GuideCache, guide_cache, plan_stages
from simkit.conversion.summary import aggregate, combine, headline
from simkit.conversion.task import Inputs, Task, rows, run_model, take
from simkit.data import Dataset, check_finite
from simkit.engine import compare
from simkit.errors import SimkitError, unknown_name_error
from simkit.forward import ModelSource, build_model, check_accepts, resolve_device, to_device
from simkit.progress import overall_progress, phase, seed_position
from simkit.provenance import Timer, run_meta, weights_words
from simkit.results import ConvertResult
from simkit.rundir import RunDir, fingerprint, open_run_dir
from simkit.seeding import derive_seed
from simkit.settings.convert import RECIPES, ConvertSettings
from simkit.training.denormals import flush_denormals

PlanEntry = tuple[ReplacementPlan, list[Slot], str]  # (plan, its resolved slots, head) of one rank


@flush_denormals()  # denormals made prototype runs up to 10x slower on CPU; restored on return
def convert(guide: ModelSource, data: Dataset, settings: ConvertSettings | None = None, *,
            plan: ReplacementPlan | dict[Any, Any] | None = None, run_dir: RunDir | str | Path | None = None,
            resume: bool = False, device: str | torch.device = "cpu", progress: bool = True,
            checkpoint_every: int = 0, guide_name: str | None = None,
            data_name: str | None = None, align_data: Dataset | None = None) -> ConvertResult:
    """Convert ``guide`` into the target architecture of ``settings.recipe`` (or ``plan``) on ``data``.

    guide: the guide network (moved to ``device``, where it stays; trained in place when
    ``settings.train_guide`` > 0), or a factory ``guide(seed) -> nn.Module`` called once per seed of
    ``settings.seed_list()`` (the CLI passes one: each seed its own initialisation). A module with
    several seeds and ``train_guide`` > 0: copies taken before any training are trained for the other
    seeds (the same initial weights; only batch order differs); without training every seed uses it.
    data: a ``simkit.data.Dataset``, labelled for classification or
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
    align_data: a second Dataset whose inputs (never its labels) are added to the alignment inputs
    (``settings.align_data`` records its spec).
    Everything is validated before the run directory is started, so a run that fails its checks
    leaves an earlier run in ``run_dir`` as it was. Returns a ConvertResult.
    """
    timer = Timer()
    settings = (settings if settings is not None else ConvertSettings()).validate()  # once per run
    first = build_model(guide, settings.seed, "guide")
    sweep = _check_arguments(first, data, settings, plan, align_data)
    device = resolve_device(device)
    guide_of, seed_models = _seed_guides(guide, first, settings)  # before any training
    inputs = _run_inputs(first, data, settings, run_dir, align_data)
    prep = _prepare(first, data, settings, plan, sweep.ranks, device, timer, align_data)
    if inputs and plan is not None:  # a plan object: what it builds is part of the inputs
        inputs["plan_targets"] = fingerprint([[list(sl.names), sl.align, fingerprint(sl.target)]
                                              for sl in prep.slots])

    # validated: from here on the run directory is this run's
    opened = open_run_dir(run_dir, "convert", inputs, resume=resume)
    if opened is not None:
        opened.start()
    checkpoints = _Checkpoints(opened.path if opened else None, opened.resume if opened else False, progress,
                               checkpoint_every)
    with overall_progress(_phase_count(settings, sweep), enabled=progress):   # "stage 2 of 3 · arm 1 of 3"
        seeds = [_run_seed(prep, guide_of(i, seed), plan, seed, checkpoints, sweep, timer, device)
                 for i, seed in enumerate(settings.seed_list())]
    names = (guide_name or type(first).__name__, data_name or prep.data.spec)
    return _assemble(prep, seeds, names, seed_models, _weights(first, settings, seed_models))


@dataclass(frozen=True)
class _Checkpoints:
    """Where and how every seed's training calls checkpoint: the run directory, resume, progress bars."""

    path: Path | None
    resume: bool
    progress: bool
    every: int


@dataclass
class _SeedRun:
    """One seed's run: its context, the plan of every rank, its rows and what its phases left."""

    ctx: RunContext
    plans: dict[int, PlanEntry]
    rows: Rows
    outcome: _Outcome = field(default_factory=lambda: _Outcome())


def _weights(first: nn.Module, settings: ConvertSettings, seed_models: str) -> dict[str, str]:
    """``meta.weights``: the guide's weights in words (and the training this run gave it); the new blocks
    of the converted network and of the baselines start from a random init seeded by the run's seed."""
    seeds = settings.seeds if seed_models.startswith("built") else 1
    return {"guide": weights_words(first, settings.train_guide, seeds),
            "converted network and baselines": "random init of the new blocks (seeded by each run's seed)"}


def _seed_guides(guide: ModelSource, first: nn.Module,
                 settings: ConvertSettings) -> tuple[Callable[[int, int], nn.Module], str]:
    """(the guide of the i-th seed, how the seeds' guides differ), decided before any training."""
    if not isinstance(guide, nn.Module):
        return (lambda i, seed: first if i == 0 else build_model(guide, seed, "guide")), "built for each seed"
    if settings.train_guide > 0 and settings.seeds > 1:
        copies = [copy.deepcopy(first) for _ in range(settings.seeds - 1)]
        return (lambda i, seed: first if i == 0 else copies[i - 1]), \
            "copies of the given guide (same initial weights), trained for each seed"
    return (lambda i, seed: first), "the given guide"


def _run_seed(prep: _Prepared, guide: nn.Module, plan: ReplacementPlan | dict[Any, Any] | None, seed: int,
              checkpoints: _Checkpoints, sweep: Sweep, timer: Timer, device: torch.device) -> _SeedRun:
    """Every phase of one seed: the guide (trained when asked), every arm, every baseline."""
    settings = prep.settings
    suffix = f"_s{seed}" if settings.seeds > 1 else ""
    guide.to(device)
    plans = prep.plans if seed == settings.seed else _resolve_plans(guide, plan, settings, sweep.ranks,
                                                                     prep.splits.train[0], seed)
    fitter = Fitter(checkpoints.path, checkpoints.resume, seed, checkpoints.progress, checkpoints.every, suffix)
    run = _SeedRun(RunContext(settings, sweep, prep.task, prep.splits, fitter, timer, device, seed), plans,
                   Rows(prep.task.score))
    _guide_phase(run.ctx, guide, run.rows, run.outcome)
    _arms_phase(run.ctx, guide, plans, run.rows, run.outcome)
    _baseline_phase(run.ctx, "scratch")
    run.outcome.scratch_score = scratch_baseline(run.ctx, Student(guide, _first(plans)[1]), run.rows)
    return run


# ------------------------------------------------------------------------------------------- prepare

@dataclass
class _Prepared:
    """The validated inputs of a run: the data as used (capped), its task and device tensors, the plan of
    every rank and the recipe as recorded (``plan:<file>`` for a plan)."""

    settings: ConvertSettings
    data: Dataset
    task: Task
    splits: Splits
    plans: dict[int, PlanEntry]
    recipe: str | None

    @property
    def first(self) -> PlanEntry:
        """The plan of the first rank (the baselines' architecture, the slots of the tables)."""
        return _first(self.plans)

    @property
    def slots(self) -> list[Slot]:
        """The first rank's resolved slots."""
        return self.first[1]


def _first(plans: dict[int, PlanEntry]) -> PlanEntry:
    """The plan of the first rank."""
    return next(iter(plans.values()))


def _check_arguments(guide: nn.Module, data: Dataset, settings: ConvertSettings,
                     plan: ReplacementPlan | dict[Any, Any] | None, align_data: Dataset | None) -> Sweep:
    """The argument types and the plan/recipe choice checked (``settings``: validated); returns the arms."""
    for name, value in (("data", data), ("align_data", align_data)):
        if not isinstance(value, Dataset) and not (name == "align_data" and value is None):
            raise SimkitError(f"`{name}` must be a simkit.data.Dataset, got {type(value).__name__}; load a spec "
                              "with simkit.data.load_data")
    if align_data is None and settings.align_data:
        raise SimkitError(f"`align_data` {settings.align_data!r} is only the record of a data spec; pass the "
                          "dataset itself (simkit.data.load_data(spec)) as `align_data`")
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
                run_dir: RunDir | str | Path | None, align_data: Dataset | None) -> dict[str, Any]:
    """What a Python caller's run directory is tied to (the CLI passes a RunDir made from spec strings)."""
    if run_dir is not None and not isinstance(run_dir, RunDir):
        extra = {"align_data_fingerprint": fingerprint(align_data)} if align_data is not None else {}
        return {**settings.to_dict(), "guide": fingerprint(guide), "data": fingerprint(data), **extra}
    return {}


def _prepare(guide: nn.Module, data: Dataset, settings: ConvertSettings,
             plan: ReplacementPlan | dict[Any, Any] | None, ranks: list[int], device: torch.device,
             timer: Timer, align_data: Dataset | None = None) -> _Prepared:
    """The guide moved to ``device``; the data capped, split (train − validation, test) and moved, the
    alignment inputs gathered; the plan of every rank resolved by a dry run of the guide."""
    seed = settings.seed
    with timer("load"):
        guide.to(device)
        data = data.cap(settings.n)  # `n` means the same for every Dataset: cap, then split
        check_finite(data)
        train_all, test = data.train_test(seed=seed)
        train, val = split_validation(train_all, settings.val_fraction, seed)
        task = Task.infer(train.inputs, train.labels, data.info.get("lm_score_from", 0))
        splits = _splits(task, (train, test, val), settings.eval_samples, device)
        splits.align_inputs = _align_inputs(splits, settings, align_data, device)
    with timer("plan"):
        plans = _resolve_plans(guide, plan, settings, ranks, splits.train[0], seed)
    recipe = settings.recipe if plan is None else f"plan:{settings.plan or 'object'}"
    return _Prepared(settings, data, task, splits, plans, recipe)


def _align_inputs(splits: Splits, settings: ConvertSettings, align_data: Dataset | None,
                  device: torch.device) -> Inputs | None:
    """The training inputs followed by the unlabeled extras: the validation inputs (``align_val``) and
    ``align_data``'s inputs (never labels); None when there are none."""
    extras: list[Inputs] = []
    if settings.align_val and splits.val is not None:
        extras.append(splits.val[0])
    if align_data is not None:
        check_finite(align_data)
        extras.append(to_device(align_data.inputs, device))
    if not extras:
        return None
    return concat_inputs([splits.train[0], *extras])


def concat_inputs(parts: list[Inputs]) -> Inputs:
    """Rows of several input batches in one: tensors (n_i, *shape) with one per-sample shape, or dicts
    of such tensors with the same keys; anything else is a SimkitError naming both shapes."""
    first = parts[0]
    if isinstance(first, dict):
        if any(not isinstance(p, dict) or set(p) != set(first) for p in parts):
            raise SimkitError(f"the alignment inputs must have the training inputs' keys {sorted(first)}; pass "
                              "`align_data` of the same kind as `data`")
        return {key: _cat([p[key] for p in parts]) for key in first}  # type: ignore[index]
    return _cat(parts)  # type: ignore[arg-type]


def _cat(parts: list[Tensor]) -> Tensor:
    """Tensors (n_i, *shape) of one per-sample shape in one (the first one's dtype); else a SimkitError."""
    first = parts[0]
    for p in parts[1:]:
        if not isinstance(p, Tensor) or tuple(p.shape[1:]) != tuple(first.shape[1:]):
            shape = tuple(p.shape[1:]) if isinstance(p, Tensor) else type(p).__name__
            raise SimkitError(f"the extra alignment inputs are {shape} per sample but the training inputs are "
                              f"{tuple(first.shape[1:])}; pass `align_data` shaped like `data`")
    return torch.cat([p.to(first.dtype) for p in parts])


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
                   ranks: list[int], train_x: Inputs, seed: int) -> dict[int, PlanEntry]:
    """Per rank: the plan (``plan`` itself, or the recipe's at that rank), its slots and head (target
    modules initialised from ``seed``)."""
    sample = take(train_x, slice(0, min(4, rows(train_x))))
    check_accepts(guide, sample, "the guide")
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
    """Optionally train the guide (its best validation epoch kept; under the plateau rule until no longer
    still improving, at most ``train_guide`` epochs), then freeze it and score it on the validation split."""
    settings, task = ctx.settings, ctx.task
    if settings.train_guide:
        phase(f"guide training{seed_position(ctx.seed, ctx.settings.seed_list())}")
        with ctx.timed("guide"):
            budget = Budget(0, ctx.steps_of(settings.train_guide), "plateau", True) \
                if settings.plateau_budget and ctx.data.val is not None else None
            mon = ctx.monitor(guide, budget)
            config = ctx.training(budget) if budget is not None else {**ctx.ft, "epochs": settings.train_guide}
            fit_guide = ctx.fit("guide", **{**config, "lr": settings.effective_guide_lr})
            hist = train_task(guide, task, ctx.data.train, fit_guide, monitor=mon)
            outcome.guide_steps, outcome.guide_stopped = hist.steps, hist.stopped
            rows_.add_validation("guide", mon, {"schedule": "", "metric": "", "guide_init": "trained",
                                                "rank": ctx.sweep.ranks[0]})
    guide.eval()
    for p in guide.parameters():
        p.requires_grad_(False)
    if ctx.data.val is not None:
        outcome.guide_val = score(guide, task, ctx.data.val[0], ctx.data.val[1], EVAL_BATCH)


def _arms_phase(ctx: RunContext, guide: nn.Module, plans: dict[int, PlanEntry], rows_: Rows,
                outcome: _Outcome) -> None:
    """Per guide init: every (rank, schedule, metric) arm, then its logit-distillation baseline."""
    for gi in ctx.sweep.guide_inits:
        g = guide if gi == "trained" else _random_guide(guide, ctx.seed, ctx.data.align_x,
                                                        ctx.settings.batch_size)
        first_of_init = len(rows_.runs)
        logits = _guide_init_arms(ctx, g, gi, plans, rows_, outcome)
        if "kd" in ctx.sweep.baselines:
            _baseline_phase(ctx, "kd", gi)
            kd_baseline(ctx, Student(guide, _first(plans)[1], gi, logits), rows_, rows_.runs[first_of_init:])


def _guide_init_arms(ctx: RunContext, g: nn.Module, gi: str, plans: dict[int, PlanEntry], rows_: Rows,
                     outcome: _Outcome) -> Tensor | None:
    """The arms of one guide init ``gi`` (guide ``g``), rank by rank; returns the guide's logits on the
    training rows (first rank; None unless distillation needs them)."""
    test_x, test_t = ctx.data.test
    guide_score = score(g, ctx.task, test_x, test_t, EVAL_BATCH)
    ranks = ctx.sweep.ranks
    logits: Tensor | None = None
    for rank in ranks:
        view = _guide_view(ctx, g, gi, rank, plans[rank])
        outcome.cache = view.cache
        if rank == ranks[0] and view.cache.logits is not None:
            logits = view.cache.logits[:rows(ctx.data.train[0])]  # the training rows come first
        for schedule, metric in itertools.product(ctx.sweep.schedules, ctx.sweep.metrics):
            _run_arm(ctx, Arm(view, schedule, metric, ctx.sweep.losses[metric]), guide_score, rows_, outcome)
    return logits


def _guide_view(ctx: RunContext, g: nn.Module, gi: str, rank: int, plan: PlanEntry) -> GuideView:
    """The frozen guide's activations cached once per (guide init, rank), on the alignment inputs and on
    the CKA rows (the guide's inputs too for the independent schedule, its logits for distillation)."""
    _, slots, head = plan
    sweep, batch_size = ctx.sweep, ctx.settings.batch_size
    suffix = f"-rank{rank}" if sweep.sweeps_ranks else ""
    with ctx.timed(f"cache-{gi}" + suffix):
        independent = "independent" in sweep.schedules
        cache = guide_cache(g, slots, ctx.data.align_x, batch_size, want_inputs=independent,
                            want_logits="kd" in sweep.baselines and rank == sweep.ranks[0])
        eval_cache = guide_cache(g, slots, ctx.data.eval_x, batch_size, want_inputs=independent)
    return GuideView(gi, rank, g, slots, head, cache, eval_cache, suffix)


def _run_arm(ctx: RunContext, arm: Arm, guide_score: float, rows_: Rows, outcome: _Outcome) -> None:
    """One arm converted and scored on the test split: its ``runs`` row (baseline columns empty until the
    baselines fill them); the first arm's model is kept as ``outcome.primary``."""
    _arm_phase(ctx, arm, len(rows_.runs) + 1)
    start = time.perf_counter()
    arm_out = convert_arm(ctx, arm, rows_)
    test_x, test_t = ctx.data.test
    converted_score = score(arm_out.model, ctx.task, test_x, test_t, EVAL_BATCH)
    s, tuned = rows_.s, arm_out.tuned
    labelled = ctx.labelled_steps(arm_out.align_steps, arm_out.head_steps, arm_out.finetune_steps)
    rows_.runs.append({**arm.labels, f"guide_{s}": guide_score, f"probe_{s}": arm_out.probe,
                       f"converted_{s}": converted_score, f"scratch_{s}": None, f"kd_{s}": None,
                       "gain_over_scratch": None, "align_steps": arm_out.align_steps,
                       "head_steps": arm_out.head_steps, "finetune_steps": arm_out.finetune_steps,
                       "steps": arm_out.steps, "labelled_steps": labelled,
                       "labelled_epochs": round(labelled / ctx.per_epoch, 3),
                       "scratch_steps": None, "scratch_labelled_epochs": None, "kd_steps": None,
                       "kd_labelled_epochs": None, "best_step": tuned.best_step,
                       "still_improving": tuned.still_improving, f"val_{s}": tuned.val_score,
                       "scratch_still_improving": None, "kd_still_improving": None, "stopped": tuned.stopped,
                       "scratch_stopped": None, "kd_stopped": None,
                       "align_seconds": round(arm_out.align_seconds, 2),
                       "seconds": round(time.perf_counter() - start, 2), "seed": ctx.seed})
    ctx.timer.seconds[arm.prefix + ctx.fit.suffix] = time.perf_counter() - start
    if outcome.primary is None:
        outcome.primary = (arm_out.model, arm.view.guide)


def _arm_count(sweep: Sweep) -> int:
    """Arms of one seed: every (guide init, rank, schedule, metric)."""
    return len(sweep.guide_inits) * len(sweep.ranks) * len(sweep.schedules) * len(sweep.metrics)


def _phase_count(settings: ConvertSettings, sweep: Sweep) -> int:
    """The overall bar's phases: per seed the guide's training (``train_guide``), every arm, each guide
    init's distillation baseline and the scratch baseline, as the phases below name them."""
    baselines = (len(sweep.guide_inits) if "kd" in sweep.baselines else 0) + ("scratch" in sweep.baselines)
    return len(settings.seed_list()) * ((settings.train_guide > 0) + _arm_count(sweep) + baselines)


def _arm_phase(ctx: RunContext, arm: Arm, number: int) -> None:
    """The overall bar's phase of the ``number``-th arm of a seed, its parts named by the training calls'
    descriptions (:func:`simkit.conversion.arm.convert_arm`): "stage 2 of 3 · arm 1 of 4", head, fine-tuning."""
    stages = plan_stages(arm.schedule, len(arm.view.slots), ctx.settings.stage_steps)
    suffix = ctx.fit.suffix
    parts = {f"{arm.prefix}-{stage.name}{suffix}": f"stage {i} of {len(stages)}" for i, stage in enumerate(stages, 1)}
    parts.update({f"{arm.prefix}-head{suffix}": "head", f"{arm.prefix}-finetune{suffix}": "fine-tuning"})
    phase(f"arm {number} of {_arm_count(ctx.sweep)}{seed_position(ctx.seed, ctx.settings.seed_list())}", parts)


def _baseline_phase(ctx: RunContext, kind: str, guide_init: str = "") -> None:
    """The overall bar's phase of a baseline that runs (``kind`` in the baselines asked for)."""
    if kind in ctx.sweep.baselines:
        of_guide = f" (guide {guide_init})" if guide_init else ""
        phase(f"{kind} baseline{of_guide}{seed_position(ctx.seed, ctx.settings.seed_list())}")


def _random_guide(guide: nn.Module, seed: int, inputs: Inputs, batch_size: int) -> nn.Module:
    """An untrained copy of the guide (fresh init from ``seed``), BatchNorm statistics recomputed on the
    unlabeled inputs [ours: an untrained guide's default BN statistics are arbitrary]."""
    g = fresh_copy(guide, derive_seed(seed, "random guide"))
    recalibrate(g, inputs, batch_size)
    g.eval()
    for p in g.parameters():
        p.requires_grad_(False)
    return g


# -------------------------------------------------------------------------------------------- assemble

def _assemble(prep: _Prepared, seeds: list[_SeedRun], names: tuple[str, str], seed_models: str,
              weights: dict[str, str]) -> ConvertResult:
    """The result: every seed's tables in one (a ``seed`` column), ``aggregate`` over seeds, the first
    seed's converted × guide layer CKA matrix, summary, extra and meta (``names``: the guide and data as
    recorded)."""
    first = seeds[0]
    ctx, settings, score_name = first.ctx, prep.settings, prep.task.score
    tables = combine([(run.ctx.seed, run.rows.tables()) for run in seeds])
    tables["aggregate"] = aggregate(tables["runs"], score_name, prep.task.higher_is_better)
    if settings.compare_layers and first.outcome.primary is not None:
        converted, guide = first.outcome.primary
        with ctx.timer("compare"):
            tables["layer_cka"] = _layer_cka(converted, guide, _first(first.plans)[1], ctx.data.eval_x,
                                             settings.batch_size, ctx.seed, ctx.device)
    return ConvertResult(summary=_summary(prep, tables["runs"], seeds), tables=tables,
                         meta={**_meta(prep, seeds, names, seed_models), "weights": weights}, extra=_extra(first, prep))


def _summary(prep: _Prepared, runs: pd.DataFrame, seeds: list[_SeedRun]) -> dict[str, Any]:
    """The headline numbers: the first arm's, over seeds (means with their intervals, converted − scratch
    paired by seed), with the baselines asked for."""
    s, first = prep.task.score, runs.iloc[0]
    summary = headline(runs, s, prep.task.higher_is_better)
    if "kd" not in prep.settings.baselines:
        summary = {k: v for k, v in summary.items() if not k.startswith("kd_")}
    guide_val = [run.outcome.guide_val for run in seeds if run.outcome.guide_val is not None]
    summary.update({"schedule": first["schedule"], "metric": first["metric"], "recipe": prep.recipe,
                    "guide_init": first["guide_init"], "task": prep.task.kind, "runs": len(seeds[0].rows.runs),
                    "rank": int(first["rank"]),
                    f"guide_val_{s}": float(np.mean(guide_val)) if guide_val else None,
                    "guide_steps": seeds[0].outcome.guide_steps, "val_samples": prep.splits.n_val,
                    "align_samples": rows(prep.splits.align_x)})
    return summary


def _extra(first: _SeedRun, prep: _Prepared) -> dict[str, Any]:
    """The first seed's first-rank slots (shapes, target types, parameter counts), head and plan, and run
    facts."""
    plan_obj, slots, head = _first(first.plans)
    outcome, ctx = first.outcome, first.ctx
    return {
        "slots": [{"layer": sl.label, "names": list(sl.names), "in_shape": list(sl.in_shape),
                   "out_shape": list(sl.out_shape), "target": type(sl.target).__name__, "align": sl.align,
                   "skip_tokens": sl.skip_tokens, "target_params": sum(p.numel() for p in sl.target.parameters()),
                   "guide_params": sum(p.numel() for m in sl.guide_modules for p in m.parameters())}
                  for sl in slots],
        "head": head, "plan": getattr(plan_obj, "description", ""), "score": prep.task.score,
        "higher_is_better": prep.task.higher_is_better,
        "guide_forward_batches": outcome.cache.batches if outcome.cache is not None else 0,
        "guide_stopped": outcome.guide_stopped, "ranks": ctx.sweep.ranks,
    }


def _meta(prep: _Prepared, seeds: list[_SeedRun], names: tuple[str, str], seed_models: str) -> dict[str, Any]:
    """Run metadata: the settings with what they resolved to, the seeds, the split sizes and the phase
    timings (every seed's, by checkpoint name)."""
    settings, data, ctx = prep.settings, prep.splits, seeds[0].ctx
    # the settings resolved (stop_loss, stage_steps, head and fine-tuning epochs, fine-tuning lr, eval rows,
    # device); settings_given: as given (what inputs.json records)
    recorded = {**settings.resolved(), "eval_samples": rows(data.eval_x), "device": str(ctx.device)}
    # one entry per phase: the training calls by checkpoint name, then the other phases
    timings: dict[str, float] = {}
    for run in seeds:
        timings.update(run.ctx.fit.seconds)
    timings.update(ctx.timer.seconds)
    return run_meta(guide=names[0], data=names[1], seed=settings.seed, seeds=settings.seed_list(),
                    seed_models=seed_models, n=settings.n, n_train=rows(data.train[0]), n_val=data.n_val,
                    n_test=rows(data.test[0]), n_align=rows(data.align_x), settings=recorded,
                    settings_given=settings.to_dict(), timings={k: round(v, 3) for k, v in timings.items()})


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
