"""The stitched network A[:i] → S → B[j:] and the training loss of each objective.

``StitchedModel(x (b, ...)) → logits (b, k)``; :class:`StitchLoss` turns a batch ``(x, labels)`` into
the objective's scalar loss, with B's targets computed on the same ``x`` (clean inputs for standard
stitching, IRIs for invariance-aware stitching).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from simkit.errors import SimkitError
from simkit.stitching.halves import BackHalf, FrontHalf, once_called, record
from simkit.stitching.objectives import dm_loss, fula_loss, hlm_loss, slm_loss
from simkit.stitching.stitch_layer import StitchLayer


class StitchedModel(nn.Module):
    """A's front half, the stitch and B's back half: ``x (b, ...) → logits (b, k)``.

    Only the stitch has trainable parameters; A's front runs without gradient.
    """

    def __init__(self, front: FrontHalf, stitch: StitchLayer, back: BackHalf):
        super().__init__()
        self.front, self.stitch, self.back = front, stitch, back

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            h = self.front(x)
        return self.back(self.stitch(h), x)

    @property
    def fula_layers(self) -> list[str]:
        """B's layers after the stitch up to the penultimate (the logits layer left out), without
        modules called more than once (a shared module has no one output to match)."""
        later = self.back.later_layers
        once = set(once_called(later))
        return [name for name in later[:-1] if name in once]


class StitchLoss:
    """``loss(batch)`` for one objective; ``batch = (x,)`` or ``(x, labels)``.

    hlm: CE(stitched logits, labels); slm: KL to B(x)'s softmax; dm: ‖S(a(x)) − b_j(x)‖²;
    fula: normalised match at the stitch and at every layer of B after it up to the penultimate.
    """

    def __init__(self, objective: str, model: StitchedModel):
        self.objective, self.model = objective, model
        self.layers = model.fula_layers if objective == "fula" else []

    def targets(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """B's logits and activations (stitch layer + FuLA layers) on ``x``, without gradient."""
        back = self.model.back
        names = [back.layer, *self.layers]
        with torch.no_grad(), record(back.model, names) as acts:
            logits = back.model(x)
        return logits, dict(acts)

    def __call__(self, batch: tuple[Tensor, ...]) -> Tensor:
        x = batch[0]
        model = self.model
        if self.objective == "hlm":
            if len(batch) < 2:
                raise SimkitError("the HLM objective needs labels; use labelled data or another objective")
            return hlm_loss(model(x), batch[1])
        b_logits, b_acts = self.targets(x)
        with torch.no_grad():
            h_a = model.front(x)
        stitched = model.stitch(h_a)
        if self.objective == "dm":
            return dm_loss(stitched, b_acts[model.back.layer])
        layers = self.layers
        inside = model.back.module_names(layers)  # the same modules, as the back half names them
        with record(model.back.module, inside) as acts:
            logits = model.back(stitched, x)
        if self.objective == "slm":
            return slm_loss(logits, b_logits)
        hs = [stitched] + [acts[name] for name in inside]
        targets = [b_acts[model.back.layer]] + [b_acts[name] for name in layers]
        return fula_loss(hs, targets)
