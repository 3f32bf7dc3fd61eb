"""Every number with its noise: seed intervals, paired differences and the verdict rule, in one place.

The runners (``convert``, ``stitch``, ``linearize``), their reports and the examples use these helpers
so that a mean over seeds always comes with its spread and 95 % t interval, a comparison between two
arms is the paired per-seed difference (the arms share each seed's data and initialisation), and a
claim is judged by one rule:

* ``reproduced`` when the interval lies entirely on the claimed side of ``size`` (0 by default);
* ``direction only`` when the mean is on the claimed side but the interval is not;
* ``not reproduced`` otherwise; ``too few seeds`` when fewer than two seeds have a value.

The interval is Student's t (``scipy.stats.t``) on the per-seed values: mean ± t_{1−α/2, k−1}·s/√k,
with s the sample standard deviation (ddof = 1). Torch-free (base layer).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from simkit.errors import SimkitError

#: the verdicts :func:`verdict` gives, strongest first
VERDICTS = ("reproduced", "direction only", "not reproduced", "too few seeds")


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` seeds with its sample standard deviation and a ``confidence`` t interval
    ``[low, high]`` (NaN bounds and std with fewer than two finite values)."""

    mean: float
    std: float
    low: float
    high: float
    n: int
    confidence: float = 0.95

    def as_dict(self, prefix: str = "") -> dict[str, Any]:
        """The fields as ``{prefix + name: value}`` (e.g. ``gain_mean``, ``gain_low`` ...)."""
        return {f"{prefix}{key}": value for key, value in asdict(self).items()}

    def scaled(self, factor: float) -> Interval:
        """The interval in other units (``factor`` > 0, e.g. 100 for accuracy points)."""
        if not factor > 0:
            raise SimkitError(f"`factor` must be > 0, got {factor!r}")
        return Interval(self.mean * factor, self.std * factor, self.low * factor, self.high * factor, self.n,
                        self.confidence)

    def text(self, digits: int = 1, unit: str = "") -> str:
        """``+2.1 (95 % CI −0.1 to +4.3, 3 seeds)``; the mean alone with one seed."""
        if self.n < 2:
            return f"{self.mean:+.{digits}f}{unit} (one seed, no interval)"
        return (f"{self.mean:+.{digits}f}{unit} ({self.confidence:.0%} CI {self.low:+.{digits}f} to "
                f"{self.high:+.{digits}f}{unit}, {self.n} seeds)")


def interval_of(record: Mapping[str, Any], prefix: str, n: int, confidence: float = 0.95) -> Interval:
    """The interval a record (a run's summary) keeps flat as ``prefix`` (the mean), ``<prefix>_std``,
    ``<prefix>_low`` and ``<prefix>_high`` over ``n`` seeds (missing or None: NaN)."""
    def value(key: str) -> float:
        got = record.get(key)
        return math.nan if got is None else float(got)

    return Interval(value(prefix), value(f"{prefix}_std"), value(f"{prefix}_low"), value(f"{prefix}_high"), int(n),
                    confidence)


def _finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    return array[np.isfinite(array)]


def check_confidence(confidence: float) -> float:
    """``confidence`` in (0, 1)."""
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 < confidence < 1:
        raise SimkitError(f"`confidence` must be a number in (0, 1), e.g. 0.95, got {confidence!r}")
    return float(confidence)


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> Interval:
    """The mean of the finite ``values`` (one per seed) with its Student t interval."""
    confidence = check_confidence(confidence)
    finite = _finite(values)
    n = int(finite.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, math.nan, 0, confidence)
    mean = float(finite.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, math.nan, 1, confidence)
    std = float(finite.std(ddof=1))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
    return Interval(mean, std, mean - half, mean + half, n, confidence)


def paired_difference(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                      confidence: float = 0.95) -> Interval:
    """The interval of ``a − b`` paired by seed (``a[i]`` and ``b[i]`` from the same seed); pairs with a
    non-finite side are left out."""
    left, right = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if left.shape != right.shape:
        raise SimkitError(f"paired values need one value per seed on each side, got {left.size} and {right.size}")
    return t_interval(left - right, confidence)


def verdict(interval: Interval, higher: bool = True, size: float = 0.0) -> str:
    """The verdict of a claim that the difference is above ``size`` (``higher``) or below ``-size`` (not
    ``higher``), by the rule of the module docstring."""
    if interval.n < 2 or math.isnan(interval.mean):
        return "too few seeds"
    sign = 1.0 if higher else -1.0
    threshold = sign * size
    beyond = (interval.low > threshold) if higher else (interval.high < threshold)
    if beyond:
        return "reproduced"
    if sign * (interval.mean - threshold) > 0:
        return "direction only"
    return "not reproduced"


def beyond_noise(interval: Interval) -> bool:
    """True when the interval excludes 0 (either side)."""
    return interval.n >= 2 and (interval.low > 0 or interval.high < 0)


def binomial_se(accuracy: float, n: int) -> float:
    """The binomial standard error of an accuracy (a fraction) measured on ``n`` samples."""
    if n < 1 or not 0 <= accuracy <= 1:
        return math.nan
    return math.sqrt(accuracy * (1 - accuracy) / n)
