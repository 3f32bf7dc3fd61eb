"""Batches and calling a model on them: the one home of "a batch is a tensor or a dict of tensors"
(``batch_rows``, ``take``, ``to_device``, ``run_model``), the models' train/eval modes around a call,
and turning a forward pass that rejects the data into a clear error."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from simkit.errors import SimkitError

Batch = torch.Tensor | dict[str, torch.Tensor]
#: a model for runners that repeat over seeds: a module (the same for every seed) or a factory seed → module
ModelSource = nn.Module | Callable[[int], nn.Module]


def build_model(model: ModelSource, seed: int, argument: str) -> nn.Module:
    """The model of ``seed``: ``model`` itself when it is a module, else ``model(seed)``; anything else, or
    a factory that returns no module, is a SimkitError naming the library ``argument``."""
    if isinstance(model, nn.Module):
        return model
    if not callable(model):
        raise SimkitError(f"`{argument}` must be a torch.nn.Module or a callable seed → module, got "
                          f"{type(model).__name__}; load a model spec with simkit.models.load_model")
    built = model(seed)
    if not isinstance(built, nn.Module):
        raise SimkitError(f"`{argument}` returned a {type(built).__name__} for seed {seed}, not a "
                          "torch.nn.Module; a model factory must return the module")
    return built


def batch_rows(batch: Batch) -> int:
    """Number of samples of a tensor (n, ...) or of a dict of such tensors (its first entry); anything
    without a sample axis is a SimkitError naming ``data``."""
    first = next(iter(batch.values()), None) if isinstance(batch, dict) else batch
    shape = getattr(first, "shape", None)
    if not shape:  # no shape, or a 0-d tensor
        raise SimkitError(f"a batch of `data` must be a tensor (samples, ...) or a dict of them, got "
                          f"{type(batch).__name__}{' of ' + type(first).__name__ if isinstance(batch, dict) else ''}")
    return int(shape[0])


def take(batch: Batch, index: Any) -> Batch:
    """Rows ``index`` (a slice, an index tensor) of a tensor (n, ...) or of every tensor of a dict."""
    if isinstance(batch, dict):
        return {key: value[index] for key, value in batch.items()}
    return batch[index]


def run_model(model: nn.Module, batch: Batch) -> Any:
    """Call ``model`` on one batch: a dict becomes keyword arguments."""
    return model(**batch) if isinstance(batch, dict) else model(batch)


@contextmanager
def modes_kept(*models: nn.Module) -> Iterator[None]:
    """Restore every submodule's own ``training`` flag on exit (``module.train(flag)`` would recurse
    into children that had another mode, e.g. a frozen back half shared by several stitches)."""
    saved = [(module, module.training) for model in models for module in model.modules()]
    try:
        yield
    finally:
        for module, flag in saved:
            module.training = flag


@contextmanager
def eval_mode(*models: nn.Module) -> Iterator[None]:
    """``model.eval()`` inside the block; each submodule's own mode restored after it (see ``modes_kept``)."""
    with modes_kept(*models):
        for model in models:
            model.eval()
        yield


def float_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's first floating-point parameter (None when it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def describe_batch(batch: Batch) -> str:
    """``(32, 1, 40)`` or ``{input_ids: (8, 16), ...}`` for error messages."""
    if isinstance(batch, dict):
        return "{" + ", ".join(f"{k}: {tuple(v.shape)}" for k, v in batch.items()) + "}"
    return str(tuple(batch.shape))


def forward_error(exc: BaseException, batch: Batch, who: str) -> SimkitError:
    """The one-line error for a forward pass of ``who`` (e.g. "model A") that failed on ``batch``."""
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return SimkitError(f"{who} failed on inputs of shape {describe_batch(batch)}: {first_line[:200]}; "
                       "check that `data` matches the model's input")


def check_accepts(model: nn.Module, batch: Batch, who: str) -> None:
    """Run ``model`` once on ``batch`` (no grad, modes untouched); a rejected input is a SimkitError."""
    try:
        with torch.no_grad():
            run_model(model, batch)
    except SimkitError:
        raise
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:
        raise forward_error(exc, batch, who) from None


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` (``cpu``, ``cuda`` or ``cuda:N``) as a torch.device; one-line SimkitError when it
    names no device or CUDA is not available."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise SimkitError(f"unknown device {str(device)!r}; use cpu, cuda or cuda:N") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise SimkitError("`device` cuda was asked for but no CUDA device is available; use `device` cpu")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise SimkitError(f"`device` {resolved}: only {torch.cuda.device_count()} CUDA device(s) are "
                              "visible; use cuda:0 or `device` cpu")
    elif resolved.type != "cpu":
        raise SimkitError(f"unsupported device {str(device)!r}; use cpu, cuda or cuda:N")
    return resolved


def to_device(batch: Batch, device: torch.device) -> Batch:
    """A tensor, or every tensor of a dict, on ``device`` (no copy when it is already there)."""
    if isinstance(batch, dict):
        return {k: v.to(device) for k, v in batch.items()}
    return batch.to(device)
