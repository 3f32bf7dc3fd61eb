"""``run_conversion``: Network of Theseus (spec §1) from guide and data to a :class:`ConvertResult`.

Flow: (optionally train the guide) → resolve the plan by a dry run → per guide init (trained/random):
cache the frozen guide's activations once → per (schedule, metric): align stage by stage through the
shared training loop (plateau LR control, stop rules, checkpoints), recalibrate BatchNorm after every
stage, train the head alone (linear probe), fine-tune everything → baselines (scratch, logit
distillation) with the fine-tuning budget → tables and a converted-vs-guide CKA matrix (core compare).

Every training call has a unique checkpoint name (``guide``, ``<init>-<schedule>-<metric>-stageK``,
``...-head``, ``...-finetune``, ``scratch``, ``kd-<init>``), so ``resume=True`` restores finished
stages without training and continues an interrupted one bit-identically.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from simkit.errors import SimkitError, unknown_name_error
from simkit.forward import check_accepts, resolve_device, to_device
from simkit.results import ConvertResult
from simkit.runinfo import Timer, run_meta
from simkit.theseus.finetune import distill, score, train_head, train_task
from simkit.theseus.modules import fresh_copy, reinitialise
from simkit.theseus.plans import Slot, build_target, install, resolve_plan
from simkit.theseus.recipes import RECIPES, make_plan
from simkit.theseus.schedules import (
    SCHEDULES,
    GuideCache,
    fresh_modules,
    guide_cache,
    hybrid_outputs,
    isolated_output,
    plan_stages,
    run_stage,
)
from simkit.theseus.task import Inputs, Task, rows, run_model, take
from simkit.training.denormals import flush_denormals

GUIDE_INITS = ("trained", "random")
BASELINES = ("scratch", "kd")
CURVE_POINTS = 200  # loss-curve points kept per training phase (the full logs are in <name>.log.csv)


def _check_names(values: Sequence[str], valid: Sequence[str], kind: str) -> list[str]:
    out = []
    for v in values:
        if v not in valid:
            raise unknown_name_error(kind, v, valid, f"valid: {', '.join(valid)}")
        if v not in out:
            out.append(v)
    if not out:
        raise SimkitError(f"no {kind} given; pass at least one of {', '.join(valid)}")
    return out


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
    from simkit.training import recalibrate_batchnorm

    if not _has_bn(model):
        return
    if isinstance(inputs, dict):
        raise SimkitError("BatchNorm recalibration needs tensor inputs; this model mixes BatchNorm with "
                          "tokenised dict inputs")
    recalibrate_batchnorm(model, inputs, batch_size)


def _cka_rows(values: list[torch.Tensor], guide: list[torch.Tensor], slots: Sequence[Slot],
              replaced: set[int], only: Sequence[int] | None = None) -> list[dict[str, Any]]:
    from simkit.metrics.cka import linear_cka

    out = []
    for j, slot in enumerate(slots):
        if only is not None and j not in only:
            continue
        x, y = values[j] if len(values) == len(slots) else values[list(only).index(j)], guide[j]
        out.append({"layer": slot.label, "alignment_metric": "cka",
                    "value": linear_cka(x.reshape(len(x), -1), y.reshape(len(y), -1)),
                    "replaced": j in replaced})
    return out


class _Fitter:
    """Builds the shared-loop calls of a run: same run_dir, resume flag and seed; one name per phase."""

    def __init__(self, run_dir: Path | None, resume: bool, seed: int, progress: bool, checkpoint_every: int):
        self.run_dir, self.resume, self.seed = run_dir, resume, seed
        self.progress, self.checkpoint_every = progress, checkpoint_every
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, **config: Any):
        from simkit.training import TrainConfig, fit

        cfg = TrainConfig(seed=self.seed, progress=self.progress, checkpoint_every=self.checkpoint_every,
                          description=name, **config)

        def run(model, loss_fn, data, params):
            start = time.perf_counter()
            history = fit(model, loss_fn, data, cfg, params=params, run_dir=self.run_dir, name=name,
                          resume=self.resume)
            self.seconds[name] = time.perf_counter() - start
            return history

        return run


@flush_denormals()  # denormals made prototype runs up to 10x slower on CPU; restored on return
def run_conversion(guide: nn.Module | str, data: Any, *, recipe: str | None = "conv-to-mlp",
                   plan: str | Any | None = None, schedules: Sequence[str] = ("progressive",),
                   metrics: Sequence[str] = ("cka",), guide_inits: Sequence[str] = ("trained",),
                   baselines: Sequence[str] = ("scratch", "kd"), rank: int = 256, group: int = 2,
                   cell: str = "gru", steps_per_stage: int = 300, batch_size: int = 256, lr: float = 1e-3,
                   finetune_epochs: float = 60, head_epochs: float | None = None,
                   finetune_batch_size: int = 128, finetune_lr: float | None = None,
                   train_guide: float = 0, plateau_window: int = 100, stop_loss: float | None = 0.01,
                   kd_temperature: float = 4.0, seed: int = 0, n: int | None = None,
                   eval_samples: int = 512, run_dir: str | Path | None = None, resume: bool = False,
                   checkpoint_every: int = 0, compare_layers: bool = True, progress: bool = True,
                   trust: bool = False, device: str | torch.device = "cpu") -> ConvertResult:
    """Convert ``guide`` into the target architecture of ``recipe`` (or ``plan``) on ``data``.

    guide: an nn.Module or a model spec; data: a ``simkit.data.Dataset`` or a data spec (labelled for
    classification; token ids (n, T) for a causal LM). plan: ``"file.py:make_plan"``, a
    ReplacementPlan or a dict {guide name(s): factory}; overrides ``recipe``.
    schedules / metrics / guide_inits: every combination is converted (one ``runs`` row each).
    steps_per_stage: alignment steps per stage (joint: times the number of replaced modules).
    head_epochs: head-only epochs before full fine-tuning (default finetune_epochs / 6 [ours]);
    baselines get head_epochs + finetune_epochs epochs of end-to-end training.
    plateau_window / stop_loss: the shared loop's plateau LR control and stop rule per stage.
    train_guide: epochs of task training of the guide first (a module passed in is trained in place).
    n: use the first ``n`` samples of the data (a spec or a Dataset alike), then split them: a native
    test split (mnist1d, digits) is kept whole, otherwise the seeded 80/20 split is of those n samples.
    device: ``cpu``, ``cuda`` or ``cuda:N``; the guide (a module passed in is moved and stays there),
    every target module, the data and all losses live there.
    run_dir: where checkpoints go (needed for resume). Returns a ConvertResult.
    """
    timer = Timer()
    schedules = _check_names(schedules, SCHEDULES, "schedule")
    guide_inits = _check_names(guide_inits, GUIDE_INITS, "guide init")
    baselines = _check_names(baselines, BASELINES, "baseline") if baselines else []
    from simkit.metrics.losses import alignment_loss

    metrics = list(dict.fromkeys(metrics))
    if not metrics:
        raise SimkitError("no alignment metric given; pass --metric cka, unbiased_cka or dmnn")
    losses = {m: alignment_loss(m) for m in metrics}
    if plan is None and recipe not in RECIPES:
        raise unknown_name_error("recipe", str(recipe), RECIPES, "or pass --plan file.py:make_plan")
    for label, value in (("--finetune-epochs", finetune_epochs), ("--train-guide", train_guide)):
        if value < 0:
            raise SimkitError(f"{label} must be >= 0, got {value}")
    if resume and run_dir is None:
        raise SimkitError("--resume needs the run directory of the interrupted run (--out)")
    device = resolve_device(device)
    head_epochs = finetune_epochs / 6 if head_epochs is None else head_epochs
    run_dir = Path(run_dir) if run_dir is not None else None
    fitter = _Fitter(run_dir, resume, seed, progress, checkpoint_every)

    with timer("load"):
        guide_spec = guide if isinstance(guide, str) else type(guide).__name__
        if isinstance(guide, str):
            from simkit.models import load_model

            guide = load_model(guide, seed=seed, trust=trust)
        guide.to(device)
        if isinstance(data, str):
            from simkit.data import load_data

            data_spec = data
            data = load_data(data, n=n, seed=seed)
        else:
            data_spec = getattr(data, "spec", type(data).__name__)
            data = data.cap(n)  # --n means the same for a Dataset as for a spec: cap, then split
        train, test = data.train_test(seed=seed)
        task = Task.infer(train.inputs, train.labels)
        train_x, test_x = to_device(train.inputs, device), to_device(test.inputs, device)
        train_t = to_device(task.targets(train_x, train.labels), device)
        test_t = to_device(task.targets(test_x, test.labels), device)
        eval_x = take(test_x, slice(0, min(eval_samples, rows(test_x))))
        if rows(train_x) < 4 or rows(eval_x) < 4:
            raise SimkitError(f"conversion needs at least 4 training and 4 test samples, got "
                              f"{rows(train_x)} and {rows(eval_x)}; raise --n")
    s = task.score
    ft = dict(batch_size=finetune_batch_size, lr=finetune_lr or lr, scheduler="cosine")

    if train_guide:
        with timer("train_guide"):
            train_task(guide, task, (train_x, train_t), fitter("guide", epochs=train_guide, **ft))
    guide.eval()
    for p in guide.parameters():
        p.requires_grad_(False)

    with timer("plan"):
        plan_obj = make_plan(recipe, guide, plan=plan, rank=rank, group=group, cell=cell, seed=seed) \
            if plan is None or isinstance(plan, str) else plan
        sample = take(train_x, slice(0, min(4, rows(train_x))))
        check_accepts(guide, sample, "the guide")
        slots, head = resolve_plan(plan_obj, guide, lambda m: run_model(m, sample), seed=seed)

    runs, stage_rows, stage_summary, curves = [], [], [], []
    scratch_score = None
    baseline_epochs = head_epochs + finetune_epochs

    def add_curve(phase: str, history, labels: dict[str, Any]) -> None:
        steps, values = _thin(history.losses)
        curves.extend({**labels, "phase": phase, "step": int(a), "loss": float(b)}
                      for a, b in zip(steps, values, strict=True))

    if "scratch" in baselines:
        with timer("scratch"):
            scratch = reinitialise(build_target(guide, slots), seed + 1)
            hist = train_task(scratch, task, (train_x, train_t), fitter("scratch", epochs=baseline_epochs, **ft))
            scratch_score = score(scratch, task, test_x, test_t, 512)
            add_curve("scratch", hist, {"schedule": "", "metric": "", "guide_init": ""})
            del scratch

    primary = None
    for gi in guide_inits:
        with timer(f"guide_{gi}"):
            g = guide if gi == "trained" else _random_guide(guide, seed, train_x, batch_size)
            guide_score = score(g, task, test_x, test_t, 512)
            independent = "independent" in schedules
            cache = guide_cache(g, slots, train_x, batch_size, want_inputs=independent,
                                want_logits="kd" in baselines)
            eval_cache = guide_cache(g, slots, eval_x, batch_size, want_inputs=independent)
        kd_score = None
        if "kd" in baselines:
            with timer(f"kd_{gi}"):
                student = reinitialise(build_target(guide, slots), seed + 2)
                hist = distill(student, task, train_x, cache.logits,
                               fitter(f"kd-{gi}", epochs=baseline_epochs, **ft), kd_temperature)
                kd_score = score(student, task, test_x, test_t, 512)
                add_curve(f"kd-{gi}", hist, {"schedule": "", "metric": "", "guide_init": gi})
                del student
        for schedule in schedules:
            for metric in metrics:
                labels = {"schedule": schedule, "metric": metric, "guide_init": gi}
                prefix = f"{gi}-{schedule}-{metric}"
                start = time.perf_counter()
                converted, probe, stage_info = _convert_arm(
                    g, slots, head, task, schedule, losses[metric], cache, eval_cache,
                    (train_x, train_t), (test_x, test_t), eval_x, fitter, prefix,
                    steps_per_stage=steps_per_stage, batch_size=batch_size, lr=lr,
                    plateau_window=plateau_window, stop_loss=stop_loss, head_epochs=head_epochs,
                    finetune_epochs=finetune_epochs, ft=ft, seed=seed, labels=labels, add_curve=add_curve)
                stage_rows.extend(stage_info["stages"])
                stage_summary.extend(stage_info["summary"])
                converted_score = score(converted, task, test_x, test_t, 512)
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
    if compare_layers and primary is not None:
        with timer("compare"):
            tables["layer_cka"] = _layer_cka(primary[0], primary[1], slots, eval_x, batch_size, seed, device)

    first = runs[0]
    summary = {f"guide_{s}": first[f"guide_{s}"], f"converted_{s}": first[f"converted_{s}"]}
    if "scratch" in baselines:
        summary[f"scratch_{s}"] = scratch_score
    if "kd" in baselines:
        summary[f"kd_{s}"] = first[f"kd_{s}"]
    summary.update({"schedule": first["schedule"], "metric": first["metric"],
                    "recipe": recipe if plan is None else f"plan:{plan if isinstance(plan, str) else 'object'}",
                    "guide_init": first["guide_init"], f"probe_{s}": first[f"probe_{s}"],
                    "task": task.kind, "runs": len(runs)})
    extra = {
        "slots": [{"layer": sl.label, "names": list(sl.names), "in_shape": list(sl.in_shape),
                   "out_shape": list(sl.out_shape), "target": type(sl.module).__name__, "align": sl.align,
                   "target_params": sum(p.numel() for p in sl.module.parameters()),
                   "guide_params": sum(p.numel() for m in sl.guide_modules for p in m.parameters())}
                  for sl in slots],
        "head": head, "plan": getattr(plan_obj, "description", ""), "score": s,
        "higher_is_better": task.higher_is_better,
        "guide_forward_batches": cache.batches,
    }
    meta = run_meta(
        guide=guide_spec, data=data_spec, seed=seed, n=n, n_train=rows(train_x), n_test=rows(test_x),
        settings={"recipe": recipe, "plan": plan if isinstance(plan, str) else None, "schedules": schedules,
                  "metrics": metrics, "guide_inits": guide_inits, "baselines": baselines, "rank": rank,
                  "group": group, "cell": cell, "steps_per_stage": steps_per_stage, "batch_size": batch_size,
                  "lr": lr, "finetune_epochs": finetune_epochs, "head_epochs": head_epochs,
                  "finetune_batch_size": finetune_batch_size, "finetune_lr": finetune_lr or lr,
                  "train_guide": train_guide, "plateau_window": plateau_window, "stop_loss": stop_loss,
                  "kd_temperature": kd_temperature, "eval_samples": rows(eval_x), "device": str(device)},
        timings={k: round(v, 3) for k, v in {**timer.seconds, **fitter.seconds}.items()},
    )
    return ConvertResult(summary=summary, tables=tables, meta=meta, extra=extra)


def _random_guide(guide: nn.Module, seed: int, inputs: Inputs, batch_size: int) -> nn.Module:
    """An untrained copy of the guide (fresh init from ``seed``), BatchNorm statistics recomputed on the
    unlabeled inputs [ours: an untrained guide's default BN statistics are arbitrary]."""
    g = fresh_copy(guide, seed + 104729)
    recalibrate(g, inputs, batch_size)
    g.eval()
    for p in g.parameters():
        p.requires_grad_(False)
    return g


def _convert_arm(guide, slots, head, task, schedule, loss, cache: GuideCache, eval_cache: GuideCache,
                 train, test, eval_x, fitter, prefix, *, steps_per_stage, batch_size, lr, plateau_window,
                 stop_loss, head_epochs, finetune_epochs, ft, seed, labels, add_curve):
    """Align, recalibrate, head-first, fine-tune one (guide, schedule, metric) arm."""
    modules = fresh_modules(slots)
    hybrid = copy.deepcopy(guide)
    stages_out, summary_out = [], []
    installed: set[int] = set()
    align_seconds = 0.0
    stages = plan_stages(schedule, len(slots), steps_per_stage)
    for stage in stages:
        name = f"{prefix}-{stage.name}"
        fit_stage = fitter(name, steps=stage.steps, batch_size=batch_size, lr=lr,
                           plateau_window=plateau_window, stop_loss=stop_loss)
        start = time.perf_counter()
        outcome = run_stage(hybrid, slots, modules, stage, cache, train[0], loss, fit_stage)
        align_seconds += time.perf_counter() - start
        installed.update(stage.install)
        if stage.isolated:
            (j,) = stage.train
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
                             fitter(f"{prefix}-head", epochs=head_epochs, **ft), batch_size=512, seed=seed + 3)
    add_curve("head", hist, labels)
    hist = train_task(hybrid, task, train, fitter(f"{prefix}-finetune", epochs=finetune_epochs, **ft))
    add_curve("finetune", hist, labels)
    stages_out.extend({**labels, "stage": "finetuned", **r} for r in _cka_rows(
        hybrid_outputs(hybrid, slots, eval_x, batch_size), eval_cache.outputs, slots, installed))
    return hybrid, probe, {"stages": stages_out, "summary": summary_out, "align_seconds": align_seconds}


def _layer_cka(converted: nn.Module, guide: nn.Module, slots: Sequence[Slot], inputs: Inputs,
               batch_size: int, seed: int, device: torch.device) -> pd.DataFrame:
    """Long table (layer_converted, layer_guide, value): minibatch linear CKA through the core's compare.

    Layers: every block of the guide's block container (when it has one) and every replaced output.
    """
    from simkit.comparison import compare
    from simkit.theseus.recipes import find_blocks

    names = [sl.output_name for sl in slots]
    try:
        container = find_blocks(guide)
        names += [f"{container}.{i}" for i in range(len(guide.get_submodule(container)))]
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
