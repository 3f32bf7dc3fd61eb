"""The one builder of a :class:`~simkit.results.TrendResult`, for the monitor and for checkpoint series."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from simkit.monitor.convergence import convergence, depth_order
from simkit.provenance import run_meta
from simkit.results import TrendResult
from simkit.settings.monitor import ProbeSettings


def trend_result(steps: pd.DataFrame, settings: ProbeSettings, *, layers: Sequence[str],
                 reference_layers: Sequence[str], reference: str, model: str, data: str, probe_samples: int,
                 timings: Mapping[str, float], **fields: Any) -> TrendResult:
    """The result of a run whose long table is ``steps`` (``simkit.monitor.measure.COLUMNS``); ``fields``
    go to ``meta`` (how the run was made: layer selectors, device, checkpoints, ...)."""
    table = convergence(steps, settings.delta)
    metrics = list(dict.fromkeys(steps["metric"])) if len(steps) else list(settings.metrics)
    order = depth_order(table, metrics[0]) if len(table) else {"order": "unknown", "rank_correlation": math.nan,
                                                               "stable_steps": {}}
    measured = sorted(set(int(s) for s in steps["step"])) if len(steps) else []
    summary = {
        "reference": reference, "model": model, "data": data, "metrics": metrics, "layers": list(layers),
        "reference_layers": list(reference_layers), "steps": len(measured),
        "first_step": measured[0] if measured else None, "last_step": measured[-1] if measured else None,
        "delta": settings.delta, "stable_steps": order["stable_steps"], "convergence_order": order["order"],
        "depth_rank_correlation": order["rank_correlation"], "probe_samples": int(probe_samples),
    }
    meta = run_meta(settings=settings.to_dict(), timings={k: round(float(v), 3) for k, v in timings.items()},
                    **fields)
    return TrendResult(summary=summary, tables={"steps": steps.reset_index(drop=True), "convergence": table},
                       meta=meta)
