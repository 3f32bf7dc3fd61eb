"""What a training run is told (:class:`TrainConfig`) and what it returns (:class:`TrainHistory`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from simkit.errors import SimkitError

OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULERS = (None, "cosine")


@dataclass
class TrainConfig:
    """Settings of one call of :func:`simkit.training.fit`.

    steps / epochs: length of the run; give at least one (with both, the first reached stops it).
    batch_size: rows per (global) batch; the last batch of an epoch may be smaller.
    lr, optimizer (adamw | adam | sgd), weight_decay, momentum (sgd only), grad_clip (max L2 norm).
    seed: seeds Python, numpy and torch at the start of a fresh run, and the per-epoch shuffles.
    checkpoint_every: steps between checkpoints (0 = only on SIGINT/SIGTERM and at the end).
    plateau_window: steps of the loss EMA and between plateau checks (0 = off; the paper uses 500).
    plateau_factor: LR multiplier on a plateau (0.5 halves it).
    plateau_threshold: relative improvement of the EMA over its best that counts as progress [ours].
    stop_loss: stop when the smoothed loss falls below it. min_lr: stop when the LR falls below it.
    scheduler: None or "cosine" (cosine decay to 0 over the run's steps, times the plateau scale).
    deterministic: ``torch.use_deterministic_algorithms(True, warn_only=True)`` during the run.
    progress: show a rich progress bar. description: its label.
    """

    steps: int | None = None
    epochs: float | None = None
    batch_size: int = 128
    lr: float = 1e-3
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    momentum: float = 0.9
    grad_clip: float | None = None
    seed: int = 0
    checkpoint_every: int = 0
    plateau_window: int = 0
    plateau_factor: float = 0.5
    plateau_threshold: float = 1e-3
    stop_loss: float | None = None
    min_lr: float | None = None
    scheduler: str | None = None
    deterministic: bool = True
    progress: bool = True
    description: str = "train"

    def validate(self) -> None:
        """Raise SimkitError for settings that cannot run."""
        if self.steps is None and self.epochs is None:
            raise SimkitError("training needs a length; set `steps` or `epochs` (TrainConfig)")
        if self.steps is not None and self.steps < 0:
            raise SimkitError(f"`steps` must be >= 0, got {self.steps}")
        if self.epochs is not None and not self.epochs >= 0:
            raise SimkitError(f"`epochs` must be >= 0, got {self.epochs}")
        if self.batch_size < 1:
            raise SimkitError(f"`batch_size` must be >= 1, got {self.batch_size}")
        if self.optimizer not in OPTIMIZERS:
            raise SimkitError(f"unknown optimizer {self.optimizer!r} (`optimizer`); use one of {', '.join(OPTIMIZERS)}")
        if self.scheduler not in SCHEDULERS:
            raise SimkitError(f"unknown scheduler {self.scheduler!r} (`scheduler`); use None or 'cosine'")
        if not 0 < self.plateau_factor < 1:
            raise SimkitError(f"`plateau_factor` must be in (0, 1), got {self.plateau_factor}")
        if self.plateau_window < 0 or self.checkpoint_every < 0:
            raise SimkitError("`plateau_window` and `checkpoint_every` must be >= 0")

    def total_steps(self, steps_per_epoch: int) -> int:
        """The step budget: ``steps``, ``ceil(epochs * steps_per_epoch)``, or the smaller of the two."""
        budgets = []
        if self.steps is not None:
            budgets.append(int(self.steps))
        if self.epochs is not None:
            budgets.append(int(math.ceil(self.epochs * steps_per_epoch)))
        return min(budgets)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainHistory:
    """Per-step record of a run.

    losses[i], lrs[i]: loss and learning rate of step i + 1 (steps count from 1).
    steps: steps done; stopped: why the run ended ("steps", "epochs", "stop_loss", "min_lr").
    """

    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    steps: int = 0
    stopped: str = ""

    def to_frame(self) -> pd.DataFrame:
        """DataFrame(step, loss, lr), one row per step."""
        return pd.DataFrame({"step": range(1, len(self.losses) + 1), "loss": self.losses, "lr": self.lrs})

    def to_dict(self) -> dict[str, Any]:
        return {"losses": list(self.losses), "lrs": list(self.lrs), "steps": self.steps, "stopped": self.stopped}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainHistory:
        return cls(losses=list(data["losses"]), lrs=list(data["lrs"]), steps=int(data["steps"]),
                   stopped=str(data["stopped"]))
