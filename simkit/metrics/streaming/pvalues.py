"""p-values of the accumulator: how many permutations each measure draws, and the cells' p-values from them.

With ``settings.p_values`` (and ``null`` not given) a measure whose p-values come from its permutation
moments (the CKA family: :mod:`simkit.metrics.permutation_moments`, unless ``groups`` restrict the
permutations) draws :data:`~simkit.metrics.inference.MAX_NULL_DRAWS` permutations, for the null of the
best pair only; every other measure draws enough to resolve the corrected level
(:func:`~simkit.metrics.inference.p_value_permutations`). Without ``p_values`` the counts are the
settings' own (``CompareSettings.permutations``), unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from simkit.catalog import DEFAULT_SAMPLED_NULL, GRAM_KINDS, MEASURES
from simkit.errors import SimkitError
from simkit.metrics.inference import p_value_permutations, permutation_p
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming.common import Values


class Draws:
    """The permutations of every measure of one accumulator: ``cells`` layer pairs, ``grouped`` when the
    permutations are restricted to groups (no moment-matched p-values then)."""

    def __init__(self, settings: CompareSettings, cells: int, grouped: bool):
        self.settings, self.cells, self.grouped = settings, cells, grouped
        self.asked = settings.p_values and settings.null is None   # p-values choose the counts

    def moment_matched(self, name: str) -> bool:
        """Whether ``name``'s p-values come from its permutation moments (not from its draws)."""
        return bool(self.settings.p_values) and not self.grouped and name in GRAM_KINDS

    def of(self, name: str) -> int:
        """The permutations measure ``name`` draws (with groups, a closed-form chance level, which assumes free
        permutations, gives way to :data:`~simkit.catalog.DEFAULT_SAMPLED_NULL` permutations within groups)."""
        if not self.asked:
            count = self.settings.permutations(name)
            free_form = self.grouped and count == 0 and self.settings.null is None
            return DEFAULT_SAMPLED_NULL if free_form else count
        return p_value_permutations(self.cells, self.moment_matched(name))

    def stored(self, names: Sequence[str]) -> int:
        """The permutations of the stored strategy (one set for all its measures)."""
        if not self.asked:
            return self.settings.stored_permutations(names)
        return max(self.of(m) for m in names)

    def own(self, names: Sequence[str]) -> dict[str, int]:
        """The stored measures that draw fewer than the stored strategy (the moment-matched CKA family, whose
        null serves its best pair only)."""
        return {m: self.of(m) for m in names if self.asked and self.moment_matched(m)}


def group_codes(groups: Any) -> Tensor | None:
    """``groups`` (labels or integer codes, one per sample, in data order) as ``(n,)`` int64 codes."""
    if groups is None:
        return None
    labels = list(groups.tolist() if hasattr(groups, "tolist") else groups)   # a tensor or array: its values
    if not labels:
        raise SimkitError("`groups` is empty; give one group label per sample")
    _, codes = np.unique(np.asarray([str(v) for v in labels]), return_inverse=True)
    return torch.as_tensor(codes.astype(np.int64))


def check_groups_cover(groups: Tensor | None, offset: int, rows: int) -> None:
    """A SimkitError when the group labels end before the batch's samples do."""
    if groups is not None and offset + rows > len(groups):
        raise SimkitError(f"`groups` gives {len(groups)} labels but the data has more samples (at least "
                          f"{offset + rows}); give one group label per sample, in data order")


def with_p_values(values: Values, metrics: Sequence[str]) -> Values:
    """``values`` with each metric's ``p_value`` from its permutation draws where the path gave none
    (:func:`~simkit.metrics.inference.permutation_p`, the catalogue's direction), NaN where the value is."""
    for m in metrics:
        arrays = values[m]
        value = np.asarray(arrays["value"], dtype=np.float64)
        if "p_value" not in arrays and "null" in arrays:
            arrays["p_value"] = permutation_p(value, arrays["null"], MEASURES[m].similarity)
        if "p_value" in arrays:
            arrays["p_value"] = np.where(np.isfinite(value), arrays["p_value"], np.nan)
    return values


def describe_p_values(described: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``described`` (``{metric: describe()}``) with how each metric's p-values were found (``p_value``) and
    the smallest p-value its permutations can give (``smallest_p``; None for a fitted distribution)."""
    for m, entry in described.items():
        draws = int(entry.get("null") or 0)
        if "p_value" in entry:
            entry["smallest_p"] = None
            continue
        side = "≥" if MEASURES[m].similarity else "≤ (a distance)"
        entry["p_value"] = f"permutations: (1 + #{{null {side} value}}) / (1 + K), K = {draws}"
        entry["smallest_p"] = 1.0 / (draws + 1) if draws else None
    return described
