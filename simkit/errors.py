"""The one exception type for bad input.

Anything a user can fix (an unknown layer, a bad spec, mismatched sample counts) raises
:class:`SimkitError` with a one-line message naming the problem and the fix. The CLI prints it on
stderr and exits with code 2; any other exception is an internal error (exit code 1).

Messages name the *library's* arguments, in backticks: "`batch_size` must be a positive integer,
got -1". The CLI turns each backticked argument name into its own flag (``--batch-size``) in one
place (``simkit.cli.common.cli_message``), so the library never speaks of flags.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any


class SimkitError(ValueError):
    """Bad input: the message is shown to the user as one line, without a traceback."""


def closest(name: str, candidates: Iterable[str], n: int = 5) -> list[str]:
    """The candidates that look most like ``name`` (best first), for "did you mean" hints."""
    pool = list(candidates)
    found = difflib.get_close_matches(name, pool, n=n, cutoff=0.4)
    if not found:  # fall back to substring matches, then to the first few names
        found = [c for c in pool if name.lower() in c.lower()][:n] or pool[:n]
    return found


def unknown_name_error(kind: str, name: str, candidates: Iterable[str], hint: str = "") -> SimkitError:
    """A SimkitError for an unknown ``kind`` called ``name``, listing the closest valid names."""
    near = ", ".join(closest(name, candidates))
    tail = f"; {hint}" if hint else ""
    return SimkitError(f"unknown {kind} {name!r}; closest: {near}{tail}")


def check_real(name: str, value: Any, low: float, *, strict: bool = False, optional: bool = False) -> None:
    """A finite real number ``> low`` (strict) or ``>= low`` for argument ``name``; None allowed when
    ``optional``; else a SimkitError naming the argument."""
    if optional and value is None:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and (
        value > low if strict else value >= low)
    if not ok:
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise SimkitError(f"`{name}` must be a finite number {bound}, got {value!r}")
