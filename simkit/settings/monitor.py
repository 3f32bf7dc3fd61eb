"""The settings of similarity during training (torch-free: the command line reads them).

- :class:`ProbeSettings`: what changes the numbers of one measurement on the probe set (its size, the
  measures, the mode, the batch size, the null, the seed, the reduction, which layer pairs, δ);
- :class:`MonitorSettings` (``simkit.Monitor``, the Lightning callback): plus how often (``every``) and
  what to compare against (``reference``: first, final, fixed or alongside);
- :class:`TrendSettings` (``simkit trend``, ``simkit.trend``): plus the reference of a checkpoint series
  (first, final, or a model spec).

Every field is declared once (``simkit.options``); :meth:`ProbeSettings.compare_settings` is the
engine's :class:`~simkit.settings.compare.CompareSettings` of one measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from simkit.catalog import METRICS, strategy
from simkit.errors import SimkitError
from simkit.options import (
    Choice,
    Flag,
    Integer,
    Names,
    Optional,
    Real,
    Settings,
    Text,
    option,
    rule,
    seed_option,
)
from simkit.settings.compare import MODES, REDUCTIONS, CompareSettings

#: the measures a monitor takes: every catalogue measure with a minibatch Gram path or a cheap stored or
#: feature path on a probe set of a few hundred samples (not ridge_r2, whose cross-validated ridge per
#: layer pair costs more than a training step)
MONITOR_METRICS: tuple[str, ...] = tuple(m for m in METRICS if strategy(m, "exact") != "folds")
#: the largest probe set a measure without a streamed (Gram or feature) path takes: stored activations
#: cost n² per layer pair
MAX_STORED_PROBE = 4096
#: what a monitor compares against: its own state at the first measured step, at the last one (from
#: stored probe activations), a fixed reference model, or a second model trained alongside
MONITOR_REFERENCES = ("first", "final", "fixed", "alongside")
#: the references of a checkpoint series besides a model spec
TREND_REFERENCES = ("first", "final")
#: which layer pairs are logged: each layer with the reference layer at the same position, or every pair
PAIRS = ("same", "all")


@dataclass(frozen=True)
class ProbeSettings(Settings):
    """What changes the numbers of one measurement on the probe set (each declaration is its help)."""

    n: int = option(512, Integer(ge=4), "Probe samples: the first N of the data, fixed for the whole run.")
    metrics: list[str] = option(["unbiased_cka"], Names(MONITOR_METRICS, kind="metric"),
                                "Measures, repeatable or a comma list: " + ", ".join(MONITOR_METRICS) + ".",
                                flag="--metric")
    mode: str = option("minibatch", Choice(MODES), "minibatch (per-batch HSIC averaged over the probe's batches; "
                       "a cheap permutation null) or exact (full-probe estimate).")
    batch_size: int = option(128, Integer(ge=4), "Probe samples per batch.")
    null: int | None = option(None, Optional(Integer(ge=0)), "Permutations of the reference's samples for each "
                              "value's chance level (0 = none).", show_default="each measure's default")
    seed: int = seed_option("Seed of the permutation null.")
    reduce: str = option("auto", Choice(REDUCTIONS), "How a layer's output becomes a vector per sample.")
    pairs: str = option("same", Choice(PAIRS), "Layer pairs in the tables and trackers: same (each layer with the "
                        "reference's layer at its position) or all.")
    delta: float = option(0.05, Real(gt=0), "A layer is stable from the first step after which it stays within "
                          "this distance of its final value.")

    @rule
    def _stored_measures_take_a_small_probe(self) -> None:
        stored = [m for m in self.metrics if strategy(m, self.mode) == "stored"]
        if stored and self.n > MAX_STORED_PROBE:
            raise SimkitError(f"`n` is {self.n}, but {', '.join(stored)} store the probe's activations; use "
                              f"`n` <= {MAX_STORED_PROBE} or a CKA measure")

    def compare_settings(self) -> CompareSettings:
        """The engine's settings of one measurement (validated)."""
        return CompareSettings(metrics=list(self.metrics), mode=self.mode, batch_size=self.batch_size,
                               null=self.null, seed=self.seed).validate()


@dataclass(frozen=True)
class MonitorSettings(ProbeSettings):
    """The settings of ``simkit.Monitor`` and ``SimilarityCallback``."""

    every: int = option(100, Integer(ge=1), "Measure every this many training steps.")
    reference: str = option("first", Choice(MONITOR_REFERENCES), "Compare with the model at the first measured "
                            "step, at the final step (computed at the end from stored probe activations), a fixed "
                            "reference model, or a second model trained alongside (the last two: "
                            "`reference_model`).")
    images: bool = option(True, Flag(), "Send each step's layer × layer matrix to the trackers as an image.")


@dataclass(frozen=True)
class TrendSettings(ProbeSettings):
    """The settings of a checkpoint series (``simkit trend``)."""

    reference: str = option("final", Text(), "final (the last checkpoint), first, or a model spec to compare "
                            "every checkpoint with.")
    seed: int = seed_option("Seed of the permutation null and of a reference model spec.")
