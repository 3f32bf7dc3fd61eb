"""simkit.stats: seed intervals, paired differences and the verdict rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from simkit.errors import SimkitError
from simkit.stats import (
    Interval,
    beyond_noise,
    binomial_se,
    interval_of,
    paired_difference,
    t_interval,
    verdict,
)


def test_the_interval_is_students_t_on_the_seed_values():
    values = [86.1, 87.3, 85.8, 86.9, 85.2]
    got = t_interval(values)
    low, high = scipy_stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=scipy_stats.sem(values))
    assert (got.mean, got.low, got.high, got.n) == pytest.approx((np.mean(values), low, high, 5), rel=1e-12)
    assert got.std == pytest.approx(np.std(values, ddof=1), rel=1e-12)


def test_coverage_of_the_interval_is_its_confidence():
    rng = np.random.default_rng(0)
    samples = rng.normal(1.5, 2.0, size=(4000, 3))
    covered = sum(1 for row in samples if (iv := t_interval(row)).low <= 1.5 <= iv.high)
    assert abs(covered / 4000 - 0.95) < 0.015


def test_paired_difference_pairs_by_seed_and_drops_missing_pairs():
    a, b = [3.0, 5.0, float("nan"), 4.0], [1.0, 2.0, 9.0, 1.0]
    got = paired_difference(a, b)
    assert got.n == 3 and got.mean == pytest.approx(np.mean([2.0, 3.0, 3.0]))
    with pytest.raises(SimkitError, match="one value per seed"):
        paired_difference([1.0, 2.0], [1.0])


@pytest.mark.parametrize("values, higher, size, expected", [
    ([2.0, 2.5, 3.0], True, 0.0, "reproduced"),
    ([2.0, 2.5, 3.0], True, 2.4, "direction only"),
    ([-1.0, 4.0, 2.0], True, 0.0, "direction only"),
    ([-3.0, -2.0, -2.5], True, 0.0, "not reproduced"),
    ([-3.0, -2.0, -2.5], False, 0.0, "reproduced"),
    ([1.0], True, 0.0, "too few seeds"),
])
def test_verdict_rule(values, higher, size, expected):
    assert verdict(t_interval(values), higher=higher, size=size) == expected


@given(st.lists(st.floats(-100, 100), min_size=2, max_size=8))
def test_the_interval_contains_its_mean(values):
    got = t_interval(values)
    assert got.low <= got.mean + 1e-9 and got.mean - 1e-9 <= got.high


def test_one_seed_has_no_interval_and_says_so():
    got = t_interval([0.5])
    assert got.n == 1 and math.isnan(got.low) and "one seed" in got.text()
    assert isinstance(got, Interval)


def test_binomial_standard_error():
    assert binomial_se(0.9, 1000) == pytest.approx(math.sqrt(0.09 / 1000))
    assert math.isnan(binomial_se(0.5, 0))


def test_scaled_interval_is_the_same_interval_in_other_units():
    got = t_interval([0.02, 0.05, 0.03]).scaled(100)
    expected = t_interval([2.0, 5.0, 3.0])
    assert (got.mean, got.std, got.low, got.high, got.n) == pytest.approx(
        (expected.mean, expected.std, expected.low, expected.high, expected.n))
    with pytest.raises(SimkitError, match="`factor`"):
        t_interval([1.0, 2.0]).scaled(0)


def test_interval_of_reads_a_flat_record_back():
    interval = t_interval([1.0, 3.0, 4.0])
    record = {"gain": interval.mean, "gain_std": interval.std, "gain_low": interval.low, "gain_high": interval.high}
    assert interval_of(record, "gain", 3) == interval
    one = interval_of({"gain": 0.5, "gain_std": None, "gain_low": None, "gain_high": None}, "gain", 1)
    assert one.mean == 0.5 and math.isnan(one.low) and not beyond_noise(one) and "one seed" in one.text()


@pytest.mark.parametrize("values, expected", [([1.0, 1.2, 0.9], True), ([-1.0, -1.2, -0.9], True),
                                              ([-1.0, 2.0, 0.5], False), ([5.0], False)])
def test_beyond_noise_only_when_the_interval_excludes_zero(values, expected):
    interval = t_interval(values)
    assert beyond_noise(interval) == expected
    assert beyond_noise(interval) == (interval.n > 1 and not interval.low <= 0 <= interval.high)
