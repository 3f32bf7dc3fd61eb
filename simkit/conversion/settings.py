"""``ConvertSettings``: every option of a conversion run that changes its results, in one place.

Fields are named exactly as the ``simkit convert`` parameters and default to the CLI defaults; the
options the CLI does not expose (``finetune_batch_size``, ``finetune_lr``, ``eval_samples``,
``compare_layers``) keep the library defaults. The CLI builds
one from its options (typer parses them; :meth:`ConvertSettings.validate` is where every rule lives);
``inputs.json`` and ``meta.settings_given`` are written from :meth:`to_dict` (the settings as given,
``stop_loss="auto"``), ``meta.settings`` from :meth:`resolved` (what ``"auto"`` and None became).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from simkit.conversion.recipes import RECIPES
from simkit.conversion.schedules import SCHEDULES
from simkit.errors import SimkitError, check_real, unknown_name_error
from simkit.metrics.losses import alignment_loss

GUIDE_INITS = ("trained", "random")
BASELINES = ("scratch", "kd")
#: what a baseline's optimizer steps match: the conversion's total (alignment + head + fine-tuning) or its
#: labelled-training steps (head + fine-tuning: equal labelled epochs)
BASELINE_BUDGETS = ("steps", "labelled")
#: the alignment losses by their catalogue name (``simkit.catalog``), and the alias ``cka`` of ``linear_cka``
METRICS = ("linear_cka", "unbiased_cka", "dmnn")
METRIC_ALIASES = {"cka": "linear_cka"}
#: the name of each metric's loss in ``simkit.metrics.losses``
LOSS_NAMES = {"linear_cka": "cka", "unbiased_cka": "unbiased_cka", "dmnn": "dmnn"}
AUTO_STOP_LOSS = 0.002  # [ours] EMA of the stage loss below which an automatic stage ends


@dataclass
class ConvertSettings:
    """What a conversion does (see ``simkit.conversion.convert``).

    recipe: conv-to-mlp | deep-to-shallow | attention-to-rnn | attention-to-mlp (ignored when a plan is
    given; None with a plan). schedule / metric / guide_init / rank: every combination is converted (one ``runs`` row
    each); metric: ``linear_cka`` (1 − linear CKA; ``cka`` is its alias, read as ``linear_cka``),
    ``unbiased_cka`` or ``dmnn``. baselines: scratch and/or kd (an empty list for none). plan: the ``FILE.py:FUNCTION`` text of
    a plan file, kept for the record (the plan itself is passed to ``convert`` as an object).
    rank (conv-to-mlp; an int or a list, or a comma string ``"64,256"``: a rank sweep), group (deep-to-shallow), cell
    (attention-to-rnn): recipe parameters. Baselines are built with the first rank.
    steps_per_stage: ``"auto"`` (the paper's stage control: a stage ends when the EMA of its loss is
    below ``stop_loss`` or at ``max_stage_steps``; a plateau of the EMA multiplies the LR by
    ``plateau_factor``) or a fixed number of alignment steps per stage (joint: times the number of
    replaced modules). stop_loss: ``"auto"`` (``AUTO_STOP_LOSS`` with ``steps_per_stage="auto"``, off
    with a fixed number), a number, or None (off).
    finetune_epochs: end-to-end fine-tuning epochs; head_epochs: head-only epochs before it (None:
    finetune_epochs / 6 [ours]). Head and fine-tuning are the converted arm's labelled-training epochs;
    when baselines run and ``baseline_epochs`` (capped by ``baseline_max_epochs``) is more, the
    fine-tuning is extended so that the converted arm gets as many labelled-training epochs as the
    baselines (``effective_finetune_epochs``). The fine-tuning keeps its best validation epoch and is
    flagged ``still_improving`` by the baselines' rule.
    val_fraction: share of the training split held out as a validation split (seeded; every arm trains
    on the rest); it chooses the guide's best epoch and stops the baselines; the test split chooses
    nothing. Baselines (scratch, kd) train with the fine-tuning recipe (AdamW at ``finetune_lr``, cosine
    decay, batch ``finetune_batch_size``) for as many optimizer steps as the longest conversion arm
    (``baseline_budget="steps"``: alignment + head + fine-tuning, so the baselines get more labelled
    epochs than the converted arm; ``"labelled"``: its head + fine-tuning only, the same labelled-training
    epochs) or ``baseline_epochs`` epochs (at most ``baseline_max_epochs``), whichever is longer; the weights of
    the best validation epoch are kept, and a best epoch within the last ``baseline_patience`` epochs is
    flagged (``still_improving``: the budget may be short).
    batch_size / lr: alignment batch size (CKA depends on it) and AdamW learning rate.
    train_guide: epochs of task training of the guide first (0: use it as it is): AdamW at
    ``guide_lr``, cosine decay, batch ``finetune_batch_size``; the weights of the best validation epoch
    are kept. [ours, measured on MNIST-1D, 30 epochs: a plain strided CNN without BatchNorm reaches 91 %
    test accuracy at 1e-2 and 64 % at 1e-3; the BatchNorm CNN 97 % at 1e-2, 20 epochs.]
    plateau_window / plateau_factor: the shared loop's plateau LR control per stage (0: off).
    seed: every random draw of the run; seeds: how many seeds run, ``seed``, ``seed`` + 1, ...: every
    arm and baseline (and the guide's training) once per seed, on the data split of ``seed`` (one split
    for every seed), so arms are compared paired by seed. n: use the first ``n`` samples of the data
    (then split).
    kd_alpha: weight of the cross-entropy on the labels in logit distillation, ``kd_alpha``·CE + (1 −
    ``kd_alpha``)·T²·KL(guide ‖ student) at temperature ``kd_temperature`` (0: label-free distillation).
    align_val: add the validation split's inputs (never its labels) to the alignment inputs;
    align_data: the record (a data spec) of a second dataset whose inputs are added to the alignment
    (the dataset itself is passed to ``convert`` as ``align_data``).
    finetune_batch_size / finetune_lr (None: lr): fine-tuning, head, guide and baseline training.
    kd_temperature: logit distillation temperature (T); eval_samples: held-out samples for the CKA tables;
    compare_layers: add the converted × guide ``layer_cka`` table of the first arm.
    """

    recipe: str | None = "conv-to-mlp"
    schedule: list[str] = field(default_factory=lambda: ["progressive"])
    metric: list[str] = field(default_factory=lambda: ["linear_cka"])
    baselines: list[str] = field(default_factory=lambda: ["scratch", "kd"])
    plan: str | None = None
    rank: int | list[int] | str = 256
    group: int = 2
    cell: str = "gru"
    steps_per_stage: int | str = "auto"
    max_stage_steps: int = 1000
    finetune_epochs: float = 60
    head_epochs: float | None = None
    batch_size: int = 256
    lr: float = 1e-3
    guide_init: list[str] = field(default_factory=lambda: ["trained"])
    train_guide: float = 0
    plateau_window: int = 100
    plateau_factor: float = 0.5
    stop_loss: float | str | None = "auto"
    val_fraction: float = 0.1
    baseline_patience: int = 10
    baseline_epochs: float = 60
    baseline_max_epochs: float = 200
    baseline_budget: str = "steps"
    guide_lr: float = 1e-2
    seed: int = 0
    seeds: int = 1
    n: int | None = None
    finetune_batch_size: int = 128
    finetune_lr: float | None = None
    kd_temperature: float = 4.0
    kd_alpha: float = 0.5
    align_val: bool = False
    align_data: str | None = None
    eval_samples: int = 512
    compare_layers: bool = True

    def validate(self) -> ConvertSettings:
        """The one place the rules of a conversion's settings live: a validated, normalised copy (``self``
        when it was validated and has not changed since, so the rules run once per run whichever entry
        point receives it); a SimkitError names the first invalid field (in backticks).

        Normalised: ``steps_per_stage`` ``"auto"`` or an int (a whole-number string such as ``"3"`` is
        read as one), ``stop_loss`` ``"auto"``, a float or None (``"none"`` and number strings are
        read), ``rank`` an int or a list of ints (a comma string ``"64,256"`` is read as a list).
        Nothing is resolved: ``stage_steps`` and ``effective_stop_loss`` say what ``"auto"`` means.
        """
        if vars(self).get("_validated_as") == self.to_dict():
            return self
        steps_per_stage = _steps_per_stage(self.steps_per_stage)
        stop_loss = _stop_loss(self.stop_loss)
        rank = _rank(self.rank)
        _check_names(self.schedule, SCHEDULES, "schedule", "schedule")
        _check_names(self.guide_init, GUIDE_INITS, "guide init", "guide_init")
        if self.baselines:
            _check_names(self.baselines, BASELINES, "baseline", "baselines")
        metric = _metrics(self.metric)
        if self.recipe is not None and self.recipe not in RECIPES:
            raise unknown_name_error("recipe", str(self.recipe), RECIPES, "or pass a `plan`")
        for name in ("finetune_epochs", "train_guide"):
            value = getattr(self, name)
            if value < 0:
                raise SimkitError(f"`{name}` must be >= 0, got {value}")
        if self.head_epochs is not None and self.head_epochs < 0:
            raise SimkitError(f"`head_epochs` must be >= 0, got {self.head_epochs}")
        check_real("val_fraction", self.val_fraction, 0)
        if not self.val_fraction < 0.9:
            raise SimkitError(f"`val_fraction` must be in [0, 0.9), got {self.val_fraction}")
        check_real("plateau_factor", self.plateau_factor, 0, strict=True)
        if not self.plateau_factor < 1:
            raise SimkitError(f"`plateau_factor` must be in (0, 1), got {self.plateau_factor}")
        check_real("baseline_epochs", self.baseline_epochs, 0)
        check_real("baseline_max_epochs", self.baseline_max_epochs, 0)
        if self.baseline_budget not in BASELINE_BUDGETS:
            raise SimkitError(f"`baseline_budget` must be one of {', '.join(BASELINE_BUDGETS)}, got "
                              f"{self.baseline_budget!r}")
        check_real("guide_lr", self.guide_lr, 0, strict=True)
        for name in ("max_stage_steps", "baseline_patience", "batch_size", "finetune_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SimkitError(f"`{name}` must be a positive integer, got {value}")
        if self.n is not None and self.n < 1:
            raise SimkitError(f"`n` must be at least 1, got {self.n}")
        for name in ("group", "eval_samples"):
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
        self._check_seeds_and_extras()
        out = dataclasses.replace(self, steps_per_stage=steps_per_stage, stop_loss=stop_loss, rank=rank,
                                  metric=metric)
        vars(out)["_validated_as"] = out.to_dict()
        return out

    def _check_seeds_and_extras(self) -> None:
        """The rules of ``seeds``, ``kd_alpha``, ``align_val`` and ``align_data``."""
        if isinstance(self.seeds, bool) or not isinstance(self.seeds, int) or self.seeds < 1:
            raise SimkitError(f"`seeds` must be a positive integer, got {self.seeds!r}")
        check_real("kd_alpha", self.kd_alpha, 0)
        if not self.kd_alpha <= 1:
            raise SimkitError(f"`kd_alpha` must be in [0, 1] (0: label-free distillation), got {self.kd_alpha}")
        if not isinstance(self.align_val, bool):
            raise SimkitError(f"`align_val` must be true or false, got {self.align_val!r}")
        if self.align_val and self.val_fraction <= 0:
            raise SimkitError("`align_val` adds the validation inputs to the alignment, but `val_fraction` is 0 "
                              "(no validation split); set `val_fraction` > 0 or drop `align_val`")
        if self.align_data is not None and (not isinstance(self.align_data, str) or not self.align_data.strip()):
            raise SimkitError(f"`align_data` must be a data spec (text) or None, got {self.align_data!r}")

    def seed_list(self) -> list[int]:
        """The seeds of the repeats: ``seed``, ``seed`` + 1, ..., ``seeds`` of them."""
        return [self.seed + i for i in range(self.seeds)]

    @property
    def baseline_budget_epochs(self) -> float:
        """The baselines' epochs before the step rule: ``baseline_epochs`` capped by ``baseline_max_epochs``."""
        return min(self.baseline_epochs, self.baseline_max_epochs)

    @property
    def effective_finetune_epochs(self) -> float:
        """``finetune_epochs``, extended when baselines run so that head + fine-tuning epochs (the converted
        arm's labelled-training epochs) are at least the baselines' :attr:`baseline_budget_epochs`."""
        if not self.baselines:
            return self.finetune_epochs
        return max(self.finetune_epochs, self.baseline_budget_epochs - self.effective_head_epochs)

    @property
    def ranks(self) -> list[int]:
        """``rank`` as a list (a rank sweep when longer than one), duplicates dropped."""
        rank = _rank(self.rank)
        return list(dict.fromkeys(rank if isinstance(rank, list) else [rank]))

    @property
    def auto_stages(self) -> bool:
        return self.steps_per_stage == "auto"

    @property
    def stage_steps(self) -> int:
        """The step budget (cap) of one stage: ``max_stage_steps`` when automatic, else ``steps_per_stage``."""
        return self.max_stage_steps if self.auto_stages else int(self.steps_per_stage)

    @property
    def effective_stop_loss(self) -> float | None:
        """The stage-loss threshold in force: ``AUTO_STOP_LOSS`` for automatic stages, else off, unless set."""
        if self.stop_loss == "auto":
            return AUTO_STOP_LOSS if self.auto_stages else None
        return None if self.stop_loss is None else float(self.stop_loss)

    def resolved(self) -> dict[str, Any]:
        """:meth:`to_dict` with what ``"auto"`` and None resolve to (``meta.settings``; ``to_dict()`` is the
        record as given, ``inputs.json`` and ``meta.settings_given``): ``stop_loss`` the threshold in force
        (None: off), ``stage_steps`` the step budget of one stage (the cap ``max_stage_steps`` when
        automatic), ``head_epochs``, ``finetune_epochs`` (extended to the baselines' epochs),
        ``finetune_lr`` and ``guide_lr`` as used."""
        return {**self.to_dict(), "head_epochs": self.effective_head_epochs,
                "finetune_epochs": self.effective_finetune_epochs,
                "finetune_lr": self.effective_finetune_lr, "guide_lr": self.effective_guide_lr,
                "stop_loss": self.effective_stop_loss, "stage_steps": self.stage_steps}

    @property
    def effective_guide_lr(self) -> float:
        return float(self.guide_lr)

    @property
    def effective_head_epochs(self) -> float:
        return self.finetune_epochs / 6 if self.head_epochs is None else self.head_epochs

    @property
    def effective_finetune_lr(self) -> float:
        return self.finetune_lr or self.lr

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (lists as lists): the record in ``inputs.json`` and ``meta.settings``."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _metrics(values: Sequence[str]) -> list[str]:
    """``metric`` normalised: catalogue names (``cka`` read as ``linear_cka``), each checked, duplicates
    dropped; unknown names and an empty list are errors."""
    if isinstance(values, str) or not list(values):
        raise SimkitError("`metric` is empty or not a list; pass at least one alignment loss: linear_cka (alias "
                          "cka), unbiased_cka or dmnn")
    names = [METRIC_ALIASES.get(str(v), str(v)) for v in values]
    for name, given in zip(names, values, strict=True):
        if name not in METRICS:
            raise unknown_name_error("alignment loss", str(given), (*METRICS, *METRIC_ALIASES),
                                     "valid: linear_cka (alias cka), unbiased_cka, dmnn")
        alignment_loss(LOSS_NAMES[name])
    return unique(names)


def _steps_per_stage(value: Any) -> int | str:
    """``steps_per_stage`` normalised: ``"auto"`` or a positive int."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        if text.lstrip("+").isdigit():
            value = int(text)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SimkitError(f"`steps_per_stage` must be 'auto' or a positive integer, got {value!r}")
    return value


def _stop_loss(value: Any) -> float | str | None:
    """``stop_loss`` normalised: ``"auto"``, None (off) or a finite float."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("auto", "none"):
            return "auto" if text == "auto" else None
        try:
            value = float(text)
        except ValueError:
            raise SimkitError(f"`stop_loss` must be a number, 'auto' or 'none' (off), got {value!r}") from None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SimkitError(f"`stop_loss` must be a number, 'auto' or 'none' (off), got {value!r}")
    check_real("stop_loss", value, float("-inf"))
    return value


def _rank(value: Any) -> int | list[int]:
    """``rank`` normalised: a positive int or a list of them (a comma string is read: one value → an int)."""
    if isinstance(value, str):
        values: list[Any] = [int(p) if p.lstrip("+").isdigit() else p
                             for p in (part.strip() for part in value.split(",")) if p]
    else:
        values = list(value) if isinstance(value, list | tuple) else [value]
    if not values or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in values):
        raise SimkitError(f"`rank` must be a positive integer or a comma list of them (or a list), got {value!r}")
    if isinstance(value, str):
        return values[0] if len(values) == 1 else values
    return values if isinstance(value, list | tuple) else values[0]


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

