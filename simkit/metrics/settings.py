"""The settings of a comparison, validated once: :class:`CompareSettings`.

One frozen object holds everything that changes the numbers of ``simkit.compare``, ``compare_caches``,
``study`` and the streaming accumulator: the measures, the mode, the batch size, the sample cap, the
null, its seed, the memory budget and each measure's own settings. ``validate()`` checks them all (a
``SimkitError`` naming the library argument in backticks; the CLI maps it to its flag) and returns a
normalised copy (metrics de-duplicated, ``null=None`` resolved by the catalogue's rule); every entry
point calls it, and an already validated object is returned as it is, so the rules run once per run.

The one-shot functions (``simkit.metrics.cca(x, y, cca_eps=...)`` ...) validate their own arguments
with the same ``check_*`` functions below.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from simkit.catalog import DEFAULT_METRICS, DEFAULT_SAMPLED_NULL, MEASURES, METRICS, default_permutations
from simkit.errors import SimkitError, unknown_name_error

MODES = ("exact", "minibatch")
RSA_DISTANCES = ("correlation", "euclidean", "cosine")
RSA_COMPARES = ("spearman", "pearson", "kendall_tau_a")
DEFAULT_MEMORY_BUDGET = 2**30
#: the settings of the measures beyond CKA and k-NN: recorded only when a measure they change is chosen
#: (``rbf_factor`` and ``knn_k`` are always recorded, as they always were)
MEASURE_FIELDS = ("shape_alpha", "cca_eps", "svcca_keep", "ridge_lambda", "ridge_folds", "rsa_distance",
                  "rsa_compare")


def default_null(metrics: Sequence[str], mode: str) -> dict[str, int]:
    """The permutations ``null=None`` stands for, per measure (the catalogue's ``chance``: a cheap null of
    10 for the minibatch CKAs, none where the chance level has a closed form, a few elsewhere)."""
    return {m: default_permutations(m, mode) for m in metrics}


@dataclass(frozen=True)
class CompareSettings:
    """What changes the numbers of a comparison (defaults are the CLI's).

    metrics: measure names (``simkit.catalog.METRICS``), a list or one name.
    mode: ``minibatch`` (per-batch HSIC averaged over batches, Nguyen et al.) or ``exact`` (full data);
        the measures beyond CKA are always full-data.
    batch_size: samples per batch. n: use at most this many samples (None: all).
    null: permutations of B's samples for a null band, for every measure; None (the default): each
        measure's chance level as the catalogue says (``simkit.catalog.default_permutations``: 10 cheap
        permutations for the minibatch CKAs, a closed form for exact linear/unbiased CKA and ``cca``, 5
        permutations of stored activations for the others).
    seed: the permutation null's seed.
    memory_budget_bytes: the streamed sums' budget; beyond it a measure stores activations instead.
    rbf_factor: ``rbf_cka``'s bandwidth, this factor times the median pairwise distance.
    knn_k: neighbours per sample of ``mutual_knn`` and ``jaccard_knn``.
    shape_alpha: netrep's regularisation of ``shape_metric`` in [0, 1] (0 = CCA, 1 = Procrustes).
    cca_eps: ridge added to each side's covariance before whitening, relative to its mean eigenvalue
        (``cca``, ``svcca``, ``pwcca``, ``shape_metric``); 0 = none (pseudo-inverse on the numerical rank).
    svcca_keep: fraction of variance the principal components kept by ``svcca`` explain, in (0, 1].
    ridge_lambda: ridge of ``ridge_r2`` relative to the mean eigenvalue of the training covariance (≥ 0).
    ridge_folds: number of cross-validation folds of ``ridge_r2`` (sample ``i`` is in fold ``i mod k``).
    rsa_distance: RDM distance of ``rsa``: correlation | euclidean | cosine.
    rsa_compare: how ``rsa`` compares two RDMs' upper triangles: spearman | pearson | kendall_tau_a.
    ci: the confidence of a bootstrap interval per cell (``ci_low``, ``ci_high``), e.g. 0.95; None: none.
        Minibatch CKA: a Poisson bootstrap over batches (sums per replicate, nearly free).
    ci_resamples: bootstrap replicates behind ``ci``.
    """

    metrics: Sequence[str] | str = DEFAULT_METRICS
    mode: str = "minibatch"
    batch_size: int = 64
    n: int | None = None
    null: int | None = None
    seed: int = 0
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET
    rbf_factor: float = 1.0
    knn_k: int = 10
    shape_alpha: float = 0.5
    cca_eps: float = 0.0
    svcca_keep: float = 0.99
    ridge_lambda: float = 1e-2
    ridge_folds: int = 5
    rsa_distance: str = "correlation"
    rsa_compare: str = "spearman"
    ci: float | None = None
    ci_resamples: int = 200
    validated: bool = field(default=False, repr=False, compare=False)

    def validate(self) -> CompareSettings:
        """A validated, normalised copy (``self`` when already validated); a SimkitError names the first bad
        argument."""
        if self.validated:
            return self
        metrics = check_metrics(self.metrics)
        mode = check_mode(self.mode)
        null = None if self.null is None else check_null(self.null)
        return replace(
            self, metrics=tuple(metrics), mode=mode, batch_size=check_count(self.batch_size, "batch_size", 1),
            n=None if self.n is None else check_count(self.n, "n", 1), null=null,
            seed=check_integer(self.seed, "seed"),
            memory_budget_bytes=check_count(self.memory_budget_bytes, "memory_budget_bytes", 1),
            rbf_factor=check_positive(self.rbf_factor, "rbf_factor"), knn_k=check_count(self.knn_k, "knn_k", 1),
            shape_alpha=check_alpha(self.shape_alpha), cca_eps=check_eps(self.cca_eps),
            svcca_keep=check_keep(self.svcca_keep), ridge_lambda=check_lambda(self.ridge_lambda),
            ridge_folds=check_folds(self.ridge_folds),
            rsa_distance=check_choice(self.rsa_distance, "rsa_distance", RSA_DISTANCES),
            rsa_compare=check_choice(self.rsa_compare, "rsa_compare", RSA_COMPARES),
            ci=None if self.ci is None else check_ci(self.ci),
            ci_resamples=check_count(self.ci_resamples, "ci_resamples", 10), validated=True)

    def to_dict(self) -> dict[str, Any]:
        """Every setting, JSON-ready, for ``meta.settings``; a measure's own settings only when a measure they
        change is chosen (the catalogue's ``settings``)."""
        chosen = [self.metrics] if isinstance(self.metrics, str) else list(self.metrics)
        used = {s for m in chosen if m in MEASURES for s in MEASURES[m].settings}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "validated"}
        out["metrics"] = chosen
        if out["ci"] is None:  # recorded only when an interval was asked for
            del out["ci"], out["ci_resamples"]
        return {k: v for k, v in out.items() if k not in MEASURE_FIELDS or k in used}

    def resolved(self) -> dict[str, Any]:
        """:meth:`to_dict` with ``null`` resolved: the permutations each measure got (``meta.settings``)."""
        return {**self.to_dict(), "null": {m: self.permutations(m) for m in self.to_dict()["metrics"]}}

    def permutations(self, name: str) -> int:
        """The permutations of measure ``name``'s null: ``null`` when given, else the catalogue's default."""
        return default_permutations(name, self.mode, self.cca_eps) if self.null is None else int(self.null)

    def stored_permutations(self, names: Sequence[str]) -> int:
        """The permutations of the stored strategy, which draws one set for all its measures: ``null`` when
        given, else a few (``DEFAULT_SAMPLED_NULL``), so every stored measure gets a chance level."""
        return int(self.null) if self.null is not None else max(
            [DEFAULT_SAMPLED_NULL, *(self.permutations(m) for m in names)])

    def as_dict(self) -> dict[str, Any]:
        """Every field by name (the measures' own settings included)."""
        return {k: v for k, v in asdict(self).items() if k != "validated"}

    def updated(self, **changes: Any) -> CompareSettings:
        """A copy with ``changes`` (field names; anything else is a SimkitError), to be validated again."""
        known = [f.name for f in fields(self) if f.name != "validated"]
        for name in changes:
            if name not in known:
                raise unknown_name_error("setting", name, known, "settings: " + ", ".join(known))
        return replace(self, **changes, validated=False) if changes else self


def resolve_settings(settings: CompareSettings | None, changes: dict[str, Any]) -> CompareSettings:
    """``settings`` (default: :class:`CompareSettings`) with keyword ``changes`` applied, validated once."""
    if settings is not None and not isinstance(settings, CompareSettings):
        raise SimkitError(f"`settings` must be a simkit.CompareSettings, got {type(settings).__name__}")
    return (settings or CompareSettings()).updated(**changes).validate()


#: the settings of the measures beyond CKA, under the name the one-shot functions use
MeasureSettings = CompareSettings


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_metrics(metrics: Sequence[str] | str) -> list[str]:
    """Validated, de-duplicated metric names in the given order."""
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    out = list(dict.fromkeys(names))
    for name in out:
        if name not in METRICS:
            raise unknown_name_error("metric", name, METRICS, "valid: " + ", ".join(METRICS))
    if not out:
        raise SimkitError("no metric chosen; pass at least one of " + ", ".join(METRICS) + " in `metrics`")
    return out


def check_count(value: Any, name: str, least: int) -> int:
    """``value`` as an int ≥ ``least`` (0: a count, 1: a positive size)."""
    if not _integer(value) or value < least:
        what = {0: "0 or a positive integer", 1: "a positive integer"}.get(least, f"an integer >= {least}")
        raise SimkitError(f"`{name}` must be {what}, got {value!r}")
    return int(value)


def check_mode(value: Any) -> str:
    """``mode``: exact or minibatch."""
    value = getattr(value, "value", value)
    if value not in MODES:
        raise SimkitError(f"unknown `mode` {value!r}; choose exact or minibatch")
    return str(value)


def check_ci(value: Any) -> float:
    """``ci``: a confidence level in (0, 1)."""
    if not _real(value) or not 0.0 < float(value) < 1.0:
        raise SimkitError(f"`ci` must be a confidence level in (0, 1), e.g. 0.95, got {value!r}")
    return float(value)


def check_null(value: Any) -> int:
    """``null``: 0 or a positive number of permutations (None is resolved before)."""
    if not _integer(value) or value < 0:
        raise SimkitError(f"`null` must be 0 or a positive number of permutations, or None (the default), "
                          f"got {value!r}")
    return int(value)


def check_integer(value: Any, name: str) -> int:
    """``value`` as an int (any integer, not a bool)."""
    if not _integer(value):
        raise SimkitError(f"`{name}` must be an integer, got {value!r}")
    return int(value)


def check_positive(value: Any, name: str) -> float:
    """``value`` as a finite float > 0."""
    if not _real(value) or float(value) <= 0:
        raise SimkitError(f"`{name}` must be a positive number, got {value!r}")
    return float(value)


def check_alpha(value: Any) -> float:
    """``shape_alpha`` in [0, 1]."""
    if not _real(value) or not 0.0 <= float(value) <= 1.0:
        raise SimkitError(f"`shape_alpha` must be a number in [0, 1] (0 = CCA, 1 = Procrustes), got {value!r}")
    return float(value)


def check_eps(value: Any) -> float:
    """``cca_eps`` >= 0."""
    if not _real(value) or float(value) < 0:
        raise SimkitError(f"`cca_eps` must be a number >= 0 (a ridge relative to the mean eigenvalue), "
                          f"got {value!r}; the default is 0")
    return float(value)


def check_keep(value: Any) -> float:
    """``svcca_keep`` in (0, 1]."""
    if not _real(value) or not 0.0 < float(value) <= 1.0:
        raise SimkitError(f"`svcca_keep` must be a fraction of variance in (0, 1], got {value!r}; "
                          "the default is 0.99")
    return float(value)


def check_lambda(value: Any) -> float:
    """``ridge_lambda`` >= 0."""
    if not _real(value) or float(value) < 0:
        raise SimkitError(f"`ridge_lambda` must be a number >= 0, got {value!r}; the default is 0.01")
    return float(value)


def check_folds(value: Any) -> int:
    """``ridge_folds``, an integer >= 2."""
    if not _integer(value) or value < 2:
        raise SimkitError(f"`ridge_folds` must be an integer >= 2, got {value!r}; the default is 5")
    return int(value)


def check_choice(value: Any, name: str, valid: tuple[str, ...]) -> str:
    """``value`` (or an Enum member's value) when it is one of ``valid``."""
    value = getattr(value, "value", value)  # an Enum member (the CLI's choices) stands for its value
    if value not in valid:
        raise SimkitError(f"unknown `{name}` {value!r}; choose one of {', '.join(valid)}")
    return str(value)
