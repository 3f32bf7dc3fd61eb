"""Recovery after post-training: keep each run's slope pattern, drop the penalty, fine-tune the weights.

Post-training trades accuracy for linearity under the penalty ω·Σ(|1 − α| + ε)^0.5. Recovery asks how
much of that accuracy the weights alone win back once the pattern is fixed: every slope α stays
exactly as post-training left it (units that are linear stay linear, the others keep their α: the
slopes are not trained and are not in the optimizer), and the other weights are fine-tuned with
cross-entropy alone. It is one named stage of the shared training loop (``<run stage>_recover``), so it
is checkpointed and resumed like the post-training runs; its batch order comes from
``derive_seed(seed, "recover")``.

Two options make recovery compare network *shapes* rather than partial slopes:

* :func:`reset_shape`: units at α = 1 stay linear and every other α is set to exactly 0 (a ReLU), so a
  unit post-training left at α = 0.89 is a ReLU again, not a nearly linear unit counted as nonlinear;
* :func:`recover_best`: recovery scores a held-out validation split once per epoch
  (:class:`~simkit.training.monitor.ValidationMonitor`, checkpointed with the run) and keeps the best
  epoch's weights, so the recovered accuracy does not depend on where a fixed budget happens to end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.linearization.slope import slope_modules
from simkit.seeding import derive_seed
from simkit.training import TrainConfig, TrainHistory, evaluate_accuracy, fit
from simkit.training.monitor import ValidationMonitor


def recover(model: nn.Module, x: Tensor, y: Tensor, *, epochs: float, lr: float = 1e-3, batch_size: int = 128,
            seed: int = 0, run_dir: str | Path | None = None, name: str = "recover", resume: bool = False,
            progress: bool = False, description: str | None = None,
            callback: Callable[[int, float], None] | None = None) -> TrainHistory:
    """Fine-tune the weights of a post-trained swapped model with cross-entropy, slopes fixed.

    model: a network whose ReLUs are SlopeReLUs (after ``post_train``); x: (n, ...) inputs, y: (n,)
    labels. Every ``alpha`` keeps its value bit for bit (its requires_grad is off during recovery and
    restored afterwards); every other trainable parameter is trained with AdamW (``lr``, no weight
    decay). run_dir / name: the checkpoint ``<run_dir>/checkpoints/<name>.pt`` (None: no files).
    The model is in train mode while training and in eval mode afterwards. Returns the TrainHistory.
    """
    return _fine_tune(model, x, y, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, run_dir=run_dir,
                      name=name, resume=resume, progress=progress, description=description, callback=callback)


@dataclass(frozen=True)
class Recovery:
    """A recovery that kept its best validation epoch: the history, the step whose weights were kept
    (a multiple of the steps per epoch, or the last step) and its validation accuracy."""

    history: TrainHistory
    best_step: int
    val_accuracy: float


def recover_best(model: nn.Module, x: Tensor, y: Tensor, validation: tuple[Tensor, Tensor], *, epochs: float,
                 batch_size: int = 128, **options: Any) -> Recovery:
    """:func:`recover` on ``x (n, ...)``, ``y (n,)``, scoring ``validation = (x_val, y_val)`` (accuracy, eval
    mode) after every epoch and at the last step, and leaving ``model`` with the best-scoring weights
    (the first of equal scores). ``options``: :func:`recover`'s other keywords."""
    x_val, y_val = validation
    monitor = ValidationMonitor(lambda: evaluate_accuracy(model, x_val, y_val), -(-len(x) // batch_size))
    history = _fine_tune(model, x, y, epochs=epochs, batch_size=batch_size, monitor=monitor, **options)
    monitor.restore_best(model)
    model.eval()
    return Recovery(history, monitor.best_step, float(monitor.best if monitor.best is not None else float("nan")))


def _fine_tune(model: nn.Module, x: Tensor, y: Tensor, *, epochs: float, lr: float = 1e-3, batch_size: int = 128,
               seed: int = 0, run_dir: str | Path | None = None, name: str = "recover", resume: bool = False,
               progress: bool = False, description: str | None = None,
               callback: Callable[[int, float], None] | None = None, monitor: Any = None) -> TrainHistory:
    """The recovery stage itself (:func:`recover`'s contract; ``monitor`` passed on to ``fit``)."""
    slopes = [m for _, m in slope_modules(model)]
    alpha_ids = {id(m.alpha) for m in slopes}
    weights = [p for p in model.parameters() if p.requires_grad and id(p) not in alpha_ids]
    optimizer = torch.optim.AdamW([{"params": weights, "lr": lr, "weight_decay": 0.0}])
    config = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, seed=derive_seed(seed, "recover"),
                         progress=progress, description=name if description is None else description)

    def loss_fn(batch: tuple[Tensor, ...]) -> Tensor:
        xb, yb = batch
        return F.cross_entropy(model(xb), yb)

    trainable = [m.alpha.requires_grad for m in slopes]
    for module in slopes:
        module.alpha.requires_grad_(False)
    model.train()
    try:
        return fit(model, loss_fn, (x, y), config, optimizer=optimizer, run_dir=run_dir, name=name,
                   resume=resume, callback=callback, monitor=monitor)
    finally:
        model.eval()
        for module, flag in zip(slopes, trainable, strict=True):
            module.alpha.requires_grad_(flag)


@torch.no_grad()
def reset_shape(model: nn.Module) -> int:
    """Fix the shape post-training found: every slope at exactly 1 (as the forward reads it) stays 1 and is
    marked frozen; every other α is set to exactly 0, so that unit is a ReLU again. Returns how many
    slopes were reset to 0 (those already at 0 included)."""
    reset = 0
    for _, module in slope_modules(model):
        linear = module.effective_alpha() == 1
        module.frozen |= linear
        module.alpha.copy_(torch.where(linear, torch.ones_like(module.alpha), torch.zeros_like(module.alpha)))
        reset += int((~linear).sum())
    return reset


__all__ = ["Recovery", "recover", "recover_best", "reset_shape"]
