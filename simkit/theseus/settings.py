"""``ConvertSettings``: every option of a conversion run that changes its results, in one place.

Fields are named exactly as the ``simkit convert`` parameters and default to the CLI defaults; the
options the CLI does not expose (``finetune_batch_size``, ``finetune_lr``, ``stop_loss``,
``kd_temperature``, ``eval_samples``, ``compare_layers``) keep the library defaults. The CLI builds
one from its options; ``inputs.json`` and ``meta.settings`` are written from :meth:`to_dict`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from simkit.errors import SimkitError, check_real, unknown_name_error
from simkit.metrics.losses import alignment_loss
from simkit.theseus.recipes import RECIPES
from simkit.theseus.schedules import SCHEDULES

GUIDE_INITS = ("trained", "random")
BASELINES = ("scratch", "kd")


@dataclass
class ConvertSettings:
    """What a conversion does (see ``simkit.theseus.convert``).

    recipe: conv-to-mlp | deep-to-shallow | attention-to-rnn (ignored when a plan is given; None with
    a plan). schedule / metric / guide_init: every combination is converted (one ``runs`` row each).
    baselines: scratch and/or kd (an empty list for none). plan: the ``FILE.py:FUNCTION`` text of a plan
    file, kept for the record (the plan itself is passed to ``convert`` as an object).
    rank (conv-to-mlp), group (deep-to-shallow), cell (attention-to-rnn): recipe parameters.
    steps_per_stage: alignment steps per stage (joint: times the number of replaced modules).
    finetune_epochs: end-to-end fine-tuning epochs; head_epochs: head-only epochs before it (None:
    finetune_epochs / 6 [ours]); baselines get head_epochs + finetune_epochs epochs.
    batch_size / lr: alignment batch size (CKA depends on it) and AdamW learning rate.
    train_guide: epochs of task training of the guide first (0: use it as it is).
    plateau_window / stop_loss: the shared loop's plateau LR control and stop rule per stage.
    seed: every random draw of the run; n: use the first ``n`` samples of the data (then split).
    finetune_batch_size / finetune_lr (None: lr): fine-tuning, head, guide and baseline training.
    kd_temperature: logit distillation temperature; eval_samples: held-out samples for the CKA tables;
    compare_layers: add the converted × guide ``layer_cka`` table of the first arm.
    """

    recipe: str | None = "conv-to-mlp"
    schedule: list[str] = field(default_factory=lambda: ["progressive"])
    metric: list[str] = field(default_factory=lambda: ["cka"])
    baselines: list[str] = field(default_factory=lambda: ["scratch", "kd"])
    plan: str | None = None
    rank: int = 256
    group: int = 2
    cell: str = "gru"
    steps_per_stage: int = 300
    finetune_epochs: float = 60
    head_epochs: float | None = None
    batch_size: int = 256
    lr: float = 1e-3
    guide_init: list[str] = field(default_factory=lambda: ["trained"])
    train_guide: float = 0
    plateau_window: int = 100
    seed: int = 0
    n: int | None = None
    finetune_batch_size: int = 128
    finetune_lr: float | None = None
    stop_loss: float | None = 0.01
    kd_temperature: float = 4.0
    eval_samples: int = 512
    compare_layers: bool = True

    def validate(self) -> ConvertSettings:
        """Raise a SimkitError naming the first invalid field (in backticks); returns ``self``."""
        _check_names(self.schedule, SCHEDULES, "schedule", "schedule")
        _check_names(self.guide_init, GUIDE_INITS, "guide init", "guide_init")
        if self.baselines:
            _check_names(self.baselines, BASELINES, "baseline", "baselines")
        if not list(self.metric):
            raise SimkitError("`metric` is empty; pass at least one alignment loss: cka, unbiased_cka or dmnn")
        for metric in self.metric:
            alignment_loss(metric)
        if self.recipe is not None and self.recipe not in RECIPES:
            raise unknown_name_error("recipe", str(self.recipe), RECIPES, "or pass a `plan`")
        for name in ("finetune_epochs", "train_guide"):
            value = getattr(self, name)
            if value < 0:
                raise SimkitError(f"`{name}` must be >= 0, got {value}")
        if self.head_epochs is not None and self.head_epochs < 0:
            raise SimkitError(f"`head_epochs` must be >= 0, got {self.head_epochs}")
        for name in ("steps_per_stage", "batch_size", "finetune_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SimkitError(f"`{name}` must be a positive integer, got {value}")
        if self.n is not None and self.n < 1:
            raise SimkitError(f"`n` must be at least 1, got {self.n}")
        for name in ("rank", "group", "eval_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SimkitError(f"`{name}` must be a positive integer, got {value!r}")
        if isinstance(self.plateau_window, bool) or not isinstance(self.plateau_window, int) \
                or self.plateau_window < 0:
            raise SimkitError(f"`plateau_window` must be an integer >= 0 (0 = off), got {self.plateau_window!r}")
        for name in ("finetune_epochs", "train_guide"):
            check_real(name, getattr(self, name), 0)
        check_real("head_epochs", self.head_epochs, 0, optional=True)
        check_real("lr", self.lr, 0, strict=True)
        check_real("finetune_lr", self.finetune_lr, 0, strict=True, optional=True)
        check_real("kd_temperature", self.kd_temperature, 0, strict=True)
        check_real("stop_loss", self.stop_loss, float("-inf"), optional=True)
        return self

    @property
    def effective_head_epochs(self) -> float:
        return self.finetune_epochs / 6 if self.head_epochs is None else self.head_epochs

    @property
    def effective_finetune_lr(self) -> float:
        return self.finetune_lr or self.lr

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (lists as lists): the record in ``inputs.json`` and ``meta.settings``."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, list | tuple) else value


def _check_names(values: Sequence[str], valid: Sequence[str], kind: str, field_name: str) -> list[str]:
    """``values`` without duplicates, in order; unknown names and an empty list are errors."""
    out: list[str] = []
    for v in values:
        if v not in valid:
            raise unknown_name_error(kind, v, valid, f"valid: {', '.join(valid)}")
        if v not in out:
            out.append(v)
    if not out:
        raise SimkitError(f"`{field_name}` is empty; pass at least one of {', '.join(valid)}")
    return out


def unique(values: Sequence[str]) -> list[str]:
    """``values`` without duplicates, in their order."""
    return list(dict.fromkeys(values))

