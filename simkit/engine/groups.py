"""The group labels of ``settings.groups`` (``--groups FILE``): one label per sample, in data order.

Permutations then move each sample only within its group (``simkit.metrics.streaming.common.draw_perms``),
the null of data whose samples are exchangeable only within groups (images of one class, trials of one
subject). A file holds one label per line (surrounding spaces dropped, blank lines refused); a sequence
holds the labels themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from simkit.errors import SimkitError


def read_groups(groups: str | Sequence[str] | None) -> list[str] | None:
    """The labels of ``groups`` (a file path, or the labels), or None."""
    if groups is None:
        return None
    if not isinstance(groups, str):
        return [str(label) for label in groups]
    path = Path(groups)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SimkitError(f"cannot read `groups` file {groups!r} ({type(exc).__name__}); give a UTF-8 text file "
                          "with one group label per sample") from None
    labels = [line.strip() for line in lines]
    blank = next((k for k, label in enumerate(labels) if not label), None)
    if not labels or blank is not None:
        where = f"line {blank + 1} is blank" if blank is not None else "it is empty"
        raise SimkitError(f"`groups` file {groups!r}: {where}; give one group label per sample, one per line")
    return labels


def check_group_count(labels: list[str] | None, rows: int, capped: bool) -> int | None:
    """The number of groups; a SimkitError when the labels do not match the ``rows`` samples compared (more
    labels are allowed only when ``n`` capped the data: the first ``rows`` are used)."""
    if labels is None:
        return None
    if len(labels) < rows or (len(labels) > rows and not capped):
        raise SimkitError(f"`groups` gives {len(labels)} labels for {rows} samples; give one group label per "
                          "sample, in data order")
    used = labels[:rows]
    if len(set(used)) == len(used):
        raise SimkitError("`groups` puts every sample in a group of its own, so no permutation could move one; "
                          "give labels shared by several samples (e.g. a class)")
    return len(set(used))
