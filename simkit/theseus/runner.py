"""``convert``: Network of Theseus (spec §1) from a guide module and a dataset to a :class:`ConvertResult`.

Flow: validate everything (settings, the data against the guide, the plan by a dry run) → start the
run directory → (optionally train the guide) → per guide init (trained/random): cache the frozen
guide's activations once → per (schedule, metric): align stage by stage through the shared training
loop (plateau LR control, stop rules, checkpoints), recalibrate BatchNorm after every stage, train the
head alone (linear probe), fine-tune everything → baselines (scratch, logit distillation) with the
fine-tuning budget → tables and a converted-vs-guide CKA matrix (the engine's compare).

Every training call has a unique checkpoint name (``guide``, ``<init>-<schedule>-<metric>-stageK``,
``...-head``, ``...-finetune``, ``scratch``, ``kd-<init>``), so ``resume=True`` restores finished
stages without training and continues an interrupted one bit-identically.
"""

from __future__ import annotations

import copy
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
from simkit.training import TrainConfig, TrainHistory, fit, recalibrate_batchnorm
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
              only: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """One row per slot (or per slot in ``only``, whose values ``values`` holds in that order): linear
    CKA of the converted representation vs the guide's."""
    chosen = list(range(len(slots))) if only is None else list(only)
    out = []
    for x, j in zip(values, chosen, strict=True):
        y = guide[j]
        out.append({"layer": slots[j].label, "alignment_metric": "cka",
                    "value": linear_cka(x.reshape(len(x), -1), y.reshape(len(y), -1)),
                    "replaced": j in replaced})
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
                params: list[nn.Parameter]) -> TrainHistory:
            start = time.perf_counter()
            history = fit(model, loss_fn, data, cfg, params=params, run_dir=self.run_dir, name=name,
                          resume=self.resume)
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
        train, test = data.train_test(seed=seed)
        task = Task.infer(train.inputs, train.labels)
        train_x, test_x = to_device(train.inputs, device), to_device(test.inputs, device)
        train_t = task.targets(train_x, train.labels).to(device)
        test_t = task.targets(test_x, test.labels).to(device)
        eval_x = take(test_x, slice(0, min(settings.eval_samples, rows(test_x))))
        if rows(train_x) < 4 or rows(eval_x) < 4:
            raise SimkitError(f"conversion needs at least 4 training and 4 test samples, got "
                              f"{rows(train_x)} and {rows(eval_x)}; raise `n`")

    with timer("plan"):
        sample = take(train_x, slice(0, min(4, rows(train_x))))
        check_accepts(guide, sample, "the guide")
        plan_obj = ReplacementPlan.coerce(plan) if plan is not None else make_plan(
            settings.recipe, guide, rank=settings.rank, group=settings.group, cell=settings.cell, seed=seed)
        slots, head = resolve_plan(plan_obj, guide, lambda m: run_model(m, sample), seed=seed)
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

    if settings.train_guide:
        with timer("train_guide"):
            train_task(guide, task, (train_x, train_t), fitter("guide", epochs=settings.train_guide, **ft))
    guide.eval()
    for p in guide.parameters():
        p.requires_grad_(False)

    runs: list[dict[str, Any]] = []
    stage_rows: list[dict[str, Any]] = []
    stage_summary: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = []
    scratch_score = None
    baseline_epochs = head_epochs + settings.finetune_epochs
    batch_size = settings.batch_size

    def add_curve(phase: str, history: TrainHistory, labels: dict[str, Any]) -> None:
        steps, values = _thin(history.losses)
        curves.extend({**labels, "phase": phase, "step": int(a), "loss": float(b)}
                      for a, b in zip(steps, values, strict=True))

    if "scratch" in baselines:
        with timer("scratch"):
            scratch = reinitialise(build_target(guide, slots), derive_seed(seed, "scratch"))
            hist = train_task(scratch, task, (train_x, train_t), fitter("scratch", epochs=baseline_epochs, **ft))
            scratch_score = score(scratch, task, test_x, test_t, EVAL_BATCH)
            add_curve("scratch", hist, {"schedule": "", "metric": "", "guide_init": ""})
            del scratch

    primary = None
    cache: GuideCache | None = None
    for gi in guide_inits:
        with timer(f"guide_{gi}"):
            g = guide if gi == "trained" else _random_guide(guide, seed, train_x, batch_size)
            guide_score = score(g, task, test_x, test_t, EVAL_BATCH)
            independent = "independent" in schedules
            cache = guide_cache(g, slots, train_x, batch_size, want_inputs=independent,
                                want_logits="kd" in baselines)
            eval_cache = guide_cache(g, slots, eval_x, batch_size, want_inputs=independent)
        kd_score = None
        if "kd" in baselines:
            if cache.logits is None:
                raise SimkitError("internal: logit distillation needs the guide's logits cache")
            with timer(f"kd_{gi}"):
                student = reinitialise(build_target(guide, slots), derive_seed(seed, "kd"))
                hist = distill(student, task, train_x, cache.logits,
                               fitter(f"kd-{gi}", epochs=baseline_epochs, **ft), settings.kd_temperature)
                kd_score = score(student, task, test_x, test_t, EVAL_BATCH)
                add_curve(f"kd-{gi}", hist, {"schedule": "", "metric": "", "guide_init": gi})
                del student
        for schedule in schedules:
            for metric in metrics:
                labels = {"schedule": schedule, "metric": metric, "guide_init": gi}
                prefix = f"{gi}-{schedule}-{metric}"
                start = time.perf_counter()
                converted, probe, stage_info = _convert_arm(
                    g, slots, head, task, schedule, losses[metric], cache, eval_cache,
                    (train_x, train_t), (test_x, test_t), eval_x, fitter, prefix, settings,
                    ft=ft, labels=labels, add_curve=add_curve)
                stage_rows.extend(stage_info["stages"])
                stage_summary.extend(stage_info["summary"])
                converted_score = score(converted, task, test_x, test_t, EVAL_BATCH)
                runs.append({**labels, f"guide_{s}": guide_score, f"probe_{s}": probe,
                             f"converted_{s}": converted_score, f"scratch_{s}": scratch_score,
                             f"kd_{s}": kd_score, "align_seconds": round(stage_info["align_seconds"], 2),
                             "seconds": round(time.perf_counter() - start, 2), "seed": seed})
                timer.seconds[f"arm_{prefix}"] = time.perf_counter() - start
                if primary is None:
                    primary = (converted, g)
                else:
                    del converted

    tables = {"runs": pd.DataFrame(runs), "stages": pd.DataFrame(stage_rows),
              "stage_summary": pd.DataFrame(stage_summary), "curves": pd.DataFrame(curves)}
    if settings.compare_layers and primary is not None:
        with timer("compare"):
            tables["layer_cka"] = _layer_cka(primary[0], primary[1], slots, eval_x, batch_size, seed, device)

    first = runs[0]
    summary = {f"guide_{s}": first[f"guide_{s}"], f"converted_{s}": first[f"converted_{s}"]}
    if "scratch" in baselines:
        summary[f"scratch_{s}"] = scratch_score
    if "kd" in baselines:
        summary[f"kd_{s}"] = first[f"kd_{s}"]
    summary.update({"schedule": first["schedule"], "metric": first["metric"],
                    "recipe": settings.recipe if plan is None else f"plan:{settings.plan or 'object'}",
                    "guide_init": first["guide_init"], f"probe_{s}": first[f"probe_{s}"],
                    "task": task.kind, "runs": len(runs)})
    extra = {
        "slots": [{"layer": sl.label, "names": list(sl.names), "in_shape": list(sl.in_shape),
                   "out_shape": list(sl.out_shape), "target": type(sl.target).__name__, "align": sl.align,
                   "target_params": sum(p.numel() for p in sl.target.parameters()),
                   "guide_params": sum(p.numel() for m in sl.guide_modules for p in m.parameters())}
                  for sl in slots],
        "head": head, "plan": getattr(plan_obj, "description", ""), "score": s,
        "higher_is_better": task.higher_is_better,
        "guide_forward_batches": cache.batches if cache is not None else 0,
    }
    # the settings as given, with the values they resolved to (head epochs, fine-tuning lr, eval rows)
    recorded = {**settings.to_dict(), "head_epochs": head_epochs, "finetune_lr": settings.effective_finetune_lr,
                "eval_samples": rows(eval_x), "device": str(device)}
    meta = run_meta(
        guide=guide_name or type(guide).__name__, data=data_name or data.spec, seed=seed, n=settings.n,
        n_train=rows(train_x), n_test=rows(test_x), settings=recorded,
        timings={k: round(v, 3) for k, v in {**timer.seconds, **fitter.seconds}.items()},
    )
    return ConvertResult(summary=summary, tables=tables, meta=meta, extra=extra)


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
    """Align, recalibrate, head-first, fine-tune one (guide, schedule, metric) arm."""
    batch_size = settings.batch_size
    modules = fresh_modules(slots)
    hybrid = copy.deepcopy(guide)
    stages_out: list[dict[str, Any]] = []
    summary_out: list[dict[str, Any]] = []
    installed: set[int] = set()
    align_seconds = 0.0
    stages = plan_stages(schedule, len(slots), settings.steps_per_stage)
    for stage in stages:
        name = f"{prefix}-{stage.name}"
        fit_stage = fitter(name, steps=stage.steps, batch_size=batch_size, lr=settings.lr,
                           plateau_window=settings.plateau_window, stop_loss=settings.stop_loss)
        start = time.perf_counter()
        outcome = run_stage(hybrid, slots, modules, stage, cache, train[0], loss, fit_stage)
        align_seconds += time.perf_counter() - start
        installed.update(stage.install)
        if stage.isolated:
            (j,) = stage.train
            if eval_cache.inputs is None:
                raise SimkitError("internal: the independent schedule needs the guide inputs cache")
            value = isolated_output(slots[j], modules[j], eval_cache.inputs[j], batch_size)
            rows_ = _cka_rows([value], eval_cache.outputs, slots, {j}, only=[j])
        else:
            recalibrate(hybrid, train[0], batch_size)
            rows_ = _cka_rows(hybrid_outputs(hybrid, slots, eval_x, batch_size), eval_cache.outputs, slots,
                              installed)
        stages_out.extend({**labels, "stage": stage.name, **r} for r in rows_)
        hist = outcome.history
        summary_out.append({**labels, "stage": stage.name, "steps": hist.steps, "stopped": hist.stopped,
                            "final_loss": hist.losses[-1] if hist.losses else float("nan"),
                            "final_lr": hist.lrs[-1] if hist.lrs else float("nan"),
                            "trainable": ";".join(outcome.trainable), "changed": ";".join(outcome.changed),
                            "seconds": round(time.perf_counter() - start, 3)})
        add_curve(stage.name, hist, labels)
    if schedule == "independent":
        for j, slot in enumerate(slots):
            install(hybrid, slot, modules[j])
        recalibrate(hybrid, train[0], batch_size)
        installed = set(range(len(slots)))
        stages_out.extend({**labels, "stage": "assembled", **r} for r in _cka_rows(
            hybrid_outputs(hybrid, slots, eval_x, batch_size), eval_cache.outputs, slots, installed))
    # Fine-tuning: BN already recalibrated after the last stage; head first (linear probe), then all.
    hist, probe = train_head(hybrid, head, task, train, test,
                             fitter(f"{prefix}-head", epochs=settings.effective_head_epochs, **ft),
                             batch_size=EVAL_BATCH, seed=derive_seed(settings.seed, "head"))
    add_curve("head", hist, labels)
    hist = train_task(hybrid, task, train, fitter(f"{prefix}-finetune", epochs=settings.finetune_epochs, **ft))
    add_curve("finetune", hist, labels)
    stages_out.extend({**labels, "stage": "finetuned", **r} for r in _cka_rows(
        hybrid_outputs(hybrid, slots, eval_x, batch_size), eval_cache.outputs, slots, installed))
    return hybrid, probe, {"stages": stages_out, "summary": summary_out, "align_seconds": align_seconds}


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
                     mode="minibatch", batch_size=batch_size, seed=seed, progress=False, device=device)
    wide = result.matrix("linear_cka")
    frame = wide.stack(future_stack=True).reset_index()
    frame.columns = ["layer_converted", "layer_guide", "value"]
    return frame
