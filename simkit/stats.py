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
import numbers
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from simkit.errors import SimkitError, check_real

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
        check_real("factor", factor, 0, strict=True)
        return Interval(self.mean * factor, self.std * factor, self.low * factor, self.high * factor, self.n,
                        self.confidence)

    def text(self, digits: int = 1, unit: str = "") -> str:
        """``+2.1 (95 % CI −0.1 to +4.3, 3 seeds)``; the mean alone with one seed."""
        _check_count("digits", digits)
        if self.n < 2:
            return f"{self.mean:+.{digits}f}{unit} (one seed, no interval)"
        return (f"{self.mean:+.{digits}f}{unit} ({self.confidence:.0%} CI {self.low:+.{digits}f} to "
                f"{self.high:+.{digits}f}{unit}, {self.n} seeds)")


def interval_of(record: Mapping[str, Any], prefix: str, n: int, confidence: float = 0.95) -> Interval:
    """The interval a record (a run's summary) keeps flat as ``prefix`` (the mean), ``<prefix>_std``,
    ``<prefix>_low`` and ``<prefix>_high`` over ``n`` seeds (missing or None: NaN)."""
    def value(key: str) -> float:
        got = record.get(key)
        if got is None:
            return math.nan
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            raise SimkitError(f"`record`[{key!r}] must be a number (or None), got {got!r}")
        return float(got)

    _check_count("n", n)
    return Interval(value(prefix), value(f"{prefix}_std"), value(f"{prefix}_low"), value(f"{prefix}_high"), int(n),
                    confidence)


def _check_count(name: str, value: object) -> None:
    """``value`` a whole number >= 0 (a count of seeds, of digits); else a SimkitError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise SimkitError(f"`{name}` must be a whole number >= 0, got {value!r}")


def _as_values(values: Any, name: str) -> np.ndarray:
    """``values`` (real numbers, one per seed: a sequence, an array, a tensor or an iterator; None counts as
    missing, NaN) as a flat float64 array; anything else is a SimkitError naming the argument ``name``."""
    try:
        if not isinstance(values, np.ndarray) and hasattr(values, "tolist"):  # a torch tensor, of any dtype
            values = values.tolist()
        elif isinstance(values, Iterator):
            values = list(values)
        if not np.iscomplexobj(values):
            return np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError, RuntimeError, NotImplementedError):
        pass
    raise SimkitError(f"`{name}` must be real numbers, one per seed (a list, an array or a tensor), got "
                      f"{type(values).__name__} {' '.join(str(values).split())[:60]}")


def _finite(values: Sequence[float] | np.ndarray, name: str = "values") -> np.ndarray:
    array = _as_values(values, name)
    return array[np.isfinite(array)]


def check_confidence(confidence: float) -> float:
    """``confidence`` in (0, 1)."""
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 < confidence < 1:
        raise SimkitError(f"`confidence` must be a number in (0, 1), e.g. 0.95, got {confidence!r}")
    return float(confidence)


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> Interval:
    """The mean of the finite ``values`` (one per seed) with its Student t interval.

    >>> interval = t_interval([0.80, 0.82, 0.79, 0.81, 0.83])
    >>> round(interval.mean, 3), round(interval.low, 3), round(interval.high, 3), interval.n
    (0.81, 0.79, 0.83, 5)
    """
    confidence = check_confidence(confidence)
    finite = _finite(values)
    n = int(finite.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, math.nan, 0, confidence)
    mean = float(finite.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, math.nan, 1, confidence)
    std = float(finite.std(ddof=1))
    from scipy import stats as scipy_stats  # 0.6 s to import: only where an interval is made

    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
    return Interval(mean, std, mean - half, mean + half, n, confidence)


def paired_difference(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                      confidence: float = 0.95) -> Interval:
    """The interval of ``a − b`` paired by seed (``a[i]`` and ``b[i]`` from the same seed); pairs with a
    non-finite side are left out."""
    left, right = _as_values(a, "a"), _as_values(b, "b")
    if left.shape != right.shape:
        raise SimkitError(f"paired values need one value per seed on each side (`a` and `b`), got {left.size} and {right.size}")
    with np.errstate(invalid="ignore"):  # inf − inf: a non-finite pair, left out below
        return t_interval(left - right, confidence)


def verdict(interval: Interval, higher: bool = True, size: float = 0.0) -> str:
    """The verdict of a claim that the difference is above ``size`` (``higher``) or below ``-size`` (not
    ``higher``), by the rule of the module docstring.

    >>> converted, scratch = [0.90, 0.88, 0.91], [0.85, 0.86, 0.84]   # one score per seed
    >>> verdict(paired_difference(converted, scratch), higher=True)   # the interval still holds 0
    'direction only'
    """
    check_real("size", size, -math.inf)
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
    """The binomial standard error of an accuracy (a fraction) measured on ``n`` samples; NaN for a NaN (missing)
    accuracy, and NaN with a warning when ``n`` < 1 or ``accuracy`` is outside [0, 1]."""
    if math.isnan(accuracy):
        return math.nan
    if n < 1 or not 0 <= accuracy <= 1:
        warnings.warn(f"binomial_se is undefined for `accuracy`={accuracy!r} on `n`={n!r} samples (needs n >= 1 "
                      "and an accuracy in [0, 1]); returning NaN", RuntimeWarning, stacklevel=2)
        return math.nan
    return math.sqrt(accuracy * (1 - accuracy) / n)
