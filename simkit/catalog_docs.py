"""The measure table of the documentation (``docs/measures-table.md``), generated from the catalogue.

One row per built-in measure of :mod:`simkit.catalog` (range, direction, invariances, chance rule,
streaming strategy, settings, note) and one per measure setting (default, what it accepts, which
measures it changes, help), so the page cannot drift from the code: ``tests/base/test_measure_docs.py``
checks the committed file against :func:`measures_markdown`. Torch-free. Regenerate with
``python -m simkit.catalog_docs > docs/measures-table.md``.
"""

from __future__ import annotations

from simkit.catalog import (
    BUILT_IN_METRICS,
    CHANCE_MARGIN,
    DEFAULT_METRICS,
    DEFAULT_NULL,
    DEFAULT_SAMPLED_NULL,
    LARGE_EFFECT,
    MEASURE_SETTINGS,
    MEASURES,
    TESTED_NULL,
    Measure,
    measure_setting_declaration,
    used_by,
)

HEADER = f"""# Measures: the catalogue

Generated from `simkit/catalog.py` (`python -m simkit.catalog_docs > docs/measures-table.md`); a test keeps
it equal to the code. How to choose among them, their costs and where each comes from:
[Choosing a measure](measures.md). Defaults: `{", ".join(DEFAULT_METRICS)}`.

**Chance level** (what `null=None` gives, per mode `minibatch / exact`): `null` is a permutation null of
{DEFAULT_NULL} draws of the per-batch Grams (next to free); `closed` the exact expectation under a random
permutation of B's samples, in closed form (no extra work); `sampled` {DEFAULT_SAMPLED_NULL} permutations
of the stored activations (an estimate of the level, not a test). A value **beats chance** when it lies
beyond the null's 95th percentile (5th for a distance) with at least {TESTED_NULL} permutations, otherwise
when it lies more than {CHANCE_MARGIN:.0%} of the measure's range beyond its chance level; **large** means
at least {LARGE_EFFECT:.0%} of the range beyond it.
[Chance levels, intervals, p-values](chance-levels.md) explains each.

**Strategy** (per mode `minibatch / exact`): `gram` per-batch Gram sums, `features` exact feature-space
sums, `folds` cross-validated ridge sums (all three streamed: memory does not grow with n), `stored` the
activations kept (`stored-<path>` in `meta.method`); a permutation null or a small memory budget sends a
streamed measure to `stored`, and `ridge_r2` stores its samples when their number is known and they fit
the budget (its stored fold solves are faster than the streamed fold sums).
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _direction(measure: Measure) -> str:
    word = "similarity (higher = more similar)" if measure.similarity else "distance (lower = more similar)"
    return f"{word}; **directional**: rows (A) → columns (B)" if measure.directional else word


def _settings(measure: Measure) -> str:
    return ", ".join(f"`{name}`" for name in measure.settings) or "—"


def measure_row(name: str) -> str:
    """One measure's row of the table."""
    m = MEASURES[name]
    invariances = ", ".join(m.invariances) or "—"
    cells = [f"`{m.name}`", m.range_text, _direction(m), invariances, " / ".join(m.chance),
             " / ".join(m.stream), f"`stored-{m.stored_family}`", _settings(m), m.note or "—"]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def setting_row(name: str) -> str:
    """One measure setting's row: default, what it accepts, the measures it changes, its help."""
    declared = measure_setting_declaration(name)
    default = MEASURE_SETTINGS[name].default
    users = ", ".join(f"`{m}`" for m in used_by(name) if m in BUILT_IN_METRICS)
    flag = declared.flag or "--" + name.replace("_", "-")
    cells = [f"`{name}` (`{flag}`)", f"`{default}`", declared.constraint.describe(), users, declared.help]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def measures_markdown() -> str:
    """The whole page: the header, the table of measures, the table of their settings."""
    measures = ["| measure | range | kind | invariant to | chance level | strategy | stored path | settings | note |",
                "|---|---|---|---|---|---|---|---|---|", *(measure_row(n) for n in BUILT_IN_METRICS)]
    settings = ["| setting | default | accepts | changes | what it does |", "|---|---|---|---|---|",
                *(setting_row(n) for n in MEASURE_SETTINGS)]
    return "\n".join([HEADER, "## Measures", "", *measures, "", "## Their settings", "",
                      "Library keyword (`CompareSettings` field) and command-line flag.", "", *settings, ""])


if __name__ == "__main__":
    print(measures_markdown(), end="")
