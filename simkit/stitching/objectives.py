"""Stitching objectives (spec §2): HLM, SLM, DM and FuLA, as pure functions of tensors.

Shapes: ``logits (b, k)``; ``labels (b,)`` int64; activations ``(b, ...)`` of any shape (norms are
taken over all non-batch axes). Every loss is a mean over the batch's samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from simkit.errors import SimkitError

#: what each objective minimises (its keys are ``simkit.settings.stitch.OBJECTIVES``), for the report
DESCRIPTIONS = {
    "hlm": "cross-entropy to the labels",
    "slm": "KL divergence to B's soft predictions (T = 1)",
    "dm": "squared distance to B's activation at the stitch",
    "fula": "normalised squared distance to every layer of B from the stitch to the penultimate, uniform weights",
}


def hlm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Hard-label matching: cross-entropy of ``logits (b, k)`` to ``labels (b,)``."""
    return F.cross_entropy(logits, labels)


def slm_loss(logits: Tensor, target_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Soft-label matching: KL(softmax(target / T) ‖ softmax(logits / T)) · T², mean over the batch."""
    t = temperature
    log_p = F.log_softmax(logits / t, dim=-1)
    log_q = F.log_softmax(target_logits / t, dim=-1)
    return F.kl_div(log_p, log_q, log_target=True, reduction="batchmean") * t * t


def squared_distance(h: Tensor, target: Tensor) -> Tensor:
    """Per-sample ‖h − target‖² over all non-batch axes: ``(b, ...) → (b,)``."""
    if h.shape != target.shape:
        raise SimkitError(f"stitched activation {tuple(h.shape)} and B's {tuple(target.shape)} differ in shape")
    return (h - target).flatten(1).pow(2).sum(1)


def dm_loss(h: Tensor, target: Tensor) -> Tensor:
    """Direct matching: mean over the batch of ‖ĥ_i − b_i(x)‖²."""
    return squared_distance(h, target).mean()


def fula_loss(hs: Sequence[Tensor], targets: Sequence[Tensor], eps: float = 1e-8) -> Tensor:
    """Full-layer alignment: Σ_j w_j ‖ĥ_j − b_j‖² / (‖b_j‖² + ε), w_j = 1/J, mean over the batch.

    ``hs[j]``, ``targets[j]``: (b, ...) stitched and B's activations at layer j (from the stitch to
    B's penultimate layer).
    """
    if len(hs) != len(targets) or not hs:
        raise SimkitError(f"FuLA needs matching non-empty layer lists, got {len(hs)} and {len(targets)}")
    total = torch.zeros((), dtype=hs[0].dtype, device=hs[0].device)
    for h, target in zip(hs, targets, strict=True):
        norm = target.flatten(1).pow(2).sum(1)
        total = total + (squared_distance(h, target) / (norm + eps)).mean()
    return total / len(hs)
