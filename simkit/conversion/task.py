"""The task a converted network is fine-tuned and scored on: classification or causal language modelling.

Targets are one tensor per sample, prepared once: class labels (n,) for classification; for a language
model the token ids (n, T) with padding positions set to -100 (ignored), and the positions before
``score_from`` too (a dataset's ``info["lm_score_from"]``: context that is read but never predicted, trained
on or scored, e.g. the random prefix of a copy task). Scores: accuracy (higher is better) or perplexity =
exp(mean next-token NLL over the scored positions) (lower is better).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from simkit.errors import SimkitError
from simkit.forward import batch_rows as rows  # noqa: F401  (the conversion modules import these from here)
from simkit.forward import run_model, take  # noqa: F401

Inputs = Tensor | dict[str, Tensor]
IGNORE = -100


def logits_of(output: Any) -> Tensor:
    """The logits tensor of a model output: a tensor, an object with ``.logits``, or a tuple's first item."""
    if isinstance(output, Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, list | tuple) and output and isinstance(output[0], Tensor):
        return output[0]
    raise SimkitError(f"cannot read logits from a model output of type {type(output).__name__}")


@dataclass
class Task:
    """kind: ``classification`` or ``lm``; score: ``accuracy`` or ``perplexity``. score_from (lm): the first
    token position that is predicted, trained on and scored (0: every position after the first)."""

    kind: str
    score_from: int = 0

    @property
    def score(self) -> str:
        return "accuracy" if self.kind == "classification" else "perplexity"

    @property
    def higher_is_better(self) -> bool:
        return self.kind == "classification"

    @classmethod
    def infer(cls, inputs: Inputs, labels: Tensor | None, score_from: int = 0) -> Task:
        """Classification when labels exist; a causal LM when the inputs are integer token ids (scored
        from position ``score_from``, which must leave at least one position)."""
        if labels is not None:
            return cls("classification")
        ids = inputs["input_ids"] if isinstance(inputs, dict) and "input_ids" in inputs else inputs
        if isinstance(ids, Tensor) and not ids.is_floating_point() and ids.dim() == 2:
            if isinstance(score_from, bool) or not isinstance(score_from, int) or not 0 <= score_from < ids.shape[1]:
                raise SimkitError(f"`lm_score_from` must be an integer from 0 to {ids.shape[1] - 1} (the "
                                  f"sequences' length − 1), got {score_from!r}; fix the dataset's info")
            return cls("lm", score_from)
        raise SimkitError("convert needs labelled data (classification) or token ids (n, T) for a causal "
                          "language model; pass labelled `data`")

    def targets(self, inputs: Inputs, labels: Tensor | None) -> Tensor:
        """(n,) labels, or (n, T) token ids with padding set to -100."""
        if self.kind == "classification":
            if labels is None:
                raise SimkitError("classification needs labels; pass labelled `data`")
            return labels
        if isinstance(inputs, dict):
            ids = inputs["input_ids"].clone()
            mask = inputs.get("attention_mask")
            if mask is not None:
                ids[mask == 0] = IGNORE
        else:
            ids = inputs.clone()
        ids[:, :self.score_from] = IGNORE
        return ids

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """Cross-entropy: logits (b, C) vs (b,), or next-token logits (b, T, V) vs ids (b, T)."""
        if self.kind == "classification":
            return F.cross_entropy(logits, target)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1),
                               ignore_index=IGNORE)

    @torch.no_grad()
    def evaluate(self, forward: Callable[[Inputs], Tensor], inputs: Inputs, target: Tensor,
                 batch_size: int = 256) -> float:
        """Accuracy, or perplexity, of ``forward(inputs batch) -> logits`` over all rows."""
        n = rows(inputs)
        if n == 0:
            raise SimkitError("nothing to evaluate: zero test samples")
        correct, nll, tokens = 0, 0.0, 0
        for start in range(0, n, batch_size):
            part = slice(start, start + batch_size)
            logits = logits_of(forward(take(inputs, part))).float()
            tgt = target[part].to(logits.device)
            if self.kind == "classification":
                correct += int((logits.argmax(-1) == tgt).sum())
            else:
                shifted = tgt[:, 1:].reshape(-1)
                nll += float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), shifted,
                                             ignore_index=IGNORE, reduction="sum"))
                tokens += int((shifted != IGNORE).sum())
        if self.kind == "classification":
            return correct / n
        return math.exp(nll / max(tokens, 1))
