"""The one refusal of a measure whose state would not fit ``memory_budget_bytes``: what it keeps, the
estimate against the budget, and every way out (``simkit.settings.memory`` says how the budget is found)."""

from __future__ import annotations

import math

from simkit.errors import SimkitError


def size_text(nbytes: int) -> str:
    """``nbytes`` for a person: ``"3.2 GiB"``, ``"512.0 MiB"``, ``"900 bytes"``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} bytes"


def over_budget(what: str, need: int, budget: int, *, most_n: int | None = None, first: str = "") -> SimkitError:
    """A SimkitError: ``what`` (e.g. "rsa keeps one RDM per layer") needs ``need`` bytes over the budget, and
    the ways out: ``first`` (a fix of this measure), fewer samples (at most ``most_n`` when known), fewer
    layers, a streamed measure in minibatch mode, or a larger ``memory_budget_bytes``."""
    fewer = f"at most n={most_n} (`n`)" if most_n is not None else "fewer samples (`n`)"
    ways = [way for way in (first, fewer) if way]
    return SimkitError(
        f"{what}: {size_text(need)} ({need} bytes) > `memory_budget_bytes`={size_text(budget)} ({budget} bytes); "
        f"use {', '.join(ways)}, fewer layers (`layers_a`, `layers_b`), `mode`=minibatch with a streamed measure "
        f"(linear_cka, unbiased_cka), or raise `memory_budget_bytes` to at least {math.ceil(need / 2**30)}G "
        "if the machine has that much free")
