"""The objects the phases of ``convert`` pass each other (see :mod:`simkit.conversion.runner`).

:class:`Sweep`: the arms asked for (schedules, metrics, guide inits, baselines, ranks) and the alignment
losses. :class:`Splits`: the task's tensors on the run's device. :class:`Fitter`: the shared-loop
training calls of a run (one checkpoint name per phase). :class:`RunContext`: what every phase reads
(settings, task, splits, fitter, timer, the fine-tuning recipe). :class:`Budget`: one arm's labelled-training
budget under the run's ``baseline_budget`` rule. :class:`Rows`: the result tables as they fill, with one
method per kind of row.

The budget rule ``plateau`` (the default): every arm's labelled training (the converted arm's fine-tuning,
each baseline) runs until it is no longer still improving on the validation split (its best validation epoch
more than ``baseline_patience`` epochs back: the rule of :meth:`RunContext.still_improving`), never before
its floor (equal labelled epochs) and never past its cap (``baseline_max_epochs``, stated in advance); the LR
is constant, halved after ``baseline_patience`` // 2 epochs without improvement. ``steps`` and ``labelled``
(the earlier rules) train a fixed number of steps with cosine decay.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from simkit.conversion.finetune import score
from simkit.conversion.task import Inputs, Task, rows
from simkit.metrics.losses import alignment_loss
from simkit.provenance import Timer
from simkit.settings.convert import ConvertSettings
from simkit.training import TrainConfig, TrainHistory, ValidationMonitor, fit

CURVE_POINTS = 200  # loss-curve points kept per training phase (the full logs are in <name>.log.csv)
EVAL_BATCH = 512  # batch size of the scores (accuracy, perplexity)
#: the name in ``simkit.metrics.losses`` of each alignment metric (``simkit.settings.convert.ALIGNMENT_METRICS``)
LOSS_NAMES = {"linear_cka": "cka", "unbiased_cka": "unbiased_cka", "dmnn": "dmnn"}

FitCall = Callable[[nn.Module, Callable[..., Tensor], tuple[Tensor, ...], list[nn.Parameter]], TrainHistory]


@dataclass(frozen=True)
class Budget:
    """One arm's labelled-training budget in optimizer steps (fine-tuning batches): at least ``floor``, at
    most ``cap``; ``plateau``: it stops once no longer still improving on validation (the ``plateau`` rule
    with a validation split), else it trains exactly ``floor`` steps. ``rule``: the run's
    ``baseline_budget``."""

    floor: int
    cap: int
    rule: str
    plateau: bool

    def stop(self, stopped: str) -> str:
        """Why the training ended, in one word, from ``TrainHistory.stopped``: ``plateau`` (no longer still
        improving), ``cap`` (the cap reached while improving), ``floor`` (the plateau rule without a
        validation split: the floor alone) or ``fixed`` (the ``steps`` and ``labelled`` rules)."""
        if stopped == "validation":
            return "plateau"
        if self.plateau:
            return "cap"
        return "floor" if self.rule == "plateau" else "fixed"


def _thin(losses: Sequence[float], points: int = CURVE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(steps, losses) at most ``points`` evenly spaced steps (1-based), always keeping the last."""
    n = len(losses)
    if n == 0:
        return np.zeros(0, dtype=int), np.zeros(0)
    idx = np.unique(np.linspace(0, n - 1, min(points, n)).round().astype(int))
    return idx + 1, np.asarray(losses, dtype=float)[idx]


class Fitter:
    """Builds the shared-loop calls of one seed of a run: same run_dir, resume flag and seed; one name per
    phase, with ``suffix`` (``_s<seed>`` when several seeds run, else nothing) appended."""

    def __init__(self, run_dir: Path | None, resume: bool, seed: int, progress: bool, checkpoint_every: int,
                 suffix: str = ""):
        self.run_dir, self.resume, self.seed, self.suffix = run_dir, resume, seed, suffix
        self.progress, self.checkpoint_every = progress, checkpoint_every
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, **config: Any) -> FitCall:
        """The training call named ``name`` + suffix (its checkpoint and log name) with ``config`` (TrainConfig)."""
        name += self.suffix
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


@dataclass
class Sweep:
    """The arms of a run: every (guide init, rank, schedule, metric), the baselines, the losses by metric."""

    schedules: list[str]
    metrics: list[str]
    guide_inits: list[str]
    baselines: list[str]
    ranks: list[int]
    losses: dict[str, Callable[[Tensor, Tensor], Tensor]] = field(default_factory=dict)

    @classmethod
    def of(cls, settings: ConvertSettings) -> Sweep:
        """The lists of ``settings`` (validated: without duplicates; losses: see :meth:`resolve_losses`)."""
        return cls(list(settings.schedule), list(settings.metric), list(settings.guide_init),
                   list(settings.baselines), settings.ranks)

    def resolve_losses(self) -> None:
        """The alignment loss of every metric (by its catalogue name)."""
        self.losses = {m: alignment_loss(LOSS_NAMES[m]) for m in self.metrics}

    @property
    def sweeps_ranks(self) -> bool:
        """Several ranks: checkpoint names and timings carry ``-rank<R>``."""
        return len(self.ranks) > 1


@dataclass
class Splits:
    """The task's tensors on the run's device: (inputs, targets) of training, test and validation (None
    without a validation split), the held-out inputs of the CKA tables, and the alignment inputs
    ``align_x`` (the training inputs first, then any unlabeled extra inputs; None: the training inputs)."""

    train: tuple[Inputs, Tensor]
    test: tuple[Inputs, Tensor]
    val: tuple[Inputs, Tensor] | None
    eval_x: Inputs
    align_inputs: Inputs | None = None

    @property
    def align_x(self) -> Inputs:
        """The inputs the alignment stages, the guide caches and BatchNorm recalibration see."""
        return self.train[0] if self.align_inputs is None else self.align_inputs

    @property
    def n_val(self) -> int:
        """Validation rows (0 without a validation split)."""
        return rows(self.val[0]) if self.val is not None else 0


@dataclass
class RunContext:
    """What every phase of one seed of a run reads: the settings and arms, the task and its splits, the
    training calls (``fit``), the phase timer, the device, the seed and the fine-tuning recipe (``ft``;
    ``per_epoch`` optimizer steps per fine-tuning epoch)."""

    settings: ConvertSettings
    sweep: Sweep
    task: Task
    data: Splits
    fit: Fitter
    timer: Timer
    device: torch.device
    seed: int = 0
    ft: dict[str, Any] = field(init=False)
    per_epoch: int = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.ft = dict(batch_size=s.finetune_batch_size, lr=s.effective_finetune_lr, scheduler="cosine")
        self.per_epoch = -(-rows(self.data.train[0]) // s.finetune_batch_size)

    def timed(self, name: str) -> Any:
        """The phase timer under ``name`` with this seed's suffix (``_s<seed>`` when several seeds run)."""
        return self.timer(name + self.fit.suffix)

    def seconds(self, name: str) -> float:
        """Seconds timed so far under ``name`` (with this seed's suffix)."""
        return self.timer.seconds.get(name + self.fit.suffix, 0.0)

    def still_improving(self, mon: ValidationMonitor | None, steps: int) -> tuple[int, bool]:
        """(best step, still improving) of a phase of ``steps`` steps: the one rule for the converted arm's
        fine-tuning and the baselines — the best validation epoch lies within the last
        ``baseline_patience`` epochs (no monitor: the last step, not flagged)."""
        if mon is None:
            return steps, False
        return mon.best_step, mon.best_step > steps - self.settings.baseline_patience * self.per_epoch

    def monitor(self, model: nn.Module, budget: Budget | None = None) -> ValidationMonitor | None:
        """Scores ``model`` on the validation split once per epoch (None without a validation split); with
        a plateau ``budget`` it also stops the run once the best epoch is ``baseline_patience`` epochs back
        (not before ``budget.floor``) and halves the LR after half as many epochs without improvement."""
        if self.data.val is None:
            return None
        val_x, val_t = self.data.val
        task, patience = self.task, self.settings.baseline_patience
        plateau = budget is not None and budget.plateau
        return ValidationMonitor(lambda: score(model, task, val_x, val_t, EVAL_BATCH), self.per_epoch,
                                 patience=patience if plateau else None,
                                 min_steps=budget.floor if budget is not None and plateau else 0,
                                 lr_patience=max(1, patience // 2) if plateau else None,
                                 higher_is_better=task.higher_is_better)

    def steps_of(self, epochs: float) -> int:
        """Optimizer steps (fine-tuning batches) of ``epochs`` labelled epochs, rounded up."""
        return int(math.ceil(epochs * self.per_epoch))

    def budget(self, floor: int, spent: int = 0) -> Budget:
        """The budget of a labelled training of at least ``floor`` steps under the run's rule; ``spent``:
        labelled steps the arm already took (its head), taken off the cap ``baseline_max_epochs``
        (``cap_epochs``; never below the floor)."""
        s = self.settings
        if s.baseline_budget != "plateau":
            return Budget(floor, floor, s.baseline_budget, False)
        if self.data.val is None:
            return Budget(floor, floor, "plateau", False)
        return Budget(floor, max(floor, self.steps_of(s.cap_epochs) - spent), "plateau", True)

    def training(self, budget: Budget) -> dict[str, Any]:
        """The fit configuration of a labelled training under ``budget``: the fine-tuning recipe with
        cosine decay over a fixed budget, or a constant LR (halved on validation plateaus) up to the cap."""
        if budget.plateau:
            return {**self.ft, "scheduler": None, "steps": budget.cap}
        return {**self.ft, "steps": budget.floor}

    def labelled_steps(self, align_steps: int, head_steps: int, finetune_steps: int) -> int:
        """A converted arm's labelled-training steps (fine-tuning batches): head + fine-tuning, plus for a
        language model its alignment steps (they read the tokens that are also the labels), each counted
        as ``batch_size`` / ``finetune_batch_size`` fine-tuning steps (rounded up)."""
        steps = head_steps + finetune_steps
        if self.task.kind == "lm":
            steps += int(math.ceil(align_steps * self.settings.batch_size / self.settings.finetune_batch_size))
        return steps


@dataclass
class Rows:
    """The row lists of the result tables, filled as the run goes. ``s``: the task's score name."""

    s: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    stage_summary: list[dict[str, Any]] = field(default_factory=list)
    curves: list[dict[str, Any]] = field(default_factory=list)
    baselines: list[dict[str, Any]] = field(default_factory=list)
    validation: list[dict[str, Any]] = field(default_factory=list)

    def add_curve(self, phase: str, history: TrainHistory, labels: dict[str, Any]) -> None:
        """The thinned loss curve of one training phase."""
        steps, values = _thin(history.losses)
        self.curves.extend({**labels, "phase": phase, "step": int(a), "loss": float(b)}
                           for a, b in zip(steps, values, strict=True))

    def add_validation(self, phase: str, mon: ValidationMonitor | None, labels: dict[str, Any]) -> None:
        """The per-epoch validation scores of one training phase (none without a monitor)."""
        if mon is not None:
            self.validation.extend({**labels, "phase": phase, "step": a, f"val_{self.s}": b}
                                   for a, b in mon.scores)

    def tables(self) -> dict[str, pd.DataFrame]:
        """runs, stages, stage_summary, curves; baselines and validation only when they have rows (an empty
        CSV is not a table: ``simkit.load`` refuses one)."""
        tables = {"runs": pd.DataFrame(self.runs), "stages": pd.DataFrame(self.stages),
                  "stage_summary": pd.DataFrame(self.stage_summary), "curves": pd.DataFrame(self.curves)}
        for key, rows_ in (("baselines", self.baselines), ("validation", self.validation)):
            if rows_:
                tables[key] = pd.DataFrame(rows_)
        return tables
