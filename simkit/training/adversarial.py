"""Adversarial (PGD) training and robust accuracy for classifiers (Madry et al. 2018).

* :func:`pgd_attack`: L∞ projected gradient ascent on the cross-entropy, ``x (b, ...) → x_adv (b, ...)``
  with ``‖x_adv − x‖∞ ≤ eps`` and every value inside ``value_range``;
* :func:`train_adversarial`: cross-entropy on PGD examples of each batch, through the one training loop
  (:func:`simkit.training.fit`: checkpoints, bit-identical resume, progress);
* :func:`robust_accuracy`: top-1 accuracy on PGD examples.

The attack starts at ``x`` itself (no random start), so a training step depends on the batch alone and
resume stays bit-identical. The attack runs in the model's current train/eval mode and never changes
parameters or their ``.grad``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.errors import SimkitError, check_real
from simkit.forward import eval_mode, modes_kept
from simkit.training.config import TrainConfig, TrainHistory
from simkit.training.loop import fit

if TYPE_CHECKING:
    from simkit.data import Dataset


def check_attack(eps: float, steps: int, step_size: float | None) -> float:
    """SimkitError naming the bad argument; returns the step size (default 2.5·eps/steps)."""
    check_real("eps", eps, 0)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise SimkitError(f"`steps` must be an integer >= 1, got {steps!r}")
    if step_size is None:
        return 2.5 * eps / steps
    check_real("step_size", step_size, 0, strict=True)
    return float(step_size)


def pgd_attack(model: nn.Module, x: Tensor, y: Tensor, *, eps: float, steps: int = 5,
               step_size: float | None = None, value_range: tuple[float, float] = (0.0, 1.0)) -> Tensor:
    """L∞ PGD: ``steps`` signed-gradient ascent steps of ``step_size`` (default 2.5·eps/steps) on the
    cross-entropy of ``model(x_adv)`` to ``y (b,)``, each followed by projection onto the eps-ball around
    ``x (b, ...)`` and a clamp to ``value_range``. Returns ``x_adv (b, ...)`` detached."""
    step = check_attack(eps, steps, step_size)
    lo, hi = value_range
    x = x.detach()
    adv = x.clone()
    if eps == 0:
        return adv
    for _ in range(steps):
        adv.requires_grad_(True)
        loss = F.cross_entropy(model(adv), y)
        (grad,) = torch.autograd.grad(loss, adv)
        with torch.no_grad():
            adv = adv + step * grad.sign()
            adv = torch.minimum(torch.maximum(adv, x - eps), x + eps).clamp(lo, hi)
    return adv.detach()


def train_adversarial(model: nn.Module, data: Dataset, config: TrainConfig, *, eps: float, steps: int = 5,
                      step_size: float | None = None, value_range: tuple[float, float] | None = None,
                      run_dir: str | Path | None = None, name: str = "adversarial",
                      resume: bool = False) -> TrainHistory:
    """Train ``model`` (inputs (n, ...) → logits (n, classes)) with cross-entropy on PGD examples of
    every batch (:func:`pgd_attack`, ``eps``/``steps``/``step_size``; ``value_range`` default: the
    data's ``info["value_range"]``, else (0, 1)). Checkpoints as ``fit`` does under ``run_dir/name``.
    The model is in train mode while training; afterwards every submodule is back in its earlier mode."""
    check_attack(eps, steps, step_size)
    if data.labels is None:
        raise SimkitError(f"data {data.spec!r} has no labels; adversarial training needs a labelled data spec")
    if isinstance(data.inputs, dict):
        raise SimkitError("adversarial training takes tensor inputs, not tokenised text")
    if value_range is None:
        given = data.info.get("value_range")
        value_range = (float(given[0]), float(given[1])) if given is not None else (0.0, 1.0)
    bounds = value_range

    def loss_fn(batch: tuple[Tensor, ...]) -> Tensor:
        x, y = batch
        adv = pgd_attack(model, x, y, eps=eps, steps=steps, step_size=step_size, value_range=bounds)
        return F.cross_entropy(model(adv), y)

    with modes_kept(model):
        model.train()
        return fit(model, loss_fn, (data.inputs, data.labels), config, run_dir=run_dir, name=name, resume=resume)


def robust_accuracy(model: nn.Module, x: Tensor, y: Tensor, *, eps: float, steps: int = 10,
                    step_size: float | None = None, value_range: tuple[float, float] = (0.0, 1.0),
                    batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` (in eval mode) on PGD examples of ``x (n, ...)``, ``y (n,)``."""
    if len(x) != len(y) or not len(x):
        raise SimkitError(f"`x` and `y` must be non-empty and of one length, got {len(x)} and {len(y)}")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    correct = 0
    with eval_mode(model):
        for start in range(0, len(x), batch_size):
            xb, yb = x[start:start + batch_size].to(device), y[start:start + batch_size].to(device)
            adv = pgd_attack(model, xb, yb, eps=eps, steps=steps, step_size=step_size, value_range=value_range)
            with torch.no_grad():
                correct += int((model(adv).argmax(-1) == yb).sum())
    return correct / len(x)
