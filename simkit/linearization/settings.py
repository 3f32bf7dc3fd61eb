"""The settings of a linearization sweep (``simkit linearize``): every option that changes its results.

Fields are named as the command's parameters (``granularity``, ``omega``, ``train``, ...) and default
to its defaults; ``eps``, ``freeze_tol`` and ``cka_samples`` have no flag (library callers only).
``to_dict()`` is what ``inputs.json`` and ``meta.settings`` record.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from simkit.errors import SimkitError, check_real
from simkit.linearization.prelu import GRANULARITIES
from simkit.linearization.slope import FREEZE_TOL

DEFAULT_OMEGAS = (1e-4, 1e-3, 1e-2, 1e-1)


@dataclass
class LinearizeSettings:
    """One ω × granularity sweep.

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
    """

    granularity: list[str] = field(default_factory=lambda: list(GRANULARITIES))
    omega: list[float] = field(default_factory=lambda: list(DEFAULT_OMEGAS))
    epochs: float = 5.0
    train: float = 0.0
    lr: float = 1e-3
    slope_lr: float = 1e-2
    batch_size: int = 128
    fold: bool = False
    cka: bool = True
    seed: int = 0
    seeds: int = 1
    eps: float = 1e-3
    freeze_tol: float = FREEZE_TOL
    cka_samples: int = 512
    recover: float = 0.0

    def validate(self) -> None:
        """Raise SimkitError (naming the field in backticks) for settings that cannot run."""
        for name, example in (("granularity", "['channel', 'layer']"), ("omega", "[1e-3, 1e-2]")):
            value = getattr(self, name)
            if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
                raise SimkitError(f"`{name}` must be a list such as {example}, got {value!r}")
        granularities = list(self.granularity)
        bad = [g for g in granularities if g not in GRANULARITIES]
        if bad or not granularities:
            raise SimkitError(f"`granularity`: unknown granularity {', '.join(map(repr, bad)) or '(none)'}; "
                              "use channel, layer or both")
        omegas = list(self.omega)
        if not omegas or any(not _number(w) or not (w >= 0 and math.isfinite(w)) for w in omegas):
            raise SimkitError(f"`omega` values must be finite numbers >= 0, got {omegas}")
        if not _number(self.epochs) or not self.epochs > 0:
            raise SimkitError(f"`epochs` must be > 0 for post-training, got {self.epochs}")
        for name in ("train", "lr", "slope_lr", "eps", "freeze_tol", "recover"):
            value = getattr(self, name)
            if not _number(value) or math.isnan(value):
                raise SimkitError(f"`{name}` must be a number, got {value!r}")
        check_real("epochs", self.epochs, 0, strict=True)
        check_real("train", self.train, 0)
        check_real("recover", self.recover, 0)
        check_real("lr", self.lr, 0, strict=True)
        check_real("slope_lr", self.slope_lr, 0, strict=True)
        check_real("eps", self.eps, 0)
        check_real("freeze_tol", self.freeze_tol, 0)
        for name in ("batch_size", "cka_samples", "seeds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SimkitError(f"`{name}` must be a positive integer, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise SimkitError(f"`seed` must be an integer, got {self.seed!r}")

    def seed_list(self) -> list[int]:
        """The seeds of the repeats: ``seed``, ``seed`` + 1, ..., ``seeds`` of them."""
        return [self.seed + i for i in range(self.seeds)]

    def granularities(self) -> list[str]:
        """The granularities to run, each once, in the order given."""
        return list(dict.fromkeys(self.granularity))

    def omegas(self) -> list[float]:
        """The ω values to run as floats, each once (-0.0 read as 0.0), in the order given."""
        return list(dict.fromkeys(float(w) + 0.0 for w in self.omega))

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON values (lists as given: repeated values stay)."""
        out = asdict(self)
        out["granularity"] = [str(g) for g in self.granularity]
        out["omega"] = [float(w) for w in self.omega]
        return out


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)

