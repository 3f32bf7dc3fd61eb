"""The learnable-slope activation that replaces a ReLU, its penalty, and the freeze rule.

:class:`SlopeReLU` computes ``y = relu(x) - α·relu(-x)``: x where x > 0, α·x where x < 0. With α = +0
it returns exactly ``torch.relu(x)`` bit for bit for every finite x and NaN [ours]: ``α·relu(-x)`` is
then +0, and ``r - (+0) == r`` for every float r, including relu's own signed zero (torch.relu(-0.0)
is -0.0). The naive ``torch.where(x >= 0, x, α·x)`` would give -0.0 for negative x; PyTorch's PReLU
starts at α = 0.25. Only x = -inf differs (0·inf is NaN), as it does for nn.PReLU.

Freeze rule: once |α − 1| < ``tol`` (0.01), or when an optimizer step carries α across 1, that α is set
to exactly 1 and marked in the persistent ``frozen`` buffer (saved in the state dict). Frozen slopes
never move again: the forward reads 1 for them (so their gradient is exactly zero, the gradient
hook) and :class:`FreezeRule` resets them to 1 after every optimizer step (momentum cannot move them).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from simkit.errors import SimkitError
from simkit.settings.linearize import FREEZE_TOL


class SlopeReLU(nn.Module):
    """PReLU-like activation with slope α on negative inputs and a persistent freeze mask.

    channels: number of slopes (1 = layer-wise; C = channel-wise, broadcast along dim 1).
    Input (N, C, *) or (N, C); output the same shape. ``alpha`` (channels,) starts at 0 (= ReLU).
    """

    frozen: Tensor

    def __init__(self, channels: int = 1) -> None:
        super().__init__()
        if channels < 1:
            raise SimkitError(f"SlopeReLU needs at least one slope, got {channels}")
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.register_buffer("frozen", torch.zeros(channels, dtype=torch.bool))

    @property
    def channels(self) -> int:
        return self.alpha.numel()

    def effective_alpha(self) -> Tensor:
        """(channels,) slopes as the forward uses them: exactly 1 where frozen (zero gradient there)."""
        return torch.where(self.frozen, torch.ones_like(self.alpha), self.alpha)

    def forward(self, x: Tensor) -> Tensor:
        alpha = self.effective_alpha().to(x.dtype)
        if alpha.numel() > 1:
            if x.dim() < 2 or x.shape[1] != alpha.numel():
                raise SimkitError(f"SlopeReLU has {alpha.numel()} channel slopes but got input of shape "
                                  f"{tuple(x.shape)}; channel-wise slopes need (N, C, ...) inputs")
            alpha = alpha.view([1, -1] + [1] * (x.dim() - 2))
        return torch.relu(x) - alpha * torch.relu(-x)

    def nonlinear_fraction(self, threshold: float = 0.0) -> float:
        """Fraction of slopes counted nonlinear (the activation's p_l): α ≠ 1, or with ``threshold`` > 0
        only |1 − α| > threshold (a slope that close to 1 counts as linear)."""
        alpha = self.effective_alpha()
        if threshold == 0:
            return float((alpha != 1).float().mean())
        return float(((1 - alpha).abs() > threshold).float().mean())

    @torch.no_grad()
    def freeze(self, previous: Tensor | None = None, tol: float = FREEZE_TOL) -> int:
        """Freeze slopes with |α − 1| < tol or (given the slopes before a step) that crossed 1.

        previous: (channels,) α before the step, or None. Sets frozen α to exactly 1; returns how
        many slopes were newly frozen.
        """
        alpha = self.alpha
        newly = (alpha - 1).abs() < tol
        if previous is not None:
            newly |= (previous - 1) * (alpha - 1) < 0
        newly &= ~self.frozen
        self.frozen |= newly
        alpha[self.frozen] = 1.0
        return int(newly.sum())

    def extra_repr(self) -> str:
        return f"channels={self.channels}"


def slope_modules(model: nn.Module) -> Iterator[tuple[str, SlopeReLU]]:
    """(name, module) for every SlopeReLU of ``model``, in registration order."""
    for name, module in model.named_modules():
        if isinstance(module, SlopeReLU):
            yield name, module


def slope_penalty(modules: Iterable[SlopeReLU], eps: float) -> Tensor:
    """Σ over slopes not yet frozen of (|1 − α| + eps)^0.5 (a scalar tensor; frozen slopes add 0)."""
    total = None
    for module in modules:
        term = ((1 - module.alpha).abs() + eps).sqrt()
        term = torch.where(module.frozen, torch.zeros_like(term), term).sum()
        total = term if total is None else total + term
    if total is None:
        raise SimkitError("model has no SlopeReLU activations to regularise; swap its ReLUs first")
    return total


class FreezeRule:
    """Applies the freeze rule around every ``optimizer.step()`` (step pre/post hooks).

    Before a step it remembers each α; after it, freezes slopes that reached 1 or crossed it and
    resets frozen slopes to exactly 1. Use as a context manager around training.
    """

    def __init__(self, modules: list[SlopeReLU], optimizer: torch.optim.Optimizer,
                 tol: float = FREEZE_TOL) -> None:
        self.modules, self.optimizer, self.tol = modules, optimizer, tol
        self._before: list[Tensor] = []
        self._handles: list[Any] = []

    def _pre(self, *_args: object) -> None:
        self._before = [m.alpha.detach().clone() for m in self.modules]

    def _post(self, *_args: object) -> None:
        for module, before in zip(self.modules, self._before, strict=True):
            module.freeze(before, self.tol)

    def __enter__(self) -> FreezeRule:
        self._handles = [self.optimizer.register_step_pre_hook(self._pre),
                         self.optimizer.register_step_post_hook(self._post)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


__all__ = ["FREEZE_TOL", "FreezeRule", "SlopeReLU", "slope_modules", "slope_penalty"]
