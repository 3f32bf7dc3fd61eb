"""How far a swapped network has been linearized, unit by unit: the fraction of units whose slope is
exactly 1 and the mean |1 − α| over units.

A unit is one channel of one activation site (the site's dim 1; a site without channels is one unit),
whatever the granularity: a layer-wise slope covers every channel of its site, so it counts once per
channel. Slopes are read as the forward uses them (``SlopeReLU.effective_alpha``: exactly 1 where
frozen). Accumulated in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from simkit.linearization.slope import SlopeReLU


def unit_statistics(slopes: Sequence[tuple[str, SlopeReLU]], units: dict[str, int]) -> dict[str, float]:
    """``{"linearized_fraction": ..., "mean_abs_one_minus_alpha": ...}`` over every unit of ``slopes``.

    slopes: (site name, module) pairs (``slope_modules(model)``); units: site name → channels of the
    site (``ReluSite.channels``). A site's module holds one slope (layer-wise: it covers all the site's
    channels) or one slope per channel. linearized_fraction = Σ_units [α = 1] / units;
    mean_abs_one_minus_alpha = Σ_units |1 − α| / units.
    """
    total = 0
    linear = 0.0
    deviation = 0.0
    for name, module in slopes:
        count = int(units[name])
        alpha = module.effective_alpha().detach().to(torch.float64).cpu()
        linear += float((alpha == 1).to(torch.float64).mean()) * count
        deviation += float((1 - alpha).abs().mean()) * count
        total += count
    if total == 0:
        return {"linearized_fraction": float("nan"), "mean_abs_one_minus_alpha": float("nan")}
    return {"linearized_fraction": linear / total, "mean_abs_one_minus_alpha": deviation / total}


__all__ = ["unit_statistics"]
