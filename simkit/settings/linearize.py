"""The settings of a linearization sweep (``simkit linearize``): every option that changes its results,
declared once (torch-free: the command line builds its options from these declarations).

Fields are named as the command's parameters (``granularity``, ``omega``, ``train``, ...) and default to
its defaults; ``eps``, ``freeze_tol`` and ``cka_samples`` have no flag (library callers only).
``validate()`` (``simkit.options.Settings``) returns the checked, normalised copy the runner uses;
``to_dict()`` is what ``inputs.json`` and ``meta.settings`` record.
"""

from __future__ import annotations

from dataclasses import dataclass

from simkit.errors import SimkitError
from simkit.options import (
    Flag,
    Integer,
    Names,
    Numbers,
    Real,
    Settings,
    option,
    rule,
    seed_option,
    seeds_option,
)

#: how many slopes α an activation site gets: one per channel, or one for the whole site
GRANULARITIES = ("channel", "layer")
#: the penalty weights ω of the default sweep
DEFAULT_OMEGAS = (1e-4, 1e-3, 1e-2, 1e-1)
#: |α − 1| below which a slope is frozen at exactly 1
FREEZE_TOL = 0.01

__all__ = ["DEFAULT_OMEGAS", "FREEZE_TOL", "GRANULARITIES", "LinearizeSettings"]


@dataclass(frozen=True)
class LinearizeSettings(Settings):
    """One ω × granularity sweep (each field's declaration is its help).

    granularity: "channel" (one α per channel) and/or "layer" (one α per activation site); omega: the
    penalty weights ω. Every combination is one run; a value listed twice runs once (ω values equal
    to 6 significant digits are still distinct runs). epochs: post-training epochs per run; train:
    epochs of plain training of the model first (0: the model is used as it is); lr / slope_lr:
    learning rates of the weights and of the slopes α; batch_size: samples per training batch;
    fold: fold fully linear stretches and report depth and size; cka: linear CKA of every run against
    the original (on up to ``cka_samples`` test samples); seed: the train/test split (when the data
    has no native test split) and training; seeds: how many seeds to run, ``seed``, ``seed`` + 1, ...:
    the whole sweep (and the pre-training when ``train`` > 0) repeats once per seed, on the one split
    drawn by ``seed``, and the tables aggregate mean ± spread over seeds; eps: ε of the penalty
    Σ(|1 − α| + ε)^0.5; freeze_tol: |α − 1| below which a slope is frozen at 1; recover: epochs of
    recovery after post-training (0: none): every run's slopes are fixed as they ended (linear units
    stay linear, the others keep their α), the penalty is dropped and the weights are fine-tuned with
    cross-entropy alone; the runs table then has ``accuracy_recovered`` beside ``accuracy`` (before).
    recover_shape: before recovery, keep the units at α = 1 linear and reset every other α to 0 (a
    ReLU), so recovery fine-tunes the network of the shape post-training found (``accuracy_shape_reset``:
    right after the reset); recover_val_fraction: hold out this fraction of the training split and keep
    recovery's best epoch on it (``recover_best_step``, ``recover_val_accuracy``; 0: keep the last);
    napl_threshold: NAPL, APL and the nonlinear fractions count a unit as nonlinear only when
    |1 − α| exceeds it (0: whenever α ≠ 1, the paper's count).
    """

    granularity: list[str] = option(list(GRANULARITIES), Names(GRANULARITIES, kind="granularity"),
                                    "channel, layer or both (comma list).")
    omega: list[float] = option(list(DEFAULT_OMEGAS), Numbers(Real(ge=0)), "Penalty weights ω (comma list).")
    epochs: float = option(5.0, Real(gt=0), "Post-training epochs per run.")
    train: float = option(0.0, Real(ge=0), "Train MODEL for this many epochs first (demo).")
    lr: float = option(1e-3, Real(gt=0), "Learning rate of the weights.")
    slope_lr: float = option(1e-2, Real(gt=0), "Learning rate of the slopes α.")
    batch_size: int = option(128, Integer(ge=1), "Samples per training batch.")
    fold: bool = option(False, Flag(), "Fold fully linear stretches; report depth and size.")
    cka: bool = option(True, Flag(), "CKA of each run against the original.", flag="--cka/--no-cka")
    seed: int = seed_option()
    seeds: int = seeds_option("Number of seeds: the sweep runs for --seed, --seed+1, ... and the report shows "
                              "mean ± spread (error bars).")
    eps: float = option(1e-3, Real(ge=0), "ε of the slope penalty Σ(|1 − α| + ε)^0.5.", cli=False)
    freeze_tol: float = option(FREEZE_TOL, Real(ge=0), "|α − 1| below which a slope is frozen at exactly 1.",
                               cli=False)
    cka_samples: int = option(512, Integer(ge=1), "Test samples the CKA against the original uses, at most.",
                              cli=False)
    recover: float = option(0.0, Real(ge=0), "After post-training, fine-tune each run's weights for this many "
                            "epochs with its slopes fixed and no penalty (0: no recovery); runs.csv adds "
                            "accuracy_recovered.")
    recover_shape: bool = option(False, Flag(), "With --recover: before recovery, units at α = 1 stay linear and "
                                 "every other α is reset to 0 (a ReLU), all slopes fixed (compare shapes, not "
                                 "partial slopes); runs.csv adds accuracy_shape_reset.")
    recover_val_fraction: float = option(0.0, Real(ge=0, lt=1), "With --recover: hold out this fraction of the "
                                         "training split and keep recovery's best epoch on it (0: keep the "
                                         "last epoch).")
    napl_threshold: float = option(0.0, Real(ge=0), "Count a unit as nonlinear in NAPL, APL and the nonlinear "
                                   "fractions only when |1 − α| exceeds this (0: whenever α ≠ 1).")

    @rule
    def _recovery_options_need_recovery(self) -> None:
        """``recover_shape`` and ``recover_val_fraction`` shape a recovery: they need ``recover`` > 0."""
        if self.recover == 0 and (self.recover_shape or self.recover_val_fraction > 0):
            raise SimkitError("`recover_shape` and `recover_val_fraction` shape the recovery; "
                              "set `recover` to its epochs (> 0) or leave them off")

    def granularities(self) -> list[str]:
        """The granularities to run, each once, in the order given."""
        return list(dict.fromkeys(self.granularity))

    def omegas(self) -> list[float]:
        """The ω values to run as floats, each once (-0.0 read as 0.0), in the order given."""
        return list(dict.fromkeys(float(w) + 0.0 for w in self.omega))
