"""Learning-rate control: the conversion paper's plateau rule, plus an optional cosine decay.

Plateau rule (spec §1; window and threshold are simkit choices) [ours where the paper is silent]:
- the loss is smoothed by an exponential moving average ``ema ← β·ema + (1 − β)·loss`` with
  ``β = 1 − 1/window`` (started at the first loss);
- every ``window`` steps the EMA is compared with the best EMA seen at earlier checks; if it did not
  improve by at least ``threshold`` (relative), the LR scale is multiplied by ``factor`` (halved);
- stop rules: smoothed loss below ``stop_loss``; LR below ``min_lr``.
With ``window == 0`` the plateau rule is off and the "smoothed" loss is the step's loss.

The LR of every param group at step s (counted from 0) is ``initial_lr · schedule(s) · scale``, where
``initial_lr`` is stored in the group itself (so groups added later by surgery keep their own base).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from torch.optim import Optimizer


@dataclass
class PlateauState:
    """The controller's whole state (saved in checkpoints)."""

    ema: float | None = None
    best: float | None = None
    scale: float = 1.0
    reductions: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LRController:
    """Sets the optimizer's LRs each step and decides plateau reductions and LR/loss stops."""

    def __init__(self, *, window: int, factor: float, threshold: float, stop_loss: float | None,
                 min_lr: float | None, scheduler: str | None, total_steps: int) -> None:
        self.window, self.factor, self.threshold = window, factor, threshold
        self.stop_loss, self.min_lr = stop_loss, min_lr
        self.scheduler, self.total_steps = scheduler, total_steps
        self.state = PlateauState()

    @property
    def active(self) -> bool:
        """Whether the controller changes LRs at all (otherwise the optimizer's LRs are left alone)."""
        return self.window > 0 or self.scheduler is not None

    def schedule(self, step: int) -> float:
        """Multiplier of the base LR at ``step`` (0-based) from the scheduler alone."""
        if self.scheduler == "cosine" and self.total_steps > 0:
            return 0.5 * (1.0 + math.cos(math.pi * min(step, self.total_steps) / self.total_steps))
        return 1.0

    def apply(self, optimizer: Optimizer, step: int) -> None:
        """Write this step's LR into every param group (no-op when inactive)."""
        if not self.active:
            return
        factor = self.schedule(step) * self.state.scale
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
            group["lr"] = group["initial_lr"] * factor

    def observe(self, loss: float, step: int) -> None:
        """Update the EMA with the loss of step ``step`` (1-based) and run the plateau check."""
        st = self.state
        if self.window <= 0:
            st.ema = loss
            return
        beta = 1.0 - 1.0 / self.window
        st.ema = loss if st.ema is None else beta * st.ema + (1.0 - beta) * loss
        if step % self.window == 0:
            if st.best is not None and not st.ema < st.best - self.threshold * abs(st.best):
                st.scale *= self.factor
                st.reductions += 1
            st.best = st.ema if st.best is None else min(st.best, st.ema)

    def stop_reason(self, optimizer: Optimizer) -> str | None:
        """'stop_loss' or 'min_lr' when a stop rule fires, else None."""
        if self.stop_loss is not None and self.state.ema is not None and self.state.ema < self.stop_loss:
            return "stop_loss"
        if self.min_lr is not None and max(g["lr"] for g in optimizer.param_groups) < self.min_lr:
            return "min_lr"
        return None

    def state_dict(self) -> dict[str, Any]:
        return self.state.to_dict()

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.state = PlateauState(**data)
