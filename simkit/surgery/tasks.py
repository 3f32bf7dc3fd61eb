"""What the graft suite trains: a model factory, data tensors, a probe batch and a loss.

- Built-in model (``simkit:llama...``): next-token cross-entropy on token sequences. Without
  ``--data`` the sequences come from a seeded random first-order Markov chain over the vocabulary
  (each token has 3 likely successors), so there is something to learn [ours].
- A user's model: cross-entropy when the data has labels; otherwise mean squared error to a fixed
  random target (standard normal, drawn once from the seed, shaped like the model's output on the
  data) [ours, as the issue prescribes]. The choice is recorded as ``loss_kind``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.errors import SimkitError

BUILTIN = "simkit:llama"


@dataclass
class SuiteSettings:
    """Everything that defines a suite run (JSON-able; the F3 worker process rebuilds the task from it)."""

    model: str = BUILTIN
    data: str | None = None
    n: int | None = None
    seed: int = 0
    trust: bool = False
    after: str | None = None
    branch: str | None = None
    gate: str = "shadow"
    steps: int = 600
    batch_size: int = 16
    seq_len: int = 32
    e2_lr: float = 0.05
    f3_lr: float = 1e-3
    allow_double_zero: bool = False
    max_e3_sites: int = 12
    progress: bool = True

    @property
    def builtin(self) -> bool:
        return self.model.split(":")[:2] == ["simkit", "llama"]

    def resolved(self) -> SuiteSettings:
        """Defaults that depend on the model: after = blocks.1 and branch = llama for the built-in model."""
        out = SuiteSettings(**asdict(self))
        if out.after is None:
            if not out.builtin:
                raise SimkitError("--after is required with a MODEL; run `simkit layers MODEL` to list module names")
            out.after = "blocks.1"
        if out.branch is None:
            out.branch = "llama" if out.builtin else "mlp"
        if out.steps < 6:  # F3 grafts mid-way, then must checkpoint before it is killed and resumed
            raise SimkitError(f"--steps must be at least 6 (F3 grafts mid-way, checkpoints, is killed and "
                              f"resumed), got {out.steps}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Task:
    """make_model() → a fresh model with the same initial weights each call; data: tensors for ``fit``;
    probe: a model input (b, ...) for exactness checks; loss(model) → loss_fn(batch)."""

    make_model: Callable[[], nn.Module]
    data: tuple[Tensor, ...]
    probe: Tensor
    loss_kind: str

    def loss(self, model: nn.Module) -> Callable[[tuple[Tensor, ...]], Tensor]:
        if self.loss_kind == "next_token_cross_entropy":
            def loss_fn(batch):
                ids = batch[0]
                logits = model(ids[:, :-1])
                return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        elif self.loss_kind == "cross_entropy":
            def loss_fn(batch):
                return F.cross_entropy(_tensor_output(model(batch[0])), batch[1])
        else:
            def loss_fn(batch):
                return F.mse_loss(_tensor_output(model(batch[0])), batch[1])
        return loss_fn


def _tensor_output(out: Any) -> Tensor:
    if isinstance(out, Tensor):
        return out
    raise SimkitError(f"the model returned a {type(out).__name__}; simkit graft trains models that return one tensor")


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


def make_task(settings: SuiteSettings) -> Task:
    """The model factory, data and loss that ``settings`` describe."""
    from simkit.models import load_model

    def make_model() -> nn.Module:
        return load_model(settings.model, seed=settings.seed, trust=settings.trust)

    model = make_model()
    if settings.builtin:
        vocab, max_len = getattr(model, "vocab", 50), getattr(model, "max_len", 64)
        if settings.data is None:
            ids = markov_tokens(settings.n or 256, min(settings.seq_len, max_len) + 1, vocab, settings.seed)
        else:
            ids = _token_data(settings, vocab, max_len)
        return Task(make_model, (ids,), ids[:8, :-1], "next_token_cross_entropy")
    if settings.data is None:
        raise SimkitError("--data is required with a MODEL (the suite trains it); e.g. --data mnist1d")
    from simkit.data import load_data

    data = load_data(settings.data, n=settings.n or 512, seed=settings.seed)
    if isinstance(data.inputs, dict):
        raise SimkitError("simkit graft on a user's model takes tensor inputs, not tokenised text; use npy:/pt: data")
    x = data.inputs
    probe = x[:64]
    if data.labels is not None:
        return Task(make_model, (x, data.labels), probe, "cross_entropy")
    with torch.no_grad():
        shape = _tensor_output(model(x[:2])).shape[1:]
    target = torch.randn((len(x), *shape), generator=torch.Generator().manual_seed(settings.seed + 1))
    return Task(make_model, (x, target), probe, "mse_to_fixed_random_target")


def _token_data(settings: SuiteSettings, vocab: int, max_len: int) -> Tensor:
    from simkit.data import load_data

    data = load_data(settings.data, n=settings.n, seed=settings.seed)
    ids = data.inputs["input_ids"] if isinstance(data.inputs, dict) else data.inputs
    if ids.dtype not in (torch.int64, torch.int32) or ids.ndim != 2:
        raise SimkitError(f"the built-in model needs token ids (n, t) of integers, got {tuple(ids.shape)} {ids.dtype} "
                          f"from {settings.data!r}; pass text:FILE or an integer npy:/pt: file")
    if int(ids.max()) >= vocab or int(ids.min()) < 0:
        raise SimkitError(f"token ids must lie in [0, {vocab}) for the built-in model (vocab={vocab}); "
                          "pass a model spec with a larger vocab, e.g. simkit:llama:vocab=50257")
    return ids[:, :max_len + 1].long()
