"""The settings of the measures beyond CKA (shape metrics, CCA family, RSA, ridge predictivity), checked once.

:class:`MeasureSettings` holds them with their defaults; :func:`measure_settings` validates user values
(``SimkitError`` naming the library argument in backticks) and is used by the one-shot functions, the
streaming accumulators (``simkit.metrics.streaming.make_accumulator``) and the engine alike.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from simkit.errors import SimkitError

RSA_DISTANCES = ("correlation", "euclidean", "cosine")
RSA_COMPARES = ("spearman", "pearson", "kendall_tau_a")
#: which measures each setting changes (a setting is recorded only when one of them is chosen)
USED_BY = {"shape_alpha": ("shape_metric",), "cca_eps": ("cca", "svcca", "pwcca", "shape_metric"),
           "svcca_keep": ("svcca",), "ridge_lambda": ("ridge_r2",), "ridge_folds": ("ridge_r2",),
           "rsa_distance": ("rsa",), "rsa_compare": ("rsa",)}


@dataclass(frozen=True)
class MeasureSettings:
    """Settings of the non-CKA measures (defaults are the CLI's).

    shape_alpha: netrep's regularisation of ``shape_metric`` in [0, 1] (0 = CCA, 1 = Procrustes).
    cca_eps: ridge added to each side's covariance before whitening, relative to its mean eigenvalue
        (``cca``, ``svcca``, ``pwcca``, ``shape_metric``); 0 = none (pseudo-inverse on the numerical rank).
    svcca_keep: fraction of variance the principal components kept by ``svcca`` explain, in (0, 1].
    ridge_lambda: ridge of ``ridge_r2`` relative to the mean eigenvalue of the training covariance (≥ 0).
    ridge_folds: number of cross-validation folds of ``ridge_r2`` (sample ``i`` is in fold ``i mod k``).
    rsa_distance: RDM distance of ``rsa``: correlation | euclidean | cosine.
    rsa_compare: how ``rsa`` compares two RDMs' upper triangles: spearman | pearson | kendall_tau_a.
    """

    shape_alpha: float = 0.5
    cca_eps: float = 0.0
    svcca_keep: float = 0.99
    ridge_lambda: float = 1e-2
    ridge_folds: int = 5
    rsa_distance: str = "correlation"
    rsa_compare: str = "spearman"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def used(self, metrics: Sequence[str]) -> dict[str, Any]:
        """The settings that change the values of ``metrics`` (:data:`USED_BY`), by name."""
        return {k: v for k, v in asdict(self).items() if any(m in metrics for m in USED_BY[k])}


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def check_alpha(value: Any) -> float:
    if not _real(value) or not 0.0 <= float(value) <= 1.0:
        raise SimkitError(f"`shape_alpha` must be a number in [0, 1] (0 = CCA, 1 = Procrustes), got {value!r}")
    return float(value)


def check_eps(value: Any) -> float:
    if not _real(value) or float(value) < 0:
        raise SimkitError(f"`cca_eps` must be a number >= 0 (a ridge relative to the mean eigenvalue), "
                          f"got {value!r}; the default is 0")
    return float(value)


def check_keep(value: Any) -> float:
    if not _real(value) or not 0.0 < float(value) <= 1.0:
        raise SimkitError(f"`svcca_keep` must be a fraction of variance in (0, 1], got {value!r}; "
                          "the default is 0.99")
    return float(value)


def check_lambda(value: Any) -> float:
    if not _real(value) or float(value) < 0:
        raise SimkitError(f"`ridge_lambda` must be a number >= 0, got {value!r}; the default is 0.01")
    return float(value)


def check_folds(value: Any) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 2:
        raise SimkitError(f"`ridge_folds` must be an integer >= 2, got {value!r}; the default is 5")
    return int(value)


def check_choice(value: Any, name: str, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise SimkitError(f"unknown `{name}` {value!r}; choose one of {', '.join(valid)}")
    return str(value)


def measure_settings(*, shape_alpha: float = 0.5, cca_eps: float = 0.0, svcca_keep: float = 0.99,
                     ridge_lambda: float = 1e-2, ridge_folds: int = 5, rsa_distance: str = "correlation",
                     rsa_compare: str = "spearman") -> MeasureSettings:
    """Validated :class:`MeasureSettings` (a SimkitError names the first bad argument)."""
    return MeasureSettings(check_alpha(shape_alpha), check_eps(cca_eps), check_keep(svcca_keep),
                           check_lambda(ridge_lambda), check_folds(ridge_folds),
                           check_choice(rsa_distance, "rsa_distance", RSA_DISTANCES),
                           check_choice(rsa_compare, "rsa_compare", RSA_COMPARES))
