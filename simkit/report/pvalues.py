"""What the reports and the terminal say of a run with p-values (``summary["p_values"]``, written by
``simkit.engine.significance``): the rule that decided ``beats_chance``, the best pair against the null of
the grid's maximum, the runs whose permutations cannot reach the corrected level, and a table per measure.

Reads only the summary; computes nothing but words.
"""

from __future__ import annotations

from typing import Any

from simkit.settings.pvalues import CORRECTION_WORDS


def record(summary: dict[str, Any]) -> dict[str, Any] | None:
    """``summary["p_values"]``, or None for a run without p-values."""
    found = summary.get("p_values")
    return found if isinstance(found, dict) and isinstance(found.get("metrics"), dict) else None


def _entry(summary: dict[str, Any], metric: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    rec = record(summary)
    if rec is None or metric not in rec["metrics"]:
        return None
    return rec, rec["metrics"][metric]


def _p(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2g}" if value >= 1e-3 else f"{value:.1e}"


def method_words(entry: dict[str, Any]) -> str:
    """How a measure's p-values were found, in words."""
    if entry.get("method") == "pearson3":
        return "a Pearson type III fit of the exact permutation moments"
    return f"{entry.get('permutations', '?')} permutations (smallest possible p {_p(entry.get('smallest_p'))})"


def test_rule(summary: dict[str, Any], metric: str) -> str | None:
    """The rule ``beats_chance`` applied with p-values ("Holm-corrected p ≤ 0.05 over 308 cells; p from …"),
    or None without them."""
    found = _entry(summary, metric)
    if found is None:
        return None
    rec, entry = found
    words = CORRECTION_WORDS.get(str(rec.get("correction")), str(rec.get("correction")))
    groups = f", permuted within {rec['groups']} groups" if rec.get("groups") else ""
    return (f"{words} p ≤ {rec.get('alpha', 0.05):g} over {entry.get('cells', '?')} cells; p from "
            f"{method_words(entry)}{groups}")


def best_sentence(summary: dict[str, Any], metric: str, what: str = "pair of layers") -> str | None:
    """The best cell of ``metric`` against the null of the grid's maximum, in one sentence; None without it."""
    found = _entry(summary, metric)
    best = found[1].get("best") if found else None
    if not best:
        return None
    names = [str(v) for k, v in best.items() if k.startswith(("layer_", "model_"))][:2]
    head = f"The most similar {what}, {' and '.join(names)} ({metric} {best['value']:.3f}),"
    if best.get("p_max") is None:
        return f"{head} has no null for the grid's maximum (no permutations were drawn)."
    verdict = "beats" if best.get("beats_max_null") else "does not beat"
    return (f"{head} {verdict} the null of the best {what} (the grid's maximum under {best['permutations']} "
            f"permutations of B's samples): max-corrected p = {_p(best['p_max'])}.")


def floor_cautions(summary: dict[str, Any]) -> list[str]:
    """A caution per measure whose permutations cannot give a p-value below Holm's (or BH's) first threshold
    alpha / cells, so no cell could pass the corrected test however similar."""
    rec = record(summary)
    if rec is None or rec.get("correction") == "none":
        return []
    out = []
    for metric, entry in rec["metrics"].items():
        floor, cells = entry.get("smallest_p"), entry.get("cells") or 0
        if floor is not None and cells and floor > rec.get("alpha", 0.05) / cells:
            out.append(f"{metric}: with {entry.get('permutations')} permutations no p-value can go below "
                       f"{_p(floor)}, above the corrected level {rec.get('alpha', 0.05):g}/{cells}; leave --null "
                       "unset (enough permutations are then drawn) or raise it.")
    return out


def test_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measure for the report's table of tests."""
    rec = record(summary)
    if rec is None:
        return []
    rows = []
    for metric, entry in rec["metrics"].items():
        best = entry.get("best") or {}
        names = [str(v) for k, v in best.items() if k.startswith(("layer_", "model_"))][:2]
        rows.append({"metric": metric, "method": method_words(entry), "significant": entry.get("significant"),
                     "cells": entry.get("cells"), "best": " × ".join(names) or "n/a",
                     "value": best.get("value", float("nan")), "p_max": _p(best.get("p_max")) if best else "n/a"})
    return rows


def p_values_words(summary: dict[str, Any]) -> str | None:
    """The run summary's line on p-values ("holm at alpha 0.05, permutations within 10 groups")."""
    rec = record(summary)
    if rec is None:
        return None
    groups = f", permutations within {rec['groups']} groups" if rec.get("groups") else ""
    return f"{rec.get('correction')} correction at alpha {rec.get('alpha', 0.05):g}{groups}"


def decision_words(summary: dict[str, Any]) -> str | None:
    """"Holm-corrected p ≤ 0.05": the decision behind the counts of a run with p-values (None: without)."""
    rec = record(summary)
    if rec is None:
        return None
    return f"{CORRECTION_WORDS.get(str(rec.get('correction')), rec.get('correction'))} p ≤ {rec.get('alpha', 0.05):g}"


def best_of(summary: dict[str, Any], metric: str) -> dict[str, Any] | None:
    """The best pair of ``metric`` with its max-corrected p-value (``summary["p_values"]``), or None."""
    found = _entry(summary, metric)
    return found[1].get("best") if found else None


def best_words(best: dict[str, Any]) -> str:
    """"A × B (0.871), max-corrected p = 0.005" for a best pair."""
    names = [str(v) for k, v in best.items() if k.startswith(("layer_", "model_"))][:2]
    return f"{' × '.join(names)} ({best['value']:.3f}), max-corrected p = {_p(best.get('p_max'))}"
