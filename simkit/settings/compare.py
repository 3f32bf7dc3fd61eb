"""The settings of a comparison, validated once: :class:`CompareSettings` (torch-free: the CLI reads it).

One frozen object holds everything that changes the numbers of ``simkit.compare``, ``compare_caches``,
``study`` and the streaming accumulator: the measures, the mode, the batch size, the sample cap, the
null, its seed, the memory budget and each measure's own settings. ``validate()`` checks them all (a
``SimkitError`` naming the library argument in backticks; the CLI maps it to its flag) and returns a
normalised copy (metrics de-duplicated, ``null=None`` resolved by the catalogue's rule); every entry
point calls it, and an already validated object is returned as it is, so the rules run once per run.

Every field is declared once (``simkit.options``): the generic ``validate()`` applies the declarations,
and ``simkit compare``'s options are generated from them. The one-shot functions
(``simkit.metrics.cca(x, y, cca_eps=...)`` ...) check their keywords with :func:`check_setting`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from simkit.catalog import (
    DEFAULT_METRICS,
    DEFAULT_SAMPLED_NULL,
    MEASURE_SETTINGS,
    MEASURES,
    METRICS,
    RSA_COMPARES,
    RSA_DISTANCES,
    default_permutations,
    measure_setting,
    measure_setting_declaration,
    metric_help,
    null_help,
)
from simkit.errors import SimkitError
from simkit.options import (
    Choice,
    Integer,
    Names,
    Optional,
    Real,
    Settings,
    n_option,
    option,
    rule,
    seed_option,
)
from simkit.settings.memory import AUTO_FRACTION, FALLBACK_BUDGET, ByteSize
from simkit.settings.pvalues import (
    check_inference,
    correction_option,
    groups_option,
    groups_record,
    p_values_option,
)

MODES = ("exact", "minibatch")
#: how a layer's output becomes one vector per sample (``simkit.layers.reduce_output``)
REDUCTIONS = ("auto", "flatten", "mean", "cls", "last")
#: what one sample of a comparison is (``samples``): a sequence or image reduced to one vector (``reduce``),
#: every real token of a sequence layer, or every spatial position of a conv map (``simkit.engine.samples``)
SAMPLES = ("sequences", "tokens", "positions")
#: the dtypes a model may be loaded in (``simkit.models.load_model(..., dtype=...)``, ``--dtype``)
DTYPES = ("float32", "bfloat16", "float16")
#: activations aligned by sample IDs: the fewest matched samples, as a fraction of the smaller side
DEFAULT_MIN_OVERLAP = 0.9
#: the settings of the measures beyond CKA and k-NN: recorded only when a measure they change is chosen
#: (``rbf_factor`` and ``knn_k`` are always recorded, as they always were)
MEASURE_FIELDS = tuple(name for name in MEASURE_SETTINGS if name not in ("rbf_factor", "knn_k"))
__all__ = ["DEFAULT_METRICS", "DTYPES", "MODES", "REDUCTIONS", "SAMPLES", "RSA_COMPARES", "RSA_DISTANCES", "CompareSettings", "MeasureSettings",
           "check_metrics", "check_setting", "resolve_settings"]


@dataclass(frozen=True)
class CompareSettings(Settings):
    """What changes the numbers of a comparison (defaults are the CLI's; each field's declaration is its
    help). The measures' own settings (``rbf_factor`` ... ``rsa_compare``) are declared on the catalogue
    (``simkit.catalog.MEASURE_SETTINGS``).

    metrics: measure names (``simkit.catalog.METRICS``), a list or one name.
    null: None (the default): each measure's chance level as the catalogue says
        (``simkit.catalog.default_permutations``).
    memory_budget_bytes: ``"auto"`` (a share of the available memory, ``simkit.settings.memory``) or bytes
        (an int, or a text such as ``"4G"``); beyond it a streamed measure stores activations instead and a
        stored measure is refused.
    """

    metrics: Sequence[str] | str = option(
        list(DEFAULT_METRICS), Names(METRICS, kind="metric"), f"Repeatable, comma lists: {metric_help()}. The "
        "measures beyond CKA are always full-data, in either --mode.", flag="--metric")
    mode: str = option("minibatch", Choice(MODES), "exact (the full-data estimate) or minibatch (per-batch HSIC "
                       "averaged over batches, Nguyen et al.; linear_cka there is biased by the batch size, "
                       "unbiased_cka is not).")
    batch_size: int = option(64, Integer(ge=1), "Samples per batch.")
    n: int | None = n_option()
    null: int | None = option(None, Optional(Integer(ge=0)), null_help(), show_default="each measure's default",
                              note="the number of permutations (0: none; None: each measure's default)")
    seed: int = seed_option()
    memory_budget_bytes: int | str = option(
        "auto", ByteSize(), "Memory the measures may keep (streamed sums, stored activations, Grams, RDMs): "
        f"auto ({AUTO_FRACTION:.0%} of the memory available at the start, {FALLBACK_BUDGET // 2**30} GiB where "
        "that cannot be read), or a size such as 4G or 512M; beyond it a streamed measure stores activations "
        "and a stored one is refused up front.", flag="--memory-budget", metavar="SIZE",
        note="e.g. 4G, 512M or auto")
    rbf_factor: float = measure_setting("rbf_factor")
    knn_k: int = measure_setting("knn_k")
    shape_alpha: float = measure_setting("shape_alpha")
    cca_eps: float = measure_setting("cca_eps")
    svcca_keep: float = measure_setting("svcca_keep")
    ridge_lambda: float = measure_setting("ridge_lambda")
    ridge_folds: int = measure_setting("ridge_folds")
    rsa_distance: str = measure_setting("rsa_distance")
    rsa_compare: str = measure_setting("rsa_compare")
    dcor_estimator: str = measure_setting("dcor_estimator")
    ci: float | None = option(None, Optional(Real(gt=0, lt=1)), "Confidence of a bootstrap interval per cell "
                              "(ci_low, ci_high in similarity.csv), e.g. 0.95; minibatch CKA: a Poisson bootstrap "
                              "over batches, nearly free.", show_default="none",
                              note="a confidence level, e.g. 0.95")
    ci_resamples: int = option(200, Integer(ge=10), "Bootstrap replicates behind --ci.")
    min_overlap: float | None = option(None, Optional(Real(gt=0, le=1)), "Activations with sample IDs: the "
                                       "fewest matched samples allowed, as a fraction of the smaller side.",
                                       show_default=f"{DEFAULT_MIN_OVERLAP:g}")
    p_values: bool = p_values_option()
    correction: str | None = correction_option()
    groups: str | Sequence[str] | None = groups_option()
    samples: str = option("sequences", Choice(SAMPLES), "What one sample is: sequences (one vector per sequence or "
                          "image, by --reduce), tokens (every real token of a sequence layer; padding left out) "
                          "or positions (every spatial position of a conv map, the maps pooled to a common "
                          "grid). Chance levels and intervals permute and resample whole sequences or images.")

    @rule
    def _correction_with_p_values(self) -> dict[str, Any] | None:
        """``correction`` only with ``p_values`` (Holm when not given); enough permutations for a p-value."""
        return check_inference(self.p_values, self.correction, self.null)

    @rule
    def _samples_keep_sequences_whole(self) -> dict[str, Any] | None:
        """Tokens or positions as samples permute whole sequences (blocks), which ``groups`` cannot join, and
        ``ridge_r2``'s folds (sample ``i`` in fold ``i mod k``) would split a sequence's tokens across folds."""
        if self.samples == "sequences":
            return None
        if self.groups is not None:
            raise SimkitError(f"`groups` labels samples, but `samples` {self.samples} permutes whole sequences or "
                              "images; leave out `groups` or compare sequences")
        if "ridge_r2" in self.metrics:
            raise SimkitError(f"ridge_r2's folds would split the {self.samples} of one sequence or image between "
                              f"training and test folds with `samples` {self.samples}; choose other `metrics` or "
                              "compare sequences")
        return None

    def to_dict(self) -> dict[str, Any]:
        """Every setting, JSON-ready, for ``meta.settings``; a measure's own settings only when a measure they
        change is chosen (the catalogue's ``settings``)."""
        chosen = [self.metrics] if isinstance(self.metrics, str) else list(self.metrics)
        used = {s for m in chosen if m in MEASURES for s in MEASURES[m].settings}
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["metrics"] = chosen
        if out["ci"] is None:  # recorded only when an interval was asked for
            del out["ci"], out["ci_resamples"]
        if out["min_overlap"] is None:  # recorded only when given (it matters only for IDs)
            del out["min_overlap"]
        if not out["p_values"]:  # recorded only when asked for (p-values, their correction)
            del out["p_values"], out["correction"]
        out["groups"] = groups_record(out["groups"])
        if out["groups"] is None:
            del out["groups"]
        if out["samples"] == "sequences":  # recorded only when tokens or positions are the samples
            del out["samples"]
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

    def overlap(self) -> float:
        """The fewest matched samples of an alignment by IDs, as a fraction of the smaller side."""
        return DEFAULT_MIN_OVERLAP if self.min_overlap is None else float(self.min_overlap)

    def as_dict(self) -> dict[str, Any]:
        """Every field by name (the measures' own settings included)."""
        return asdict(self)


def resolve_settings(settings: CompareSettings | None, changes: dict[str, Any]) -> CompareSettings:
    """``settings`` (default: :class:`CompareSettings`) with keyword ``changes`` applied, validated once."""
    if settings is not None and not isinstance(settings, CompareSettings):
        raise SimkitError(f"`settings` must be a simkit.CompareSettings, got {type(settings).__name__}")
    return (settings or CompareSettings()).updated(**changes).validate()


#: the settings of the measures beyond CKA, under the name the one-shot functions use
MeasureSettings = CompareSettings


def check_metrics(metrics: Sequence[str] | str) -> list[str]:
    """Validated, de-duplicated metric names in the given order (``metrics``' declared constraint)."""
    return CompareSettings(metrics=metrics).validate().metrics  # type: ignore[return-value]


def check_setting(name: str, value: Any) -> Any:
    """``value`` of measure setting ``name`` checked and normalised by its catalogue declaration (the
    one-shot functions, ``simkit.metrics.cca(x, y, cca_eps=...)``, check their keywords with it)."""
    return measure_setting_declaration(name).check(value, name)
