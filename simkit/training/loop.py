"""The one training loop every simkit runner uses: :func:`fit`.

What it guarantees:
- seeded and (optionally) deterministic; batches are index batches of the data tensors, reshuffled
  each epoch by a generator seeded from (seed, epoch), so the data position is just the step count;
- per-step metrics appended to ``run_dir/<name>.log.csv``; a rich progress bar (``progress=False``
  turns it off);
- checkpoints (atomic) every ``checkpoint_every`` steps, on SIGINT/SIGTERM (the current step
  finishes, the checkpoint is written, then KeyboardInterrupt / SystemExit(143) is raised) and at the
  end; ``resume=True`` continues an unfinished checkpoint bit-identically, and a finished one restores
  the final state and returns its history without training (multi-stage runners resume stage by stage);
- plateau LR control and stop rules (see :mod:`simkit.training.plateau`);
- under torchrun each rank computes its contiguous slice of every global batch and the gradients are
  summed with weights rows/global-batch by one all_reduce per parameter. DistributedDataParallel's
  wrapper is deliberately not used: ``fit`` trains arbitrary parameter sets of arbitrary modules
  (stitches, grafted blocks, frozen guides) that change between stages, which DDP would have to re-wrap
  at every change; the explicit all_reduce gives the same gradients and keeps checkpoints wrapper-free.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from simkit import distributed as dist
from simkit.errors import SimkitError
from simkit.progress import progress_bar
from simkit.seeding import seed_everything
from simkit.training.config import TrainConfig, TrainHistory
from simkit.training.plateau import LRController
from simkit.training.state import (
    MetricsLog,
    checkpoint_path,
    load_checkpoint,
    log_path,
    rng_state,
    save_checkpoint,
    set_rng_state,
)

# Settings that may differ between a run and its resumption without changing its numbers.
_RESUME_FREE = ("progress", "description", "checkpoint_every")


def build_optimizer(params: Iterable[nn.Parameter], config: TrainConfig) -> Optimizer:
    """The optimizer ``config.optimizer`` names (adamw | adam | sgd) over ``params``."""
    config.validate()
    params = list(params)
    if not params:
        raise SimkitError("nothing to train: no parameter has requires_grad=True; unfreeze some or pass `params`")
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)


def epoch_permutation(n: int, seed: int, epoch: int) -> Tensor:
    """The sample order of ``epoch``: a permutation (n,) int64 from a generator seeded by (seed, epoch)."""
    entropy = np.random.SeedSequence([seed % 2**63, epoch]).generate_state(2, dtype=np.uint64)
    gen = torch.Generator().manual_seed(int(entropy[0] % (2**63 - 1)))
    return torch.randperm(n, generator=gen)


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> Tensor:
    """Row indices (b,) of global batch ``step`` (0-based): epoch = step // ceil(n / batch_size)."""
    per_epoch = -(-n // batch_size)
    epoch, i = divmod(step, per_epoch)
    return epoch_permutation(n, seed, epoch)[i * batch_size:(i + 1) * batch_size]


def read_graft_log(run_dir: str | Path, name: str) -> list[dict[str, Any]]:
    """The graft log records stored in the checkpoint ``name`` of ``run_dir`` (empty when none)."""
    return list(load_checkpoint(checkpoint_path(run_dir, name)).get("graft_log") or [])


class _StopSignals:
    """While active, SIGINT/SIGTERM only set a flag (the loop checkpoints and stops after the step).

    A second signal restores the previous handlers and interrupts at once.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            self._restore()
            raise KeyboardInterrupt
        self.received = signum

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __exit__(self, *exc: Any) -> None:
        self._restore()

    def raise_if_received(self) -> None:
        if self.received == signal.SIGTERM:
            raise SystemExit(128 + signal.SIGTERM)
        if self.received is not None:
            raise KeyboardInterrupt


class _Deterministic:
    """``torch.use_deterministic_algorithms(True, warn_only=True)`` for the duration, then restored."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self) -> None:
        self._prev = (torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled())
        if self.enabled:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=True)

    def __exit__(self, *exc: Any) -> None:
        torch.use_deterministic_algorithms(self._prev[0], warn_only=self._prev[1])


def _progress(config: TrainConfig):
    from rich.progress import TextColumn

    return progress_bar(config.progress, TextColumn("loss {task.fields[loss]}"), transient=False)


def _check_data(data: Sequence[Tensor]) -> int:
    if isinstance(data, Tensor):
        raise SimkitError("fit expects data as a tuple of tensors, e.g. (inputs, labels); wrap one tensor as (x,)")
    if not data:
        raise SimkitError("fit got no data tensors; pass `data` as a tuple (inputs, ...)")
    n = len(data[0])
    for t in data:
        if len(t) != n:
            raise SimkitError(f"data tensors differ in length ({[len(t) for t in data]}); give them the same first axis")
    if n == 0:
        raise SimkitError("fit got zero samples; check the data spec or `n`")
    return n


def _reduce_gradients(params: list[nn.Parameter], weight: float) -> None:
    """Global gradient = Σ_ranks weight_r · local gradient_r (weight_r = local rows / global rows)."""
    for p in params:
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        grad.mul_(weight)
        p.grad = dist.all_reduce_sum(grad)


@dataclass
class _Run:
    """The fixed parts of one :func:`fit` call: what is trained on what, for how many steps, under which
    LR controller, and where (and whether: ``writer``, the main process) it checkpoints and logs."""

    model: nn.Module
    loss_fn: Callable[[tuple[Tensor, ...]], Tensor]
    data: Sequence[Tensor]
    config: TrainConfig
    optimizer: Optimizer
    trained: list[nn.Parameter]
    device: torch.device
    n: int
    per_epoch: int
    total: int
    controller: LRController
    run_dir: str | Path | None
    name: str
    ckpt: Path | None
    writer: bool
    graft_log: Any
    callback: Callable[[int, float], None] | None
    monitor: Any


def _new_run(model: nn.Module, loss_fn: Callable[[tuple[Tensor, ...]], Tensor], data: Sequence[Tensor],
             config: TrainConfig, params: Iterable[nn.Parameter] | None, optimizer: Optimizer | None,
             run_dir: str | Path | None, name: str, resume: bool, graft_log: Any,
             callback: Callable[[int, float], None] | None, monitor: Any) -> _Run:
    """Check ``fit``'s arguments and build its optimizer (unless given) and LR controller."""
    config.validate()
    n = _check_data(data)
    if resume and run_dir is None:
        raise SimkitError("resume needs a run directory; pass `run_dir` (where the interrupted run wrote)")
    if optimizer is None:
        optimizer = build_optimizer(params if params is not None else
                                    (p for p in model.parameters() if p.requires_grad), config)
    trained = [p for group in optimizer.param_groups for p in group["params"]]
    per_epoch = -(-n // config.batch_size)
    total = config.total_steps(per_epoch)
    controller = LRController(window=config.plateau_window, factor=config.plateau_factor,
                              threshold=config.plateau_threshold, stop_loss=config.stop_loss,
                              min_lr=config.min_lr, scheduler=config.scheduler, total_steps=total)
    return _Run(model=model, loss_fn=loss_fn, data=data, config=config, optimizer=optimizer, trained=trained,
                device=trained[0].device if trained else torch.device("cpu"), n=n, per_epoch=per_epoch,
                total=total, controller=controller, run_dir=run_dir, name=name,
                ckpt=checkpoint_path(run_dir, name) if run_dir is not None else None,
                writer=dist.is_main_process(), graft_log=graft_log, callback=callback, monitor=monitor)


def _payload(run: _Run, step: int, history: TrainHistory, finished: bool) -> dict[str, Any]:
    """The checkpoint of ``run`` after ``step`` steps: every state a resumption needs."""
    graft_log = run.graft_log
    log = graft_log.to_list() if hasattr(graft_log, "to_list") else list(graft_log or [])
    return {"name": run.name, "finished": finished, "step": step, "epoch": step // run.per_epoch,
            "batch_in_epoch": step % run.per_epoch, "model": run.model.state_dict(),
            "optimizer": run.optimizer.state_dict(), "controller": run.controller.state_dict(),
            "rng": rng_state(), "history": history.to_dict(), "config": run.config.to_dict(),
            "graft_log": log, "monitor": run.monitor.state_dict() if run.monitor is not None else None}


def _checkpoint(run: _Run, step: int, history: TrainHistory, finished: bool) -> None:
    """Write the checkpoint (main process only; nothing without a run directory)."""
    if run.ckpt is not None and run.writer:
        save_checkpoint(run.ckpt, _payload(run, step, history, finished))


def _start(run: _Run, resume: bool) -> tuple[TrainHistory, int, bool]:
    """(history, step, finished): restored from the checkpoint when resuming and there is one, else a
    fresh start with every RNG seeded from ``config.seed``."""
    if not (resume and run.ckpt is not None and run.ckpt.is_file()):
        seed_everything(run.config.seed)
        return TrainHistory(), 0, False
    saved = load_checkpoint(run.ckpt)
    _check_resumable(saved, run.config, run.ckpt)
    _restore(run.model, run.optimizer, run.controller, saved, run.ckpt)
    if run.monitor is not None:
        if saved.get("monitor") is None:
            raise SimkitError(f"{run.ckpt} was made without a validation monitor; start over without `resume`")
        run.monitor.load_state_dict(saved["monitor"])
    return TrainHistory.from_dict(saved["history"]), int(saved["step"]), bool(saved["finished"])


def _record(run: _Run, history: TrainHistory, log: MetricsLog, step: int, loss: float) -> None:
    """Append step ``step``'s loss and LR to the history and (main process) the metrics log."""
    lr = run.optimizer.param_groups[0]["lr"]
    history.losses.append(loss)
    history.lrs.append(lr)
    history.steps = step
    if run.writer:
        log.write(step, loss, lr)


def _control(run: _Run, history: TrainHistory, step: int, loss: float) -> None:
    """Let the LR controller see the loss and adjust the LR; a stop rule or the monitor may stop the run
    (``history.stopped``)."""
    run.controller.observe(loss, step)
    run.controller.apply(run.optimizer, step)
    history.stopped = run.controller.stop_reason(run.optimizer) or ""
    if run.monitor is not None:
        reason = run.monitor.after_step(step, run.model, run.optimizer, last=step >= run.total)
        history.stopped = history.stopped or reason or ""


def _after_step(run: _Run, history: TrainHistory, step: int, loss: float, signals: _StopSignals) -> None:
    """The periodic checkpoint, the callback, then a checkpoint and stop when a signal came."""
    every = run.config.checkpoint_every
    if every and step % every == 0 and step < run.total:
        _checkpoint(run, step, history, finished=False)
    if run.callback is not None:
        run.callback(step, loss)
    if signals.received is not None:
        _checkpoint(run, step, history, finished=False)
        signals.raise_if_received()


def _train(run: _Run, history: TrainHistory, step: int) -> int:
    """Train from ``step`` until the last step or a stop rule; returns the step reached."""
    config = run.config
    log = MetricsLog(log_path(run.run_dir, run.name) if run.run_dir is not None and run.writer else None,
                     keep_until=step if step else None)
    try:
        with _Deterministic(config.deterministic), _StopSignals() as signals, _progress(config) as bar:
            task = bar.add_task(config.description, total=run.total, completed=step, loss="-")
            while step < run.total and not history.stopped:
                loss = _one_step(run, step)
                step += 1
                _record(run, history, log, step, loss)
                _control(run, history, step, loss)
                bar.update(task, completed=step, loss=f"{loss:.4g}")
                _after_step(run, history, step, loss, signals)
    finally:
        log.close()
    return step


def fit(model: nn.Module, loss_fn: Callable[[tuple[Tensor, ...]], Tensor], data: Sequence[Tensor],
        config: TrainConfig, *, params: Iterable[nn.Parameter] | None = None,
        optimizer: Optimizer | None = None, run_dir: str | Path | None = None, name: str = "train",
        resume: bool = False, graft_log: Any = None,
        callback: Callable[[int, float], None] | None = None, monitor: Any = None) -> TrainHistory:
    """Train: ``loss_fn(batch)`` with ``batch`` a tuple of rows of the tensors in ``data``.

    model: everything that is checkpointed (its ``state_dict``); fit does not change train/eval modes.
    loss_fn: batch (tuple of tensors (b, ...) on the device of the first trained parameter) → scalar
        loss, the mean over the batch's rows.
    data: tensors with the same first axis n (samples).
    params: the trained parameters (default: those of ``model`` with requires_grad); ignored when
        ``optimizer`` is given (then its parameters are the trained ones).
    optimizer: an existing optimizer (e.g. one surgery added parameters to); default: built from config
        with :func:`build_optimizer`. Its state is checkpointed and restored on resume, so rebuild it
        with the same param groups (replay the graft log) before resuming.
    run_dir / name: where ``checkpoints/<name>.pt`` and ``<name>.log.csv`` go (None: no files).
    resume: continue from ``checkpoints/<name>.pt`` when it exists (a fresh run otherwise).
    graft_log: a :class:`simkit.surgery.GraftLog` (or list of records) stored in the checkpoint.
    callback(step, loss): called after every step (and its checkpoint); gradients are still in ``.grad``.
    monitor: a :class:`simkit.training.monitor.ValidationMonitor` (or any object with
        ``after_step(step, model, optimizer, last) -> reason | None``, ``state_dict()``,
        ``load_state_dict()``): called after every step; a reason stops the run (``stopped``); its
        state is checkpointed and restored on resume. The caller restores the best weights afterwards.
    Returns the TrainHistory (losses and LRs per step, why it stopped).
    """
    run = _new_run(model, loss_fn, data, config, params, optimizer, run_dir, name, resume, graft_log, callback,
                   monitor)
    history, step, finished = _start(run, resume)
    if finished:
        return history
    step = _train(run, history, step)
    if not history.stopped:
        history.stopped = "steps" if config.steps is not None and run.total == config.steps else "epochs"
    _checkpoint(run, step, history, finished=True)
    return history


def _one_step(run: _Run, step: int) -> float:
    """One optimizer step on global batch ``step``: gradients, a finite-loss check, clipping when
    ``grad_clip`` is set, the update; returns the global batch's loss."""
    value = _backward(run, step)
    if value != value or value in (float("inf"), float("-inf")):
        raise SimkitError(f"the loss became {value} at step {step + 1}; lower the learning rate or set grad_clip")
    if run.config.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(run.trained, run.config.grad_clip)
    run.optimizer.step()
    return value


def _backward(run: _Run, step: int) -> float:
    """The LR for ``step``, then the gradients of global batch ``step`` in ``.grad`` (this rank's slice
    of it under torchrun, summed over ranks); returns the global batch's loss."""
    run.controller.apply(run.optimizer, step)
    rows = batch_indices(run.n, run.config.batch_size, run.config.seed, step)
    local = torch.tensor_split(rows, dist.world_size())[dist.rank()] if dist.is_distributed() else rows
    run.optimizer.zero_grad(set_to_none=True)
    if len(local):
        batch = tuple(t[local.to(t.device)].to(run.device) for t in run.data)
        loss = run.loss_fn(batch)
        if loss.ndim != 0:
            raise SimkitError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}; reduce it with .mean()")
        loss.backward()
        value = loss.detach().double()
    else:
        value = torch.zeros((), device=run.device, dtype=torch.float64)
    if dist.is_distributed():
        weight = len(local) / len(rows)
        _reduce_gradients(run.trained, weight)
        value = dist.all_reduce_sum(value * weight)
    return float(value)


def _check_resumable(saved: dict[str, Any], config: TrainConfig, path: Path) -> None:
    old, new = saved.get("config", {}), config.to_dict()
    changed = [k for k in new if k not in _RESUME_FREE and old.get(k) != new[k]]
    if changed:
        diff = ", ".join(f"{k}={old.get(k)!r}→{new[k]!r}" for k in changed)
        raise SimkitError(f"{path} was made with other training settings ({diff}); resume with the same "
                          "settings or start over without `resume`")


def _restore(model, optimizer, controller, saved, path) -> None:
    try:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise SimkitError(f"{path} does not match this model/optimizer ({first}); rebuild the same "
                          "architecture (replay the graft log) or start over without `resume`") from None
    controller.load_state_dict(saved["controller"])
    set_rng_state(saved["rng"])
