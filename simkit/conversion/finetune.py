"""After alignment: head-first training (a linear probe on the converted features), full fine-tuning,
and the training calls of the two baselines (scratch, logit distillation with a label term).

The prototype (shared/spec/not-calibration.md) showed the guide's head is useless after alignment
(CKA ignores rotation and scale), so the head is re-initialised and trained alone on the frozen
converted features first; its score is the reported linear-probe score. Then everything trains.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.conversion.modules import reinitialise
from simkit.conversion.task import Inputs, Task, logits_of, rows, run_model, take
from simkit.forward import eval_mode, modes_kept
from simkit.layers import select_output
from simkit.training import TrainHistory

FitFn = Callable[..., TrainHistory]


@torch.no_grad()
def head_features(model: nn.Module, head: str, inputs: Inputs, batch_size: int) -> Tensor:
    """Eval-mode inputs of module ``head`` for every sample: (n, *head_in).

    A pre-hook on the head (its *input*, which ``simkit.layers.record_layers`` does not record)."""
    feats: list[Tensor] = []
    module = model.get_submodule(head)
    handle = module.register_forward_pre_hook(
        lambda m, a: feats.append(select_output(a, layer=head).detach().clone()))
    try:
        with eval_mode(model):
            for start in range(0, rows(inputs), batch_size):
                run_model(model, take(inputs, slice(start, start + batch_size)))
    finally:
        handle.remove()
    return torch.cat(feats)


def train_head(model: nn.Module, head: str, task: Task, train: tuple[Inputs, Tensor],
               test: tuple[Inputs, Tensor], fit_fn: FitFn, *, batch_size: int,
               seed: int) -> tuple[TrainHistory, float]:
    """Re-initialise the head and train it alone on the frozen model's features (cached once).

    Returns (history, probe score on ``test``). Only the head's parameters change.
    """
    module = model.get_submodule(head)
    reinitialise(module, seed)
    train_x = head_features(model, head, train[0], batch_size)
    test_x = head_features(model, head, test[0], batch_size)
    for p in model.parameters():
        p.requires_grad_(False)
    for p in module.parameters():
        p.requires_grad_(True)
    targets = train[1]

    def loss_fn(batch: tuple[Tensor, ...]) -> Tensor:
        (idx,) = batch
        return task.loss(module(train_x[idx]), targets[idx])

    with modes_kept(module):
        module.train()
        history = fit_fn(module, loss_fn, (torch.arange(len(train_x)),), list(module.parameters()))
    return history, score(module, task, test_x, test[1], batch_size)


def score(model: nn.Module, task: Task, inputs: Inputs, target: Tensor, batch_size: int) -> float:
    """Accuracy or perplexity of ``model`` in eval mode (modes restored)."""
    with eval_mode(model):
        return task.evaluate(lambda x: run_model(model, x), inputs, target, batch_size)


def train_task(model: nn.Module, task: Task, train: tuple[Inputs, Tensor], fit_fn: FitFn,
               monitor: Any = None) -> TrainHistory:
    """Train every parameter of ``model`` on the task loss (train mode during the run).

    monitor: a :class:`simkit.training.ValidationMonitor` passed to ``fit``; its best weights are
    loaded at the end."""
    inputs, targets = train
    for p in model.parameters():
        p.requires_grad_(True)

    def loss_fn(batch: tuple[Tensor, ...]) -> Tensor:
        (idx,) = batch
        return task.loss(logits_of(run_model(model, take(inputs, idx))), targets[idx])

    model.train()
    history = fit_fn(model, loss_fn, (torch.arange(rows(inputs)),), list(model.parameters()),
                     **({"monitor": monitor} if monitor is not None else {}))
    model.eval()
    if monitor is not None:
        monitor.restore_best(model)
    return history


def distill(student: nn.Module, task: Task, train: tuple[Inputs, Tensor], guide_logits: Tensor, fit_fn: FitFn,
            temperature: float = 4.0, alpha: float = 0.5, monitor: Any = None) -> TrainHistory:
    """Logit distillation as the literature uses it: ``alpha``·CE(student, labels) + (1 − ``alpha``)·T²·
    KL(softmax(guide/T) ‖ softmax(student/T)) on the training rows ``train`` (inputs, targets);
    ``guide_logits`` (n, ...) are the guide's on those rows. ``alpha`` 0 is label-free distillation
    (an untrained guide then gives no help from labels), 1 is training on the labels alone.
    monitor: as for :func:`train_task` (the validation score uses labels only to choose the epoch)."""
    inputs, targets = train
    for p in student.parameters():
        p.requires_grad_(True)
    t, a = float(temperature), float(alpha)

    def loss_fn(batch: tuple[Tensor, ...]) -> Tensor:
        (idx,) = batch
        student_logits = logits_of(run_model(student, take(inputs, idx)))
        teacher = guide_logits[idx]
        v = student_logits.shape[-1]
        kl = F.kl_div(F.log_softmax(student_logits.reshape(-1, v) / t, -1),
                      F.log_softmax(teacher.reshape(-1, v) / t, -1),
                      reduction="batchmean", log_target=True) * t * t
        if a == 0:
            return kl
        return a * task.loss(student_logits, targets[idx]) + (1 - a) * kl

    student.train()
    history = fit_fn(student, loss_fn, (torch.arange(rows(inputs)),), list(student.parameters()),
                     **({"monitor": monitor} if monitor is not None else {}))
    student.eval()
    if monitor is not None:
        monitor.restore_best(student)
    return history
