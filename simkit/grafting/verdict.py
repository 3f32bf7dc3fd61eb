"""Pass/fail of each check of the graft suite, from its summary (the paper's claims, spec §4).

- E1: the graft is bit-exact: 0 mismatching output bits and 0 at the site, for every gate E1 grafted
  (shadow and net2net), over at least one compared value.
- E2: the shadow gate's α gets a gradient at step 1 and its branch at step 2 (∂L/∂α = ⟨g, R(x)⟩ ≠ 0
  while α = 0); the net2net branch (α = 1, zero output projections) gets one at step 1; the
  double-zero arm's largest gradient is exactly 0.
- E3: recompute time grows with the cone: the correlation of recompute time with cone size is at
  least ``E3_MIN_CORRELATION`` [ours: the paper says "∝"; 0.9 leaves room for timer noise].
- F3: the killed and resumed run is bit-identical to the uninterrupted one, and the resume without
  optimizer moments diverges.

Judged beside them (:func:`e3_statistics`, no pass/fail of its own): E3's correlation with its 95 %
interval (Fisher z: tanh(atanh r ± z₀.₉₇₅ / √(n − 3))), and the paper's "bookkeeping ≈ 0.75 ms whatever
the depth" as a least-squares slope of bookkeeping seconds against insertion depth with its 95 % t
interval (``scipy.stats.linregress``: slope ± t₀.₉₇₅,ₙ₋₂ · stderr). The bookkeeping is ``flat`` when the
interval's larger end, times the depth span, stays within ``BOOKKEEPING_FLAT`` of the median bookkeeping
time [ours: the change over all depths is below a quarter of one graft's cost]; else ``grows with depth``
or ``shrinks with depth`` when the interval excludes 0, else ``undecided`` (too noisy to say).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

E3_MIN_CORRELATION = 0.9
CHECKS = ("e1", "e2", "e3", "f3")
CONFIDENCE = 0.95
BOOKKEEPING_FLAT = 0.25  # [ours] the bookkeeping change over the depth span, as a fraction of its median


def verdict(summary: dict[str, Any], e1_mismatches: Iterable[int] = ()) -> dict[str, Any]:
    """``{"e1_pass", "e2_pass", "e3_pass", "f3_pass", "all_pass"}`` (booleans) and ``verdict`` (one line,
    :func:`verdict_text`) from ``summary``; a check whose keys are missing fails. e1_mismatches: output
    and site mismatches of every E1 gate (beside the summary's, which are those of the run's own gate)."""
    e1 = (int(summary.get("e1_values_compared") or 0) > 0 and summary.get("e1_mismatches") == 0
          and summary.get("e1_site_mismatches") == 0 and all(int(m) == 0 for m in e1_mismatches))
    e2 = (summary.get("e2_shadow_alpha_first_grad_step") == 1 and summary.get("e2_shadow_branch_first_grad_step") == 2
          and summary.get("e2_net2net_branch_first_grad_step") == 1
          and summary.get("e2_double_zero_max_abs_grad") == 0.0)
    corr = summary.get("e3_cone_cost_correlation")
    e3 = isinstance(corr, int | float) and math.isfinite(corr) and corr >= E3_MIN_CORRELATION
    f3 = summary.get("f3_resume_bit_identical") is True and summary.get("f3_without_moments_diverges_at_step") is not None
    out: dict[str, Any] = {"e1_pass": bool(e1), "e2_pass": bool(e2), "e3_pass": bool(e3), "f3_pass": bool(f3)}
    out["all_pass"] = all(out.values())
    out["verdict"] = verdict_text({**summary, **out})
    return out


def why_failed(summary: dict[str, Any], check: str) -> str:
    """A short reason for a failed check, from the summary's values (``check``: e1 | e2 | e3 | f3)."""
    if check == "e1":
        return (f"{summary.get('e1_mismatches')} output and {summary.get('e1_site_mismatches')} site bit "
                f"mismatches over {summary.get('e1_values_compared')} values")
    if check == "e2":
        return (f"first gradient steps: shadow α {summary.get('e2_shadow_alpha_first_grad_step')} (expected 1), "
                f"shadow branch {summary.get('e2_shadow_branch_first_grad_step')} (2), net2net branch "
                f"{summary.get('e2_net2net_branch_first_grad_step')} (1); double-zero max |grad| "
                f"{summary.get('e2_double_zero_max_abs_grad')} (0)")
    if check == "e3":
        corr = summary.get("e3_cone_cost_correlation")
        note = summary.get("e3_note")
        return note or f"cone-cost correlation {_number(corr)} < {E3_MIN_CORRELATION}"
    return (f"resume bit-identical: {summary.get('f3_resume_bit_identical')}, without moments diverges at step "
            f"{summary.get('f3_without_moments_diverges_at_step')}")


def verdict_text(summary: dict[str, Any]) -> str:
    """``E1, E2, E3, F3 pass`` or e.g. ``E1, E2, F3 pass; E3 fails (cone-cost correlation 0.412 < 0.9)``
    from the ``<check>_pass`` keys of ``summary``."""
    passed = [c.upper() for c in CHECKS if summary.get(f"{c}_pass")]
    failed = [f"{c.upper()} fails ({why_failed(summary, c)})" for c in CHECKS if not summary.get(f"{c}_pass")]
    return "; ".join(([f"{', '.join(passed)} pass"] if passed else []) + failed)


def _number(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else str(value)


@dataclass(frozen=True)
class SlopeFit:
    """A least-squares line y ≈ intercept + slope·x over ``n`` points, with the slope's 95 % t interval
    (``low``, ``high``; NaN with fewer than 3 points or one distinct x)."""

    slope: float
    low: float
    high: float
    intercept: float
    n: int


def slope_interval(x: Sequence[float], y: Sequence[float], confidence: float = CONFIDENCE) -> SlopeFit:
    """The slope of ``y`` against ``x`` (equal lengths) by ``scipy.stats.linregress``, and its ``confidence``
    interval slope ± t(1 − (1 − confidence)/2, n − 2) · stderr; non-finite pairs are dropped."""
    xs, ys = _finite_pairs(x, y)
    n = len(xs)
    if n < 3 or len(set(xs.tolist())) < 2:
        return SlopeFit(float("nan"), float("nan"), float("nan"), float("nan"), n)
    fit = scipy_stats.linregress(xs, ys)
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, n - 2)) * float(fit.stderr)
    return SlopeFit(float(fit.slope), float(fit.slope) - half, float(fit.slope) + half, float(fit.intercept), n)


def correlation_interval(x: Sequence[float], y: Sequence[float],
                         confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(Pearson r, low, high): the ``confidence`` interval by Fisher's z, tanh(atanh r ± z / √(n − 3));
    NaN bounds with fewer than 4 pairs, r itself as both bounds when |r| = 1; non-finite pairs dropped."""
    xs, ys = _finite_pairs(x, y)
    if len(xs) < 2 or np.ptp(xs) == 0 or np.ptp(ys) == 0:
        return float("nan"), float("nan"), float("nan")
    r = float(np.corrcoef(xs, ys)[0, 1])
    if len(xs) < 4:
        return r, float("nan"), float("nan")
    if abs(r) >= 1:
        return r, r, r
    half = float(scipy_stats.norm.ppf(0.5 + confidence / 2)) / math.sqrt(len(xs) - 3)
    z = math.atanh(r)
    return r, math.tanh(z - half), math.tanh(z + half)


def bookkeeping_verdict(fit: SlopeFit, median_s: float, depth_span: float) -> str:
    """``flat``, ``grows with depth``, ``shrinks with depth`` or ``undecided`` for a slope of bookkeeping
    seconds per depth (the module docstring gives the rule); ``undecided`` without an interval."""
    if not (math.isfinite(fit.low) and math.isfinite(fit.high) and median_s > 0):
        return "undecided"
    if max(abs(fit.low), abs(fit.high)) * depth_span <= BOOKKEEPING_FLAT * median_s:
        return "flat"
    if fit.low > 0:
        return "grows with depth"
    if fit.high < 0:
        return "shrinks with depth"
    return "undecided"


def e3_statistics(depth: Sequence[float], cone_nodes: Sequence[float], recompute_s: Sequence[float],
                  bookkeeping_s: Sequence[float]) -> dict[str, Any]:
    """The summary keys judged from E3's rows (one value per graft depth): the cone-cost correlation's
    95 % interval (``e3_cone_cost_correlation_low``/``_high``), and the bookkeeping seconds against depth
    (``e3_bookkeeping_slope_s``, ``_low``, ``_high`` in seconds per depth, ``e3_bookkeeping_median_s``,
    ``e3_bookkeeping_verdict``). Timings are given, never measured here."""
    _, low, high = correlation_interval(cone_nodes, recompute_s)
    fit = slope_interval(depth, bookkeeping_s)
    _, kept = _finite_pairs(depth, bookkeeping_s)
    median = float(np.median(kept)) if len(kept) else float("nan")
    span = float(np.ptp(np.asarray(depth, dtype=float))) if len(depth) else 0.0
    return {"e3_cone_cost_correlation_low": low, "e3_cone_cost_correlation_high": high,
            "e3_bookkeeping_slope_s": fit.slope, "e3_bookkeeping_slope_low": fit.low,
            "e3_bookkeeping_slope_high": fit.high, "e3_bookkeeping_median_s": median,
            "e3_bookkeeping_verdict": bookkeeping_verdict(fit, median, span)}


def _finite_pairs(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) as float64 arrays without the pairs where either is not finite."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(xs) & np.isfinite(ys)
    return xs[keep], ys[keep]
