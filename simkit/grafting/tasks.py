"""What the graft suite trains: a model factory, data tensors, a probe batch and a loss.

- The built-in model (:class:`simkit.models.llama.TinyLlama`, ``simkit:llama``): next-token
  cross-entropy on token sequences. Without data the sequences come from a seeded random first-order
  Markov chain over the vocabulary (each token has 3 likely successors), so there is something to
  learn [ours].
- A user's model: cross-entropy when the data has labels; otherwise mean squared error to a fixed
  random target (standard normal, drawn once from the seed, shaped like the model's output on the
  data) [ours, as the issue prescribes]. The choice is recorded as ``loss_kind``. The probe batch is
  the first 64 samples (8 sequences for the built-in model), or as many as it takes for E1 to
  compare the paper's 1600 output values (all the samples when there are fewer).

The F3 worker process rebuilds the same task from files (:func:`save_task`, :func:`load_task`): the
initial model as the runner pickled it and the data tensors (read with ``weights_only=True``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.data import Dataset
from simkit.errors import SimkitError
from simkit.forward import check_accepts, eval_mode
from simkit.io import save_torch
from simkit.models.llama import TinyLlama
from simkit.seeding import generator
from simkit.settings.graft import GraftSettings

LOSS_KINDS = ("next_token_cross_entropy", "cross_entropy", "mse_to_fixed_random_target")
BUILTIN_SEQUENCES = 256  # Markov-chain sequences of the built-in model when `n` is None
E1_MIN_VALUES = 1600  # the paper's E1: 0/1600 logit bit mismatches (spec §4)
BUILTIN_PROBE = 8  # probe sequences of the built-in model, more when needed to reach E1_MIN_VALUES outputs
USER_PROBE = 64  # probe samples of a user's data, more when needed to reach E1_MIN_VALUES outputs


@dataclass
class Task:
    """make_model() → a fresh copy of the initial model (eval mode) each call; data: tensors for
    ``fit``; probe: a model input (b, ...) for exactness checks; loss(model) → loss_fn(batch);
    builtin: the built-in model (its E3 sites are its blocks); progress: show progress bars."""

    make_model: Callable[[], nn.Module]
    data: tuple[Tensor, ...]
    probe: Tensor
    loss_kind: str
    builtin: bool = False
    progress: bool = False

    def loss(self, model: nn.Module) -> Callable[[tuple[Tensor, ...]], Tensor]:
        if self.loss_kind == "next_token_cross_entropy":
            def loss_fn(batch: tuple[Tensor, ...]) -> Tensor:
                ids = batch[0]
                logits = model(ids[:, :-1])
                return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        elif self.loss_kind == "cross_entropy":
            def loss_fn(batch: tuple[Tensor, ...]) -> Tensor:
                return F.cross_entropy(model(batch[0]), batch[1])
        else:
            def loss_fn(batch: tuple[Tensor, ...]) -> Tensor:
                return F.mse_loss(model(batch[0]), batch[1])
        return loss_fn


def is_builtin(model: nn.Module) -> bool:
    """Whether ``model`` is the built-in Llama-style model (token task, blocks as E3 sites)."""
    return isinstance(model, TinyLlama)


def deeper_builtin(model: nn.Module, blocks: int, seed: int) -> TinyLlama:
    """A fresh built-in model like ``model`` (its vocabulary, width, heads and max_len) with ``blocks``
    blocks, initialised from ``seed`` (E3 at more graft depths); SimkitError for any other model."""
    if not isinstance(model, TinyLlama):
        raise SimkitError("`e3_blocks` deepens the built-in model for E3; a user's model is timed at its own "
                          "modules (at most `max_e3_sites` of them): leave `e3_blocks` unset")
    heads = next((h for m in model.modules() if isinstance(h := getattr(m, "heads", None), int)), 4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyLlama(vocab=model.vocab, d=model.embed.embedding_dim, heads=heads, blocks=blocks,
                         max_len=model.max_len).eval()


def copies(model: nn.Module) -> Callable[[], nn.Module]:
    """A factory of fresh copies of ``model`` as it is now (in eval mode; ``model`` is not touched)."""
    initial = copy.deepcopy(model)

    def make_model() -> nn.Module:
        return copy.deepcopy(initial).eval()

    return make_model


def markov_tokens(n: int, length: int, vocab: int, seed: int) -> Tensor:
    """(n, length) int64 token sequences from a seeded random Markov chain (3 likely successors per token)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.full((vocab, vocab), -4.0)
    successors = torch.stack([torch.randperm(vocab, generator=gen)[:3] for _ in range(vocab)])
    logits.scatter_(1, successors, 2.0)
    probs = logits.softmax(dim=1)
    out = torch.empty(n, length, dtype=torch.int64)
    out[:, 0] = torch.randint(0, vocab, (n,), generator=gen)
    for t in range(1, length):
        out[:, t] = torch.multinomial(probs[out[:, t - 1]], 1, generator=gen).squeeze(1)
    return out


def make_task(settings: GraftSettings, model: nn.Module, data: Dataset | None, *, progress: bool = False) -> Task:
    """The model factory, data and loss for ``model`` and ``data`` (None: the built-in model's Markov
    tokens); SimkitError for data the suite cannot train the model on."""
    make_model = copies(model)
    limit = settings.samples(is_builtin(model))
    if is_builtin(model):
        vocab, max_len = int(getattr(model, "vocab", 50)), int(getattr(model, "max_len", 64))
        if data is None:
            ids = markov_tokens(settings.n or BUILTIN_SEQUENCES, min(settings.seq_len, max_len) + 1, vocab,
                                settings.seed)
        else:
            ids = _token_ids(data, vocab, max_len)[:limit]
        rows = max(BUILTIN_PROBE, -(-E1_MIN_VALUES // max(1, (ids.shape[1] - 1) * vocab)))
        return Task(make_model, (ids,), ids[:rows, :-1], "next_token_cross_entropy", builtin=True,
                    progress=progress)
    if data is None:
        raise SimkitError("`data` is required with a MODEL (the suite trains it), e.g. the dataset mnist1d")
    if isinstance(data.inputs, dict):
        raise SimkitError("simkit graft on a user's model takes tensor inputs, not tokenised text; use npy:/pt: data")
    x = data.inputs[:limit]
    first = make_model()
    with eval_mode(first):
        check_accepts(first, x[:2], "the model")
        with torch.no_grad():
            out = first(x[:2])
    if not isinstance(out, Tensor):
        raise SimkitError(f"the model returned a {type(out).__name__}; simkit graft trains models that return "
                          "one tensor")
    probe = x[:probe_size(out[0].numel())]
    if data.labels is not None:
        labels = data.labels[:limit]
        _check_labels(labels, out)
        return Task(make_model, (x, labels), probe, "cross_entropy", progress=progress)
    target = torch.randn((len(x), *out.shape[1:]), generator=generator(settings.seed, "target"))
    return Task(make_model, (x, target), probe, "mse_to_fixed_random_target", progress=progress)


def probe_size(outputs_per_sample: int) -> int:
    """Probe samples of a user's data: 64, or enough for ``E1_MIN_VALUES`` output values."""
    return max(USER_PROBE, -(-E1_MIN_VALUES // max(1, outputs_per_sample)))


def _check_labels(labels: Tensor, logits: Tensor) -> None:
    """Labels the cross-entropy loss can use with the model's outputs ``logits`` (b, classes, ...)."""
    if labels.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise SimkitError(f"the data's labels have dtype {labels.dtype}; cross-entropy needs integer class "
                          "labels (or data without labels: then the suite fits a fixed random target)")
    if logits.ndim < 2:
        raise SimkitError(f"the model returns outputs of shape {tuple(logits.shape)}; cross-entropy on the data's "
                          "labels needs (batch, classes) logits")
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= logits.shape[1]):
        raise SimkitError(f"the data's labels lie in [{int(labels.min())}, {int(labels.max())}] but the model has "
                          f"{logits.shape[1]} outputs; give labels in [0, {logits.shape[1]})")


def _token_ids(data: Dataset, vocab: int, max_len: int) -> Tensor:
    ids = data.inputs["input_ids"] if isinstance(data.inputs, dict) else data.inputs
    if ids.dtype not in (torch.int64, torch.int32) or ids.ndim != 2:
        raise SimkitError(f"the built-in model needs token ids (n, t) of integers, got {tuple(ids.shape)} {ids.dtype} "
                          f"from {data.spec!r}; pass text:FILE or an integer npy:/pt: file")
    if int(ids.max()) >= vocab or int(ids.min()) < 0:
        raise SimkitError(f"token ids must lie in [0, {vocab}) for the built-in model (vocab={vocab}); "
                          "pass a model spec with a larger vocab, e.g. simkit:llama:vocab=50257")
    return ids[:, :max_len + 1].long()


def check_rebuildable(model: nn.Module) -> None:
    """SimkitError when the F3 worker process could not import a class of ``model`` to unpickle it."""
    for module in model.modules():
        cls = type(module)
        if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
            raise SimkitError(f"F3 rebuilds the model in a new process, which cannot import {cls.__qualname__} "
                              f"(defined in {'a function' if '<locals>' in cls.__qualname__ else '__main__'}); "
                              "define the model's classes at the top level of an importable module")


def save_task(task: Task, folder: Path) -> None:
    """The files the F3 worker rebuilds ``task`` from: ``model.pt`` (the initial model, pickled by the
    runner) and ``task.pt`` (data tensors, probe, loss kind)."""
    save_torch(folder / "model.pt", task.make_model())
    save_torch(folder / "task.pt", {"data": list(task.data), "probe": task.probe, "loss_kind": task.loss_kind,
                                    "builtin": task.builtin})


def load_task(folder: Path) -> Task:
    """The task :func:`save_task` wrote (the model file is the runner's own, written in this run)."""
    model = torch.load(folder / "model.pt", weights_only=False)
    saved: dict[str, Any] = torch.load(folder / "task.pt", weights_only=True)
    if saved["loss_kind"] not in LOSS_KINDS:
        raise SimkitError(f"{folder / 'task.pt'} names an unknown loss {saved['loss_kind']!r}")
    return Task(copies(model), tuple(saved["data"]), saved["probe"], saved["loss_kind"],
                builtin=bool(saved["builtin"]))
