"""Recovery after post-training: keep each run's slope pattern, drop the penalty, fine-tune the weights.

Post-training trades accuracy for linearity under the penalty ω·Σ(|1 − α| + ε)^0.5. Recovery asks how
much of that accuracy the weights alone win back once the pattern is fixed: every slope α stays
exactly as post-training left it (units that are linear stay linear, the others keep their α: the
slopes are not trained and are not in the optimizer), and the other weights are fine-tuned with
cross-entropy alone. It is one named stage of the shared training loop (``<run stage>_recover``), so it
is checkpointed and resumed like the post-training runs; its batch order comes from
``derive_seed(seed, "recover")``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.linearization.slope import slope_modules
from simkit.seeding import derive_seed
from simkit.training import TrainConfig, TrainHistory, fit


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
                   resume=resume, callback=callback)
    finally:
        model.eval()
        for module, flag in zip(slopes, trainable, strict=True):
            module.alpha.requires_grad_(flag)


__all__ = ["recover"]
