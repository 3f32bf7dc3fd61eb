"""What a training run is told (:class:`TrainConfig`) and what it returns (:class:`TrainHistory`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from simkit.errors import SimkitError
from simkit.options import Choice, Flag, Integer, Optional, Real, Settings, Text, option, rule

OPTIMIZERS = ("adamw", "adam", "sgd")


@dataclass(frozen=True)
class TrainConfig(Settings):
    """Settings of one call of :func:`simkit.training.fit`, each declared once (``simkit.options``; library
    only, no flag): steps / epochs give the length (at least one; with both, the first reached stops it)."""

    steps: int | None = option(None, Optional(Integer(ge=0)), "Optimizer steps of the run.", cli=False)
    epochs: float | None = option(None, Optional(Real(ge=0)), "Epochs of the run.", cli=False)
    batch_size: int = option(128, Integer(ge=1), "Rows per (global) batch; the last batch of an epoch may be "
                             "smaller.", cli=False)
    lr: float = option(1e-3, Real(), "Learning rate.", cli=False)
    optimizer: str = option("adamw", Choice(OPTIMIZERS), "adamw, adam or sgd.", cli=False)
    weight_decay: float = option(0.0, Real(), "Weight decay.", cli=False)
    momentum: float = option(0.9, Real(), "Momentum (sgd only).", cli=False)
    grad_clip: float | None = option(None, Optional(Real()), "Max L2 norm of the gradients (None: no clipping).",
                                     cli=False)
    seed: int = option(0, Integer(), "Seeds Python, numpy and torch at the start of a fresh run, and the "
                       "per-epoch shuffles.", cli=False)
    checkpoint_every: int = option(0, Integer(ge=0), "Steps between checkpoints (0 = only on SIGINT/SIGTERM "
                                   "and at the end).", cli=False)
    plateau_window: int = option(0, Integer(ge=0), "Steps of the loss EMA and between plateau checks (0 = off; "
                                 "the paper uses 500).", cli=False)
    plateau_factor: float = option(0.5, Real(gt=0, lt=1), "LR multiplier on a plateau (0.5 halves it).", cli=False)
    plateau_threshold: float = option(1e-3, Real(), "Relative improvement of the EMA over its best that counts "
                                      "as progress [ours].", cli=False)
    stop_loss: float | None = option(None, Optional(Real()), "Stop when the smoothed loss falls below it.",
                                     cli=False)
    min_lr: float | None = option(None, Optional(Real()), "Stop when the LR falls below it.", cli=False)
    scheduler: str | None = option(None, Optional(Choice(("cosine",))), "None or cosine (decay to 0 over the "
                                   "run's steps, times the plateau scale).", cli=False)
    deterministic: bool = option(True, Flag(), "torch.use_deterministic_algorithms(True, warn_only=True) during "
                                 "the run.", cli=False)
    progress: bool = option(True, Flag(), "Show a rich progress bar.", cli=False)
    description: str = option("train", Text(), "The progress bar's label.", cli=False)

    @rule
    def _has_a_length(self) -> None:
        """A run needs ``steps`` or ``epochs``."""
        if self.steps is None and self.epochs is None:
            raise SimkitError("training needs a length; set `steps` or `epochs` (TrainConfig)")

    def total_steps(self, steps_per_epoch: int) -> int:
        """The step budget: ``steps``, ``ceil(epochs * steps_per_epoch)``, or the smaller of the two."""
        budgets = []
        if self.steps is not None:
            budgets.append(int(self.steps))
        if self.epochs is not None:
            budgets.append(int(math.ceil(self.epochs * steps_per_epoch)))
        return min(budgets)



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
