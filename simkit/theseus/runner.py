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
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from simkit.data import Dataset, check_finite
from simkit.engine import compare
from simkit.errors import SimkitError, unknown_name_error
from simkit.forward import check_accepts, resolve_device, to_device
from simkit.metrics.cka import linear_cka
from simkit.metrics.losses import alignment_loss
from simkit.results import ConvertResult
from simkit.rundir import RunDir, fingerprint, open_run_dir
from simkit.runinfo import Timer, run_meta
from simkit.seeding import derive_seed
from simkit.theseus.finetune import distill, score, train_head, train_task
from simkit.theseus.modules import fresh_copy, reinitialise
from simkit.theseus.plans import ReplacementPlan, Slot, build_target, install, resolve_plan
from simkit.theseus.recipes import RECIPES, block_count, find_blocks, make_plan
from simkit.theseus.schedules import (
    GuideCache,
    fresh_modules,
    guide_cache,
    hybrid_outputs,
    isolated_output,
    plan_stages,
    run_stage,
)
from simkit.theseus.settings import ConvertSettings, unique
from simkit.theseus.task import Inputs, Task, rows, run_model, take
from simkit.training import TrainConfig, TrainHistory, ValidationMonitor, fit, recalibrate_batchnorm
from simkit.training.denormals import flush_denormals

CURVE_POINTS = 200  # loss-curve points kept per training phase (the full logs are in <name>.log.csv)
EVAL_BATCH = 512  # batch size of the scores (accuracy, perplexity)

AddCurve = Callable[[str, TrainHistory, dict[str, Any]], None]


def _thin(losses: Sequence[float], points: int = CURVE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(steps, losses) at most ``points`` evenly spaced steps (1-based), always keeping the last."""
    n = len(losses)
    if n == 0:
        return np.zeros(0, dtype=int), np.zeros(0)
    idx = np.unique(np.linspace(0, n - 1, min(points, n)).round().astype(int))
    return idx + 1, np.asarray(losses, dtype=float)[idx]


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


FitCall = Callable[[nn.Module, Callable[..., Tensor], tuple[Tensor, ...], list[nn.Parameter]], TrainHistory]


class _Fitter:
    """Builds the shared-loop calls of a run: same run_dir, resume flag and seed; one name per phase."""

    def __init__(self, run_dir: Path | None, resume: bool, seed: int, progress: bool, checkpoint_every: int):
        self.run_dir, self.resume, self.seed = run_dir, resume, seed
        self.progress, self.checkpoint_every = progress, checkpoint_every
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, **config: Any) -> FitCall:
        cfg = TrainConfig(seed=self.seed, progress=self.progress, checkpoint_every=self.checkpoint_every,
                          description=name, **config)

        def run(model: nn.Module, loss_fn: Callable[..., Tensor], data: tuple[Tensor, ...],
                params: list[nn.Parameter], monitor: ValidationMonitor | None = None) -> TrainHistory:
            start = time.perf_counter()
            history = fit(model, loss_fn, data, cfg, params=params, run_dir=self.run_dir, name=name,
                          resume=self.resume, monitor=monitor)
            self.seconds[name] = time.perf_counter() - start
            return history

        return run


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
    loaded with ``simkit.theseus.load_plan_file(text, guide)`` and its text kept in ``settings.plan``.
    run_dir: where checkpoints and inputs.json go (needed for resume): a path, checked against these
    inputs (a resume with other settings, guide, data or plan is refused), or a ``RunDir``.
    device: ``cpu``, ``cuda`` or ``cuda:N``: the guide, every target module, the data and all losses.
    checkpoint_every: steps between checkpoints inside a phase (0: at its end only).
    guide_name / data_name: recorded in ``meta`` (the CLI passes the spec strings).
    Everything is validated before the run directory is started, so a run that fails its checks
    leaves an earlier run in ``run_dir`` as it was. Returns a ConvertResult.
    """
    timer = Timer()
    if settings is None:
        settings = ConvertSettings()
    settings.validate()
    if not isinstance(guide, nn.Module):
        raise SimkitError(f"`guide` must be a torch.nn.Module, got {type(guide).__name__}; load a spec with "
                          "simkit.models.load_model")
    if not isinstance(data, Dataset):
        raise SimkitError(f"`data` must be a simkit.data.Dataset, got {type(data).__name__}; load a spec with "
                          "simkit.data.load_data")
    if plan is None and settings.plan:
        raise SimkitError(f"`plan` {settings.plan!r} is only the record of a plan file; pass the plan itself "
                          "(simkit.theseus.load_plan_file(text, guide)) as `plan`")
    if plan is None and settings.recipe is None:
        raise unknown_name_error("recipe", "None", RECIPES, "or pass a `plan`")
    seed = settings.seed
    schedules, metrics = unique(settings.schedule), unique(settings.metric)
    guide_inits, baselines = unique(settings.guide_init), unique(settings.baselines)
    ranks = settings.ranks
    if plan is not None and len(ranks) > 1:
        raise SimkitError(f"a rank sweep (`rank` {ranks}) needs a recipe; a plan fixes its own target modules")
    losses = {m: alignment_loss(m) for m in metrics}
    device = resolve_device(device)
    head_epochs = settings.effective_head_epochs
    # what a Python caller's run directory is tied to (the CLI passes a RunDir made from spec strings)
    inputs: dict[str, Any] = {}
    if run_dir is not None and not isinstance(run_dir, RunDir):
        inputs = {**settings.to_dict(), "guide": fingerprint(guide), "data": fingerprint(data)}

    with timer("load"):
        guide.to(device)
        data = data.cap(settings.n)  # `n` means the same for every Dataset: cap, then split
        check_finite(data)
        train_all, test = data.train_test(seed=seed)
        train, val = split_validation(train_all, settings.val_fraction, seed)
        task = Task.infer(train.inputs, train.labels)
        train_x, test_x = to_device(train.inputs, device), to_device(test.inputs, device)
        train_t = task.targets(train_x, train.labels).to(device)
        test_t = task.targets(test_x, test.labels).to(device)
        val_x: Inputs | None = None
        val_t: Tensor | None = None
        if val is not None:
            val_x = to_device(val.inputs, device)
            val_t = task.targets(val_x, val.labels).to(device)
        eval_x = take(test_x, slice(0, min(settings.eval_samples, rows(test_x))))
        if rows(train_x) < 4 or rows(eval_x) < 4:
            raise SimkitError(f"conversion needs at least 4 training and 4 test samples, got "
                              f"{rows(train_x)} and {rows(eval_x)}; raise `n`")

    with timer("plan"):
        sample = take(train_x, slice(0, min(4, rows(train_x))))
        check_accepts(guide, sample, "the guide")
        plans: dict[int, tuple[Any, list[Slot], str]] = {}
        for rank in ranks:
            plan_obj = ReplacementPlan.coerce(plan) if plan is not None else make_plan(
                settings.recipe, guide, rank=rank, group=settings.group, cell=settings.cell, seed=seed)
            slots_r, head_r = resolve_plan(plan_obj, guide, lambda m: run_model(m, sample), seed=seed)
            plans[rank] = (plan_obj, list(slots_r), head_r)
    plan_obj, slots, head = plans[ranks[0]]
    if inputs and plan is not None:  # a plan object: what it builds is part of the inputs
        inputs["plan_targets"] = fingerprint([[list(sl.names), sl.align, fingerprint(sl.target)]
                                              for sl in slots])

    # validated: from here on the run directory is this run's
    opened = open_run_dir(run_dir, "convert", inputs, resume=resume)
    if opened is not None:
        opened.start()
    fitter = _Fitter(opened.path if opened else None, opened.resume if opened else False, seed, progress,
                     checkpoint_every)
    s = task.score
    ft: dict[str, Any] = dict(batch_size=settings.finetune_batch_size, lr=settings.effective_finetune_lr,
                              scheduler="cosine")
    per_epoch = -(-rows(train_x) // settings.finetune_batch_size)
    validation: list[dict[str, Any]] = []

    def monitor(patience: int | None = None, min_steps: int = 0, lr_patience: int | None = None,
                model: nn.Module | None = None) -> ValidationMonitor | None:
        """Scores ``model`` on the validation split once per epoch (None without a validation split)."""
        if val_x is None or val_t is None or model is None:
            return None
        target = model
        return ValidationMonitor(lambda: score(target, task, val_x, val_t, EVAL_BATCH), per_epoch,
                                 patience=patience, min_steps=min_steps, lr_patience=lr_patience,
                                 higher_is_better=task.higher_is_better)

    def add_validation(phase: str, mon: ValidationMonitor | None, labels: dict[str, Any]) -> None:
        if mon is not None:
            validation.extend({**labels, "phase": phase, "step": a, f"val_{s}": b} for a, b in mon.scores)

    guide_steps = 0
    guide_stopped = ""
    if settings.train_guide:
        with timer("guide"):
            mon = monitor(model=guide)
            hist = train_task(guide, task, (train_x, train_t),
                              fitter("guide", epochs=settings.train_guide, **{**ft, "lr": settings.effective_guide_lr}),
                              monitor=mon)
            guide_steps, guide_stopped = hist.steps, hist.stopped
            add_validation("guide", mon, {"schedule": "", "metric": "", "guide_init": "trained", "rank": ranks[0]})
    guide.eval()
    for p in guide.parameters():
        p.requires_grad_(False)
    guide_val = score(guide, task, val_x, val_t, EVAL_BATCH) if val_x is not None and val_t is not None else None

    runs: list[dict[str, Any]] = []
    stage_rows: list[dict[str, Any]] = []
    stage_summary: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = []
    baseline_rows: list[dict[str, Any]] = []
    batch_size = settings.batch_size

    def add_curve(phase: str, history: TrainHistory, labels: dict[str, Any]) -> None:
        steps, values = _thin(history.losses)
        curves.extend({**labels, "phase": phase, "step": int(a), "loss": float(b)}
                      for a, b in zip(steps, values, strict=True))

    def train_baseline(kind: str, gi: str, min_steps: int, logits: Tensor | None) -> float:
        """Scratch or distillation with a fair budget: the fine-tuning recipe (AdamW, cosine decay) for
        max(``min_steps`` — the longest conversion arm —, ``baseline_epochs``) optimizer steps, the
        weights of the best validation epoch kept; returns its test score."""
        name = "scratch" if kind == "scratch" else f"kd-{gi}"
        labels = {"schedule": "", "metric": "", "guide_init": "" if kind == "scratch" else gi, "rank": ranks[0]}
        with timer(name):
            student = reinitialise(build_target(guide, slots), derive_seed(seed, kind))
            epochs = min(settings.baseline_epochs, settings.baseline_max_epochs)
            steps = max(min_steps, int(math.ceil(epochs * per_epoch)))
            mon = monitor(model=student)
            fit_b = fitter(name, steps=steps, **ft)
            if kind == "scratch":
                hist = train_task(student, task, (train_x, train_t), fit_b, monitor=mon)
            else:
                if logits is None:
                    raise SimkitError("internal: logit distillation needs the guide's logits cache")
                hist = distill(student, task, train_x, logits, fit_b, settings.kd_temperature, monitor=mon)
            test_score = score(student, task, test_x, test_t, EVAL_BATCH)
        add_curve(name, hist, labels)
        add_validation(name, mon, labels)
        best_step = mon.best_step if mon is not None else hist.steps
        # still improving: the best validation epoch lies within the last `baseline_patience` epochs
        improving = mon is not None and best_step > hist.steps - settings.baseline_patience * per_epoch
        baseline_rows.append({"baseline": kind, "guide_init": labels["guide_init"], "steps": hist.steps,
                              "min_steps": min_steps, "stopped": hist.stopped, "best_step": best_step,
                              "still_improving": improving,
                              f"val_{s}": mon.best if mon is not None else None, f"test_{s}": test_score,
                              "seconds": round(timer.seconds.get(name, 0.0), 2)})
        return test_score

    primary = None
    cache: GuideCache | None = None
    kd_scores: dict[str, float] = {}
    for gi in guide_inits:
        g = guide if gi == "trained" else _random_guide(guide, seed, train_x, batch_size)
        guide_score = score(g, task, test_x, test_t, EVAL_BATCH)
        first_of_init = len(runs)
        logits: Tensor | None = None
        for rank in ranks:
            _, slots_r, head_r = plans[rank]
            with timer(f"cache-{gi}" + (f"-rank{rank}" if len(ranks) > 1 else "")):
                independent = "independent" in schedules
                cache = guide_cache(g, slots_r, train_x, batch_size, want_inputs=independent,
                                    want_logits="kd" in baselines and rank == ranks[0])
                eval_cache = guide_cache(g, slots_r, eval_x, batch_size, want_inputs=independent)
            if rank == ranks[0]:
                logits = cache.logits
            for schedule in schedules:
                for metric in metrics:
                    labels = {"schedule": schedule, "metric": metric, "guide_init": gi, "rank": rank}
                    prefix = f"{gi}-{schedule}-{metric}" + (f"-rank{rank}" if len(ranks) > 1 else "")
                    start = time.perf_counter()
                    converted, probe, info = _convert_arm(
                        g, slots_r, head_r, task, schedule, losses[metric], cache, eval_cache,
                        (train_x, train_t), (test_x, test_t), eval_x, fitter, prefix, settings,
                        ft=ft, labels=labels, add_curve=add_curve)
                    stage_rows.extend(info["stages"])
                    stage_summary.extend(info["summary"])
                    converted_score = score(converted, task, test_x, test_t, EVAL_BATCH)
                    steps = info["align_steps"] + info["head_steps"] + info["finetune_steps"]
                    runs.append({**labels, f"guide_{s}": guide_score, f"probe_{s}": probe,
                                 f"converted_{s}": converted_score, f"scratch_{s}": None, f"kd_{s}": None,
                                 "gain_over_scratch": None, "align_steps": info["align_steps"],
                                 "head_steps": info["head_steps"], "finetune_steps": info["finetune_steps"],
                                 "steps": steps, "scratch_steps": None, "kd_steps": None,
                                 "align_seconds": round(info["align_seconds"], 2),
                                 "seconds": round(time.perf_counter() - start, 2), "seed": seed})
                    timer.seconds[prefix] = time.perf_counter() - start
                    if primary is None:
                        primary = (converted, g)
                    else:
                        del converted
        if "kd" in baselines:
            min_steps = max(r["steps"] for r in runs[first_of_init:])
            kd_scores[gi] = train_baseline("kd", gi, min_steps, logits)
            kd_steps = baseline_rows[-1]["steps"]
            for r in runs[first_of_init:]:
                r[f"kd_{s}"], r["kd_steps"] = kd_scores[gi], kd_steps
    scratch_score = None
    if "scratch" in baselines:
        scratch_score = train_baseline("scratch", "", max(r["steps"] for r in runs), None)
        for r in runs:
            r[f"scratch_{s}"], r["scratch_steps"] = scratch_score, baseline_rows[-1]["steps"]
            r["gain_over_scratch"] = _gain(r[f"converted_{s}"], scratch_score, task.higher_is_better)

    tables = {"runs": pd.DataFrame(runs), "stages": pd.DataFrame(stage_rows),
              "stage_summary": pd.DataFrame(stage_summary), "curves": pd.DataFrame(curves)}
    # only tables with rows: an empty CSV is not a table (``simkit.load`` refuses one)
    for key, rows_ in (("baselines", baseline_rows), ("validation", validation)):
        if rows_:
            tables[key] = pd.DataFrame(rows_)
    if settings.compare_layers and primary is not None:
        with timer("compare"):
            tables["layer_cka"] = _layer_cka(primary[0], primary[1], slots, eval_x, batch_size, seed, device)

    first = runs[0]
    summary: dict[str, Any] = {f"guide_{s}": first[f"guide_{s}"], f"converted_{s}": first[f"converted_{s}"]}
    if "scratch" in baselines:
        summary[f"scratch_{s}"] = scratch_score
    if "kd" in baselines:
        summary[f"kd_{s}"] = first[f"kd_{s}"]
    summary.update({"schedule": first["schedule"], "metric": first["metric"],
                    "recipe": settings.recipe if plan is None else f"plan:{settings.plan or 'object'}",
                    "guide_init": first["guide_init"], f"probe_{s}": first[f"probe_{s}"],
                    "task": task.kind, "runs": len(runs), "rank": first["rank"],
                    "gain_over_scratch": first["gain_over_scratch"], f"guide_val_{s}": guide_val,
                    "guide_steps": guide_steps, "converted_steps": first["steps"],
                    "align_steps": first["align_steps"], "scratch_steps": first["scratch_steps"],
                    "kd_steps": first["kd_steps"], "val_samples": rows(val_x) if val_x is not None else 0})
    extra = {
        "slots": [{"layer": sl.label, "names": list(sl.names), "in_shape": list(sl.in_shape),
                   "out_shape": list(sl.out_shape), "target": type(sl.target).__name__, "align": sl.align,
                   "target_params": sum(p.numel() for p in sl.target.parameters()),
                   "guide_params": sum(p.numel() for m in sl.guide_modules for p in m.parameters())}
                  for sl in slots],
        "head": head, "plan": getattr(plan_obj, "description", ""), "score": s,
        "higher_is_better": task.higher_is_better,
        "guide_forward_batches": cache.batches if cache is not None else 0,
        "guide_stopped": guide_stopped, "ranks": ranks,
    }
    # the settings as given, with the values they resolved to (head epochs, fine-tuning lr, eval rows)
    recorded = {**settings.to_dict(), "head_epochs": head_epochs, "finetune_lr": settings.effective_finetune_lr,
                "guide_lr": settings.effective_guide_lr, "stop_loss": settings.effective_stop_loss,
                "stage_steps": settings.stage_steps, "eval_samples": rows(eval_x), "device": str(device)}
    # one entry per phase: the training calls by checkpoint name, then the other phases
    timings = {**fitter.seconds, **timer.seconds}
    meta = run_meta(
        guide=guide_name or type(guide).__name__, data=data_name or data.spec, seed=seed, n=settings.n,
        n_train=rows(train_x), n_val=rows(val_x) if val_x is not None else 0, n_test=rows(test_x),
        settings=recorded, timings={k: round(v, 3) for k, v in timings.items()},
    )
    return ConvertResult(summary=summary, tables=tables, meta=meta, extra=extra)


def _gain(converted: float, scratch: float | None, higher_is_better: bool) -> float | None:
    """Improvement of the converted score over scratch, in the score's own direction."""
    if scratch is None:
        return None
    return converted - scratch if higher_is_better else scratch - converted


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


def _random_guide(guide: nn.Module, seed: int, inputs: Inputs, batch_size: int) -> nn.Module:
    """An untrained copy of the guide (fresh init from ``seed``), BatchNorm statistics recomputed on the
    unlabeled inputs [ours: an untrained guide's default BN statistics are arbitrary]."""
    g = fresh_copy(guide, derive_seed(seed, "random guide"))
    recalibrate(g, inputs, batch_size)
    g.eval()
    for p in g.parameters():
        p.requires_grad_(False)
    return g


def _convert_arm(guide: nn.Module, slots: Sequence[Slot], head: str, task: Task, schedule: str,
                 loss: Callable[[Tensor, Tensor], Tensor], cache: GuideCache, eval_cache: GuideCache,
                 train: tuple[Inputs, Tensor], test: tuple[Inputs, Tensor], eval_x: Inputs, fitter: _Fitter,
                 prefix: str, settings: ConvertSettings, *, ft: dict[str, Any], labels: dict[str, Any],
                 add_curve: AddCurve) -> tuple[nn.Module, float, dict[str, Any]]:
    """Align, recalibrate, head-first, fine-tune one (guide, schedule, metric, rank) arm.

    Returns (converted model, linear-probe score, info): info["stages"] are the per-layer rows after
    each stage (linear CKA ``value`` and the arm's own alignment ``loss`` on held-out data, plus why the
    stage stopped), info["summary"] one row per stage, and the step counts of each phase."""
    batch_size = settings.batch_size
    modules = fresh_modules(slots)
    hybrid = copy.deepcopy(guide)
    stages_out: list[dict[str, Any]] = []
    summary_out: list[dict[str, Any]] = []
    installed: set[int] = set()
    align_seconds = 0.0
    align_steps = 0
    stop_loss = settings.effective_stop_loss
    stages = plan_stages(schedule, len(slots), settings.stage_steps)
    s = task.score
    for stage in stages:
        name = f"{prefix}-{stage.name}"
        fit_stage = fitter(name, steps=stage.steps, batch_size=batch_size, lr=settings.lr,
                           plateau_window=settings.plateau_window, plateau_factor=settings.plateau_factor,
                           stop_loss=stop_loss)
        start = time.perf_counter()
        outcome = run_stage(hybrid, slots, modules, stage, cache, train[0], loss, fit_stage)
        align_seconds += time.perf_counter() - start
        installed.update(stage.install)
        hybrid_score = float("nan")
        if stage.isolated:
            (j,) = stage.train
            if eval_cache.inputs is None:
                raise SimkitError("internal: the independent schedule needs the guide inputs cache")
            value = isolated_output(slots[j], modules[j], eval_cache.inputs[j], batch_size)
            rows_ = _cka_rows([value], eval_cache.outputs, slots, {j}, only=[j], loss=loss)
        else:
            recalibrate(hybrid, train[0], batch_size)
            rows_ = _cka_rows(hybrid_outputs(hybrid, slots, eval_x, batch_size), eval_cache.outputs, slots,
                              installed, loss=loss)
            # the hybrid as it stands (guide modules downstream, the guide's head): its task score
            hybrid_score = score(hybrid, task, test[0], test[1], EVAL_BATCH)
        hist = outcome.history
        align_steps += hist.steps
        rule = _stop_rule(hist.stopped, stop_loss, settings, stage.steps)
        info = {"steps": hist.steps, "stopped": hist.stopped, "rule": rule,
                "final_loss": hist.losses[-1] if hist.losses else float("nan")}
        stages_out.extend({**labels, "stage": stage.name, **r, **info} for r in rows_)
        summary_out.append({**labels, "stage": stage.name, **info, "max_steps": stage.steps,
                            "stop_loss": stop_loss, "final_lr": hist.lrs[-1] if hist.lrs else float("nan"),
                            f"hybrid_{s}": hybrid_score,
                            "trainable": ";".join(outcome.trainable), "changed": ";".join(outcome.changed),
                            "seconds": round(time.perf_counter() - start, 3)})
        add_curve(stage.name, hist, labels)
    if schedule == "independent":
        for j, slot in enumerate(slots):
            install(hybrid, slot, modules[j])
        recalibrate(hybrid, train[0], batch_size)
        installed = set(range(len(slots)))
        stages_out.extend({**labels, "stage": "assembled", **r} for r in _cka_rows(
            hybrid_outputs(hybrid, slots, eval_x, batch_size), eval_cache.outputs, slots, installed, loss=loss))
    # Fine-tuning: BN already recalibrated after the last stage; head first (linear probe), then all.
    head_hist, probe = train_head(hybrid, head, task, train, test,
                                  fitter(f"{prefix}-head", epochs=settings.effective_head_epochs, **ft),
                                  batch_size=EVAL_BATCH, seed=derive_seed(settings.seed, "head"))
    add_curve("head", head_hist, labels)
    hist = train_task(hybrid, task, train, fitter(f"{prefix}-finetune", epochs=settings.finetune_epochs, **ft))
    add_curve("finetune", hist, labels)
    stages_out.extend({**labels, "stage": "finetuned", **r} for r in _cka_rows(
        hybrid_outputs(hybrid, slots, eval_x, batch_size), eval_cache.outputs, slots, installed, loss=loss))
    return hybrid, probe, {"stages": stages_out, "summary": summary_out, "align_seconds": align_seconds,
                           "align_steps": align_steps, "head_steps": head_hist.steps, "finetune_steps": hist.steps}


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


def _layer_cka(converted: nn.Module, guide: nn.Module, slots: Sequence[Slot], inputs: Inputs,
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
