"""The objects the phases of ``convert`` pass each other (see :mod:`simkit.conversion.runner`).

:class:`Sweep`: the arms asked for (schedules, metrics, guide inits, baselines, ranks) and the alignment
losses. :class:`Splits`: the task's tensors on the run's device. :class:`Fitter`: the shared-loop
training calls of a run (one checkpoint name per phase). :class:`RunContext`: what every phase reads
(settings, task, splits, fitter, timer, the fine-tuning recipe). :class:`Rows`: the result tables as
they fill, with one method per kind of row.
"""

from __future__ import annotations

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

    def monitor(self, model: nn.Module) -> ValidationMonitor | None:
        """Scores ``model`` on the validation split once per epoch (None without a validation split)."""
        if self.data.val is None:
            return None
        val_x, val_t = self.data.val
        task = self.task
        return ValidationMonitor(lambda: score(model, task, val_x, val_t, EVAL_BATCH), self.per_epoch,
                                 patience=None, min_steps=0, lr_patience=None,
                                 higher_is_better=task.higher_is_better)


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
