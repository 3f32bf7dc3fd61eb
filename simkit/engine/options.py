"""The options every engine entry point shares (compare, compare_caches, study), checked once.

``engine_options(...)`` validates them before any work (library errors name the arguments in
backticks; the CLI turns those into its flags) and returns :class:`EngineOptions`, which feeds the
accumulator (``accumulator_options``) and the result's ``meta.settings`` (``settings``), so every entry
point records the same provenance.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from simkit.engine.batches import check_batch_size
from simkit.errors import SimkitError, unknown_name_error
from simkit.forward import resolve_device
from simkit.metrics.settings import MeasureSettings, measure_settings
from simkit.metrics.streaming import METRICS, MODES

# unbiased_cka first: in minibatch mode it is Nguyen et al.'s estimator (unbiased HSIC_1 per batch), and the
# report leads with the first metric; linear_cka (biased HSIC) is kept beside it for comparison
DEFAULT_METRICS = ("unbiased_cka", "linear_cka")
DEFAULT_MEMORY_BUDGET = 2**30
# ``null=None``: this many permutations when every metric takes the minibatch Gram path (there the null
# permutes the batch's b × b Grams: no extra forward pass, within the timing noise of the quick start,
# see README "What each mode computes"), else none (an exact-mode null stores the activations instead of
# streaming feature sums: +32 to +39 % CPU at n = 256 for ResNet-18 vs 34; benchmarks/bench_null.py)
DEFAULT_NULL = 10
_GRAM_METRICS = frozenset({"linear_cka", "unbiased_cka", "rbf_cka"})


def default_null(metrics: Sequence[str], mode: str) -> int:
    """The permutations ``null=None`` stands for: :data:`DEFAULT_NULL` in minibatch mode when every
    metric is a minibatch CKA (linear, unbiased, RBF), else 0."""
    return DEFAULT_NULL if mode == "minibatch" and set(metrics) <= _GRAM_METRICS else 0


def check_metrics(metrics: Sequence[str]) -> list[str]:
    """Validated, de-duplicated metric names in the given order."""
    if isinstance(metrics, str):
        metrics = [metrics]
    out: list[str] = []
    for name in metrics:
        if name not in METRICS:
            raise unknown_name_error("metric", name, METRICS, "valid: " + ", ".join(METRICS))
        if name not in out:
            out.append(name)
    if not out:
        raise SimkitError("no metric chosen; pass at least one of " + ", ".join(METRICS) + " in `metrics`")
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class EngineOptions:
    """What changes the numbers of a comparison, validated (see :func:`engine_options`)."""

    metrics: list[str]
    mode: str
    batch_size: int
    n: int | None
    null: int
    seed: int
    rbf_factor: float
    knn_k: int
    memory_budget_bytes: int
    device: torch.device
    measures: MeasureSettings = MeasureSettings()

    def accumulator_options(self) -> dict[str, Any]:
        """Keyword arguments of ``simkit.metrics.streaming.make_accumulator`` besides metrics and mode."""
        return {"null": self.null, "seed": self.seed, "rbf_factor": self.rbf_factor, "knn_k": self.knn_k,
                "memory_budget_bytes": self.memory_budget_bytes, **self.measures.as_dict()}

    def settings(self) -> dict[str, Any]:
        """Every option, JSON-ready, for ``meta.settings``; the settings of the measures beyond CKA
        (``shape_alpha``, ``cca_eps``, ...) when a measure they change is chosen."""
        return {"metrics": list(self.metrics), "mode": self.mode, "batch_size": self.batch_size, "n": self.n,
                "null": self.null, "seed": self.seed, "rbf_factor": self.rbf_factor, "knn_k": self.knn_k,
                "memory_budget_bytes": self.memory_budget_bytes, "device": str(self.device),
                **self.measures.used(self.metrics)}


def engine_options(*, metrics: Sequence[str], mode: str, batch_size: int, n: int | None, null: int | None, seed: int,
                   rbf_factor: float, knn_k: int, memory_budget_bytes: int,
                   device: str | torch.device, shape_alpha: float = 0.5, cca_eps: float = 0.0,
                   svcca_keep: float = 0.99, ridge_lambda: float = 1e-2, ridge_folds: int = 5,
                   rsa_distance: str = "correlation", rsa_compare: str = "spearman") -> EngineOptions:
    """Check every shared option (the device last: it may probe CUDA) and return them as one object;
    ``null=None`` becomes :func:`default_null`."""
    chosen = check_metrics(metrics)
    if mode not in MODES:
        raise SimkitError(f"unknown mode {mode!r} in `mode`; choose exact or minibatch")
    if null is None:
        null = default_null(chosen, mode)
    check_batch_size(batch_size)
    if n is not None and (not _is_int(n) or n < 1):
        raise SimkitError(f"`n` must be a positive integer (or None for all samples), got {n!r}")
    if not _is_int(null) or null < 0:
        raise SimkitError(f"`null` must be 0, a positive number of permutations or None (the default), "
                          f"got {null!r}")
    if not _is_int(seed):
        raise SimkitError(f"`seed` must be an integer, got {seed!r}")
    if isinstance(rbf_factor, bool) or not isinstance(rbf_factor, numbers.Real) \
            or not (math.isfinite(rbf_factor) and rbf_factor > 0):
        raise SimkitError(f"`rbf_factor` must be a positive number, got {rbf_factor!r}")
    if not _is_int(knn_k) or knn_k < 1:
        raise SimkitError(f"`knn_k` must be a positive integer, got {knn_k!r}; the default is 10")
    if not _is_int(memory_budget_bytes) or memory_budget_bytes < 1:
        raise SimkitError(f"`memory_budget_bytes` must be a positive integer, got {memory_budget_bytes!r}")
    measures = measure_settings(shape_alpha=shape_alpha, cca_eps=cca_eps, svcca_keep=svcca_keep,
                                ridge_lambda=ridge_lambda, ridge_folds=ridge_folds, rsa_distance=rsa_distance,
                                rsa_compare=rsa_compare)
    return EngineOptions(chosen, mode, int(batch_size), None if n is None else int(n), int(null), int(seed),
                         float(rbf_factor), int(knn_k), int(memory_budget_bytes), resolve_device(device), measures)
