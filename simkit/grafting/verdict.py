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
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

E3_MIN_CORRELATION = 0.9
CHECKS = ("e1", "e2", "e3", "f3")


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
