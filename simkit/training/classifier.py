"""Classification helpers on top of :func:`fit`: training with cross-entropy, accuracy, BN recalibration."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.errors import SimkitError
from simkit.forward import eval_mode, modes_kept
from simkit.training.config import TrainConfig, TrainHistory
from simkit.training.loop import fit

if TYPE_CHECKING:
    from simkit.data import Dataset


def _device(model: nn.Module) -> torch.device:
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def train_classifier(model: nn.Module, data: Dataset, config: TrainConfig,
                     run_dir: str | Path | None = None, name: str = "classifier",
                     resume: bool = False, **fit_kwargs) -> TrainHistory:
    """Train ``model`` (inputs (n, ...) → logits (n, classes)) with cross-entropy on ``data.labels``.

    The model is in train mode during training; afterwards every submodule is back in its own earlier
    mode (a frozen part that was in eval mode stays so).
    Extra keyword arguments go to :func:`fit` (params, optimizer, callback, graft_log).
    """
    if data.labels is None:
        raise SimkitError(f"data {data.spec!r} has no labels; train_classifier needs a labelled data spec")
    if isinstance(data.inputs, dict):
        raise SimkitError("train_classifier takes tensor inputs, not tokenised text; use fit with your own loss")

    def loss_fn(batch: tuple[Tensor, ...]) -> Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    with modes_kept(model):
        model.train()
        return fit(model, loss_fn, (data.inputs, data.labels), config, run_dir=run_dir, name=name,
                   resume=resume, **fit_kwargs)


@torch.no_grad()
def evaluate_accuracy(model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` on inputs x (n, ...) and labels y (n,), in eval mode; afterwards every
    submodule is back in its own earlier mode (``simkit.forward.eval_mode``)."""
    if len(x) != len(y):
        raise SimkitError(f"inputs `x` and labels `y` differ in length ({len(x)} vs {len(y)})")
    if len(x) == 0:
        raise SimkitError("evaluate_accuracy got zero samples")
    device = _device(model)
    correct = 0
    with eval_mode(model):
        for start in range(0, len(x), batch_size):
            logits = model(x[start:start + batch_size].to(device))
            correct += int((logits.argmax(dim=-1).cpu() == y[start:start + batch_size].cpu()).sum())
    return correct / len(x)


@torch.no_grad()
def recalibrate_batchnorm(model: nn.Module, inputs: Tensor, batch_size: int) -> None:
    """Recompute every BatchNorm's running mean/var on ``inputs`` (n, ...); nothing else changes.

    Like ``torch.optim.swa_utils.update_bn``: running stats reset, momentum None (a cumulative
    average over all batches), forward passes in train mode without gradient, then every module's
    mode and momentum are restored. Does nothing when the model has no BatchNorm.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    if batch_size < 1:
        raise SimkitError(f"`batch_size` must be >= 1, got {batch_size}")
    momenta = {m: m.momentum for m in norms}
    device = _device(model)
    cuda = [device] if device.type == "cuda" else []
    try:  # fork_rng: dropout in train mode must not move the global RNG
        with modes_kept(model), torch.random.fork_rng(devices=cuda):
            for m in norms:
                m.reset_running_stats()
                m.momentum = None
            model.train()
            for start in range(0, len(inputs), batch_size):
                model(inputs[start:start + batch_size].to(device))
    finally:
        for m, momentum in momenta.items():
            m.momentum = momentum
