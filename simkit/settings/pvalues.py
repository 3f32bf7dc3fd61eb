"""The options of p-values over a comparison's grid, declared once for :class:`~simkit.settings.compare.CompareSettings`.

``p_values`` asks for a p-value per cell, ``correction`` for the correction across each measure's grid
(Holm by default), ``groups`` for permutations restricted to groups of samples. Torch-free: the CLI builds
``--p-values``, ``--correction`` and ``--groups`` from these declarations, and the reports read
:data:`ALPHA` and :data:`CORRECTIONS` (the computation: :mod:`simkit.metrics.inference`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

from simkit.errors import SimkitError
from simkit.options import Choice, Constraint, Flag, Optional, option

#: the corrections across a measure's grid: Holm (family-wise error), Benjamini–Hochberg (false discovery
#: rate), none (each cell on its own)
CORRECTIONS = ("holm", "bh", "none")
#: the level of every corrected decision (``beats_chance`` with p-values)
ALPHA = 0.05
#: the fewest permutations with p-values: 1 / (K + 1) ≤ ALPHA needs K ≥ 19
LEAST_P_PERMUTATIONS = 19
#: how each correction is named in reports and findings
CORRECTION_WORDS = {"holm": "Holm-corrected", "bh": "Benjamini–Hochberg-corrected", "none": "uncorrected"}


class GroupLabels(Constraint):
    """A file with one group label per sample (a path), or the labels themselves (a sequence of scalars)."""

    def check(self, value: Any, name: str) -> Any:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, str):
            if not value.strip():
                raise self.refuse(value, name)
            return value
        if isinstance(value, bytes) or not hasattr(value, "__len__") or not hasattr(value, "__iter__"):
            raise self.refuse(value, name)
        labels = tuple(str(v) for v in value)
        if not labels:
            raise self.refuse(value, name)
        return labels

    def describe(self) -> str:
        return "a file with one group label per sample, or a non-empty sequence of labels"

    def invalid(self) -> Any:
        return 3

    def cli_type(self) -> Any:
        return str


def p_values_option() -> Any:
    """``p_values``: a p-value for every cell (``--p-values``)."""
    return option(False, Flag(), "A p-value for every cell from permutations of B's samples (p_value and "
                  "p_corrected in similarity.csv), the corrected decision as beats_chance, and a null for the "
                  "best pair (its max-corrected p-value). CKA measures: a Pearson type III fit of the exact "
                  "permutation moments; the others: enough permutations to resolve the corrected level.")


def correction_option() -> Any:
    """``correction``: across each measure's grid (``--correction``), Holm when p-values are asked."""
    return option(None, Optional(Choice(CORRECTIONS)), "With --p-values: holm (family-wise error), bh "
                  "(Benjamini-Hochberg false discovery rate) or none, across each measure's grid at alpha "
                  f"{ALPHA:g}.", show_default="holm with --p-values")


def groups_option() -> Any:
    """``groups``: permute B's samples only within groups (``--groups FILE``)."""
    return option(None, Optional(GroupLabels()), "A file with one group label per sample, in data order: "
                  "every permutation (the null, p-values) shuffles samples only within their group "
                  "(e.g. a class or a subject), for samples that are not exchangeable.", metavar="FILE",
                  show_default=False)


def check_inference(p_values: bool, correction: str | None, null: int | None) -> dict[str, Any] | None:
    """The cross-field rule of the three options: ``correction`` only with ``p_values`` (Holm when not
    given), and a given ``null`` of at least :data:`LEAST_P_PERMUTATIONS` with ``p_values``."""
    if not p_values:
        if correction is not None:
            raise SimkitError(f"`correction` {correction!r} corrects p-values; set `p_values` as well")
        return None
    if null is not None and null < LEAST_P_PERMUTATIONS:
        raise SimkitError(f"`null` must be at least {LEAST_P_PERMUTATIONS} with `p_values` (a p-value of K "
                          f"permutations is at least 1/(K+1)), got {null}; leave it unset to let each measure "
                          "take enough")
    return None if correction is not None else {"correction": "holm"}


def groups_record(groups: str | Sequence[str] | None) -> Any:
    """``groups`` as ``meta.settings`` records it: the file as given, or a sequence's count, number of
    groups and sha256 (not every label)."""
    if groups is None or isinstance(groups, str):
        return groups
    labels = [str(v) for v in groups]
    digest = hashlib.sha256("\n".join(labels).encode()).hexdigest()
    return {"labels": len(labels), "groups": len(set(labels)), "sha256": digest}
