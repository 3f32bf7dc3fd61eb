"""Validation monitoring for :func:`simkit.training.fit`: best weights, early stopping, LR halving.

A :class:`ValidationMonitor` scores the model on a held-out validation split every ``every`` steps
(typically once per epoch) through a caller-given ``evaluate()`` (the caller owns train/eval modes
and the data; the test split must never be used here). It keeps a copy of the weights with the best
score so far and can

- stop the run after ``patience`` evaluations without improvement, but never before ``min_steps``
  (the "train until the validation score stops improving, or at least N steps" rule of fair
  baselines), returning the stop reason ``"validation"``;
- halve the learning rate after ``lr_patience`` evaluations without improvement (every param group;
  its ``initial_lr`` too, so the shared LR controller's schedule keeps the reduced base).

Its whole state (scores so far, best weights, counters) is a plain dict that ``fit`` stores in every
checkpoint and restores on resume, so a resumed run stops and keeps the same weights as an
uninterrupted one. After ``fit`` returns, :meth:`restore_best` loads the best weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from simkit.errors import SimkitError


class ValidationMonitor:
    """evaluate() -> float, the validation score (higher is better unless ``higher_is_better=False``).

    every: steps between evaluations (>= 1). patience: evaluations without improvement that stop the
    run (None: never stop, only keep the best weights). min_steps: no stop before this step.
    lr_patience / lr_factor: evaluations without improvement before the LR is multiplied by
    ``lr_factor`` (None: never). min_delta: the improvement that counts (absolute, in score units).
    """

    def __init__(self, evaluate: Callable[[], float], every: int, *, patience: int | None = None,
                 min_steps: int = 0, lr_patience: int | None = None, lr_factor: float = 0.5,
                 min_delta: float = 0.0, higher_is_better: bool = True) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise SimkitError(f"`every` must be a positive integer, got {every!r}")
        for name, value in (("patience", patience), ("lr_patience", lr_patience)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise SimkitError(f"`{name}` must be a positive integer or None, got {value!r}")
        if not 0 < lr_factor < 1:
            raise SimkitError(f"`lr_factor` must be in (0, 1), got {lr_factor}")
        self.evaluate, self.every = evaluate, every
        self.patience, self.min_steps = patience, int(min_steps)
        self.lr_patience, self.lr_factor = lr_patience, lr_factor
        self.min_delta, self.sign = float(min_delta), 1.0 if higher_is_better else -1.0
        self.scores: list[tuple[int, float]] = []  # (step, validation score) of every evaluation
        self.best: float | None = None
        self.best_step = 0
        self.bad = 0  # evaluations since the last improvement
        self.lr_bad = 0  # evaluations since the last improvement or LR cut
        self.lr_cuts = 0
        self.best_state: dict[str, Tensor] | None = None

    def after_step(self, step: int, model: nn.Module, optimizer: Optimizer, last: bool = False) -> str | None:
        """Called by ``fit`` after step ``step`` (1-based); evaluates every ``every`` steps and at the
        last step (``last``). Returns ``"validation"`` when the run should stop, else None."""
        if step % self.every and not last:
            return None
        value = float(self.evaluate())
        self.scores.append((step, value))
        if self.best is None or self.sign * (value - self.best) > self.min_delta:
            self.best, self.best_step, self.bad, self.lr_bad = value, step, 0, 0
            self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            return None
        self.bad += 1
        self.lr_bad += 1
        if self.lr_patience is not None and self.lr_bad >= self.lr_patience:
            for group in optimizer.param_groups:
                group["lr"] *= self.lr_factor
                if "initial_lr" in group:
                    group["initial_lr"] *= self.lr_factor
            self.lr_cuts += 1
            self.lr_bad = 0
        if self.patience is not None and self.bad >= self.patience and step >= self.min_steps:
            return "validation"
        return None

    def restore_best(self, model: nn.Module) -> None:
        """Load the best weights seen (no-op before any evaluation)."""
        if self.best_state is not None:
            model.load_state_dict(self.best_state)

    def state_dict(self) -> dict[str, Any]:
        return {"scores": [list(s) for s in self.scores], "best": self.best, "best_step": self.best_step,
                "bad": self.bad, "lr_bad": self.lr_bad, "lr_cuts": self.lr_cuts, "best_state": self.best_state}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.scores = [(int(a), float(b)) for a, b in data["scores"]]
        self.best, self.best_step = data["best"], int(data["best_step"])
        self.bad, self.lr_bad, self.lr_cuts = int(data["bad"]), int(data["lr_bad"]), int(data["lr_cuts"])
        state = data["best_state"]
        self.best_state = None if state is None else {k: torch.as_tensor(v) for k, v in state.items()}
