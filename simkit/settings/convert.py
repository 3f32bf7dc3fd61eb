"""The settings of a conversion (Network of Theseus), declared once: :class:`ConvertSettings` (torch-free:
the CLI reads it).

Every field is declared with ``simkit.options.option`` (default, constraint, help, flag); the generic
``validate()`` applies the declarations and the class's :func:`~simkit.options.rule` methods, and
``simkit convert``'s options are generated from them. ``inputs.json`` and ``meta.settings_given`` are
written from :meth:`ConvertSettings.to_dict` (the settings as given, ``stop_loss="auto"``),
``meta.settings`` from :meth:`ConvertSettings.resolved` (what ``"auto"`` and None became).

The names the settings choose from live here, and the torch modules import them from here: the recipes
(``simkit.conversion.recipes``), schedules (``simkit.conversion.schedules``), recurrent cells
(``simkit.conversion.modules``), alignment losses (``simkit.conversion.context``), guide inits and
baselines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simkit.errors import SimkitError
from simkit.options import (
    Auto,
    Choice,
    Flag,
    Integer,
    Names,
    Numbers,
    Optional,
    Real,
    Settings,
    Text,
    n_option,
    option,
    rule,
    seed_option,
    seeds_option,
)

#: the built-in recipes (``simkit.conversion.recipes.make_plan``)
RECIPES = ("conv-to-mlp", "deep-to-shallow", "attention-to-rnn", "attention-to-mlp")
#: the conversion schedules (``simkit.conversion.schedules.plan_stages``)
SCHEDULES = ("progressive", "sequential", "independent", "joint")
#: attention-to-rnn's recurrent cells (``simkit.conversion.modules.CELL_MODULES``)
CELLS = ("gru", "lstm", "rnn")
GUIDE_INITS = ("trained", "random")
BASELINES = ("scratch", "kd")
#: the budget rule of the labelled training: ``plateau`` (every arm until it is no longer still improving on
#: validation, at least equal labelled epochs, at most a cap), or the earlier rules: a baseline's optimizer
#: steps match the conversion's total (``steps``: alignment + head + fine-tuning) or its labelled-training
#: steps (``labelled``: head + fine-tuning)
BASELINE_BUDGETS = ("plateau", "steps", "labelled")
#: the alignment losses by their catalogue name (``simkit.catalog``); ``cka`` is read as ``linear_cka``
ALIGNMENT_METRICS = ("linear_cka", "unbiased_cka", "dmnn")
METRIC_ALIASES = (("cka", "linear_cka"),)
AUTO_STOP_LOSS = 0.002  # [ours] EMA of the stage loss below which an automatic stage ends

__all__ = ["ALIGNMENT_METRICS", "AUTO_STOP_LOSS", "BASELINES", "BASELINE_BUDGETS", "CELLS", "GUIDE_INITS",
           "RECIPES", "SCHEDULES", "ConvertSettings"]


@dataclass(frozen=True)
class ConvertSettings(Settings):
    """What a conversion does (see ``simkit.conversion.convert``); each field's declaration is its help.

    schedule / metric / guide_init / rank: every combination is converted (one ``runs`` row each). plan:
    the ``FILE.py:FUNCTION`` text of a plan file, kept for the record (the plan itself is passed to
    ``convert`` as an object); with it, ``recipe`` is None. rank: an int or a list (a comma string
    ``"64,256"`` is read as one): a rank sweep; baselines are built with the first rank.
    steps_per_stage ``"auto"``: the paper's stage control (a stage ends when the EMA of its loss is below
    ``stop_loss`` or at ``max_stage_steps``; a plateau of the EMA multiplies the LR by ``plateau_factor``).
    stop_loss ``"auto"``: ``AUTO_STOP_LOSS`` with ``steps_per_stage="auto"``, off with a fixed number.
    Head and fine-tuning are the converted arm's labelled-training epochs; when baselines run and
    ``baseline_epochs`` (capped by ``baseline_max_epochs``) is more, the fine-tuning is extended to match
    (:attr:`effective_finetune_epochs`). ``baseline_budget`` ``"plateau"`` (the default): every arm's
    labelled training (the converted arm's fine-tuning, the scratch and distillation baselines; the guide's
    training too) runs with AdamW at ``finetune_lr``, a constant LR halved after ``baseline_patience`` // 2
    epochs without a better validation score, until its best validation epoch is ``baseline_patience``
    epochs back (no longer still improving), never before :attr:`floor_epochs` labelled epochs (the
    baselines also never before the longest converted arm's labelled steps; for a language model those count
    its alignment steps) and never past :attr:`cap_epochs` (``baseline_max_epochs``). ``"steps"`` and
    ``"labelled"`` (the earlier rules): baselines train with the fine-tuning recipe (cosine decay) for as
    many optimizer steps as the longest arm (all of them, or its head + fine-tuning) or
    ``baseline_epochs``, whichever is longer. Every arm keeps its best validation epoch. seeds: every arm and baseline (and the guide's training) once per seed of
    :meth:`seed_list`, on the data split of ``seed``, so arms are compared paired by seed. align_data:
    the record (a data spec) of a second dataset passed to ``convert`` as ``align_data``. [ours, measured
    on MNIST-1D, 30 epochs: a plain strided CNN without BatchNorm reaches 91 % test accuracy at a guide_lr
    of 1e-2 and 64 % at 1e-3; the BatchNorm CNN 97 % at 1e-2, 20 epochs.]
    """

    recipe: str | None = option(
        "conv-to-mlp", Optional(Choice(RECIPES)), "conv-to-mlp, deep-to-shallow, attention-to-rnn or "
        "attention-to-mlp (ignored with --plan).")
    schedule: list[str] = option(
        ["progressive"], Names(SCHEDULES, kind="schedule"), "progressive, sequential, independent, joint "
        "(comma list).")
    metric: list[str] = option(
        ["linear_cka"], Names(ALIGNMENT_METRICS, kind="alignment loss", aliases=METRIC_ALIASES),
        "Alignment loss: linear_cka (1 − linear CKA; alias cka), unbiased_cka, dmnn (comma list).")
    baselines: list[str] = option(
        list(BASELINES), Names(BASELINES, kind="baseline", empty=True), "Comma list of scratch, kd; 'none' for "
        "no baseline.")
    plan: str | None = option(
        None, Optional(Text()), "FILE.py:FUNCTION returning a ReplacementPlan (runs that file's code).")
    rank: int | list[int] = option(
        256, Numbers(Integer(ge=1), scalar=True), "Rank of conv-to-mlp's low-rank linear maps; a comma list "
        "(64,256,1024) is a rank sweep (one arm per rank; baselines use the first).")
    group: int = option(2, Integer(ge=1), "deep-to-shallow: guide blocks per target block.")
    cell: str = option("gru", Choice(CELLS), "attention-to-rnn: gru, lstm or rnn.")
    steps_per_stage: int | str = option(
        "auto", Auto(Integer(ge=1)), "'auto': a stage ends when the EMA of its alignment loss is below "
        "--stop-loss or at --max-stage-steps (the LR anneals on plateaus); or a fixed number of steps per stage "
        "(joint: times the number of replaced modules).")
    max_stage_steps: int = option(
        1000, Integer(ge=1), "Step cap of one automatic stage (joint: times the number of modules).")
    finetune_epochs: float = option(
        60.0, Real(ge=0), "Epochs of end-to-end fine-tuning (baselines get these plus the head epochs).")
    head_epochs: float | None = option(
        None, Optional(Real(ge=0)), "Head-only epochs before fine-tuning (default: finetune epochs / 6).")
    batch_size: int = option(256, Integer(ge=1), "Alignment batch size (CKA depends on it).")
    lr: float = option(1e-3, Real(gt=0), "AdamW learning rate (alignment and fine-tuning).")
    guide_init: list[str] = option(
        ["trained"], Names(GUIDE_INITS, kind="guide init"), "trained (the guide as loaded/trained) or random "
        "(an untrained copy); comma list.")
    train_guide: float = option(
        0.0, Real(ge=0), "Train the guide on the task for this many epochs first (0 = use as is).")
    plateau_window: int = option(
        100, Integer(ge=0), "Steps of the alignment-loss EMA between plateau checks (0 = off).")
    plateau_factor: float = option(
        0.5, Real(gt=0, lt=1), "LR multiplier when the alignment-loss EMA plateaus.")
    stop_loss: float | str | None = option(
        "auto", Auto(Optional(Real(), none_word="none")), "End a stage when the EMA of its loss falls below "
        f"this; 'auto' = {AUTO_STOP_LOSS:g} with --steps-per-stage auto and off with a fixed number; 'none' = off.")
    val_fraction: float = option(
        0.1, Real(ge=0, lt=0.9), "Share of the training split held out for validation: it picks the guide's "
        "best epoch and stops the baselines (the test split chooses nothing; 0 = none).")
    baseline_patience: int = option(
        10, Integer(ge=1), "A baseline whose best validation epoch is within its last this-many epochs is "
        "flagged as still improving.")
    baseline_epochs: float = option(
        60.0, Real(ge=0), "Baselines train with the fine-tuning recipe for this many epochs or the "
        "conversion's optimizer-step count, whichever is longer; the best validation epoch is kept.")
    baseline_max_epochs: float = option(
        200.0, Real(ge=0), "plateau budget: the cap of every arm's labelled epochs, stated in advance (never "
        "below the floor); steps/labelled: the cap of --baseline-epochs (the conversion's step count, if "
        "longer, wins).")
    baseline_budget: str = option(
        "plateau", Choice(BASELINE_BUDGETS), "The budget rule. plateau = every arm (converted, scratch, kd; "
        "the guide's training too) trains until it is no longer still improving on validation (best epoch "
        "--baseline-patience epochs back; LR halved after half as many), at least the converted arm's head + "
        "fine-tuning epochs (equal labelled epochs; for a language model its alignment steps count), at most "
        "--baseline-max-epochs. Earlier rules: steps = baselines get the conversion's total optimizer steps "
        "(alignment + head + fine-tuning), labelled = its head + fine-tuning steps.")
    guide_lr: float = option(
        1e-2, Real(gt=0), "--train-guide learning rate (AdamW, cosine decay, batch 128, the best validation "
        "epoch kept).")
    seed: int = seed_option()
    seeds: int = seeds_option(
        "Number of seeds: everything (guide training, every arm and baseline) runs for --seed, --seed+1, ... "
        "(each seed builds GUIDE with its seed); aggregate.csv and the report give mean, std and 95 % t "
        "interval, and converted − scratch paired by seed.")
    n: int | None = n_option()
    finetune_batch_size: int = option(
        128, Integer(ge=1), "Batch size of fine-tuning, head, guide and baseline training.", cli=False)
    finetune_lr: float | None = option(
        None, Optional(Real(gt=0)), "Learning rate of fine-tuning, head and baseline training (None: lr).",
        cli=False)
    kd_temperature: float = option(4.0, Real(gt=0), "Distillation baseline: temperature T of the KL term.")
    kd_alpha: float = option(
        0.5, Real(ge=0, le=1), "Distillation baseline: weight of the cross-entropy on the labels, alpha·CE + "
        "(1 − alpha)·T²·KL to the guide (0 = label-free distillation).")
    align_val: bool = option(
        False, Flag(), "Add the validation split's inputs (never its labels) to the alignment inputs.",
        flag="--align-val/--no-align-val")
    align_data: str | None = option(
        None, Optional(Text()), "A second data spec whose inputs (never its labels) are added to the alignment "
        "inputs; shaped like --data.")
    eval_samples: int = option(512, Integer(ge=1), "Held-out samples for the CKA tables.", cli=False)
    compare_layers: bool = option(
        True, Flag(), "Add the converted × guide layer_cka table of the first arm.", cli=False)

    @rule
    def _plan_replaces_recipe(self) -> dict[str, Any] | None:
        """A plan file replaces the recipe: ``recipe`` is None with a ``plan``."""
        return {"recipe": None} if self.plan is not None else None

    @rule
    def _align_val_needs_validation(self) -> None:
        """``align_val`` adds the validation inputs, so it needs a validation split."""
        if self.align_val and self.val_fraction <= 0:
            raise SimkitError("`align_val` adds the validation inputs to the alignment, but `val_fraction` is 0 "
                              "(no validation split); set `val_fraction` > 0 or drop `align_val`")

    @property
    def baseline_budget_epochs(self) -> float:
        """The baselines' epochs before the step rule: ``baseline_epochs`` capped by ``baseline_max_epochs``."""
        return min(self.baseline_epochs, self.baseline_max_epochs)

    @property
    def plateau_budget(self) -> bool:
        """Whether every arm trains to its validation plateau (``baseline_budget="plateau"``)."""
        return self.baseline_budget == "plateau"

    @property
    def floor_epochs(self) -> float:
        """The plateau rule's floor: the labelled epochs every arm trains at least, the converted arm's head +
        fine-tuning (:attr:`effective_head_epochs` + :attr:`effective_finetune_epochs`)."""
        return self.effective_head_epochs + self.effective_finetune_epochs

    @property
    def cap_epochs(self) -> float:
        """The plateau rule's cap of every arm's labelled epochs: ``baseline_max_epochs``, never below the floor."""
        return max(self.baseline_max_epochs, self.floor_epochs)

    @property
    def effective_finetune_epochs(self) -> float:
        """``finetune_epochs``, extended when baselines run so that head + fine-tuning epochs (the converted
        arm's labelled-training epochs) are at least the baselines' :attr:`baseline_budget_epochs`."""
        if not self.baselines:
            return self.finetune_epochs
        return max(self.finetune_epochs, self.baseline_budget_epochs - self.effective_head_epochs)

    @property
    def ranks(self) -> list[int]:
        """``rank`` (validated) as a list (a rank sweep when longer than one), duplicates dropped."""
        return list(dict.fromkeys(self.rank if isinstance(self.rank, list) else [self.rank]))

    @property
    def auto_stages(self) -> bool:
        """Whether stages end by the paper's stage control (``steps_per_stage="auto"``)."""
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

    @property
    def effective_guide_lr(self) -> float:
        """The guide's training learning rate as used."""
        return float(self.guide_lr)

    @property
    def effective_head_epochs(self) -> float:
        """``head_epochs``, or ``finetune_epochs`` / 6 [ours] when None."""
        return self.finetune_epochs / 6 if self.head_epochs is None else self.head_epochs

    @property
    def effective_finetune_lr(self) -> float:
        """``finetune_lr``, or ``lr`` when None."""
        return self.finetune_lr or self.lr

    def resolved(self) -> dict[str, Any]:
        """:meth:`to_dict` with what ``"auto"`` and None resolve to (``meta.settings``; ``to_dict()`` is the
        record as given, ``inputs.json`` and ``meta.settings_given``): ``stop_loss`` the threshold in force
        (None: off), ``stage_steps`` the step budget of one stage (the cap ``max_stage_steps`` when
        automatic), ``head_epochs``, ``finetune_epochs`` (extended to the baselines' epochs),
        ``finetune_lr`` and ``guide_lr`` as used; with the plateau rule its ``floor_epochs`` and ``cap_epochs``."""
        budget = {"floor_epochs": self.floor_epochs, "cap_epochs": self.cap_epochs} if self.plateau_budget else {}
        return {**self.to_dict(), **budget, "head_epochs": self.effective_head_epochs,
                "finetune_epochs": self.effective_finetune_epochs,
                "finetune_lr": self.effective_finetune_lr, "guide_lr": self.effective_guide_lr,
                "stop_loss": self.effective_stop_loss, "stage_steps": self.stage_steps}
