"""The stored strategy's ``pairwise`` and ``plugin`` families: a measure computed pair by pair from each
layer prepared once (:mod:`simkit.metrics.pairs`), on all stored samples, in either mode.

Every layer of A and of B is prepared once (``prepare``), every pair's value is ``pair(prep_a, prep_b)``;
a permutation null prepares nothing again: B's prepared layers are reordered (``permuted``) and every pair
recomputed. Constant layers are not prepared (their pairs are NaN, as for every measure). The prepared
layers are kept together, ``layer_bytes`` each: beyond ``memory_budget_bytes`` a :class:`SimkitError` says
so before any work. A plug-in (``stored_family`` ``plugin``) is a :class:`~simkit.metrics.pairs.PluginPair`
built from its catalogue row.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from simkit.catalog import MEASURES
from simkit.errors import SimkitError
from simkit.metrics.budget import over_budget
from simkit.metrics.pairs import PAIR_MEASURES, PairMeasure, PluginPair, check_pair_n
from simkit.metrics.settings import MeasureSettings
from simkit.metrics.streaming.common import mask_constant, null_summary


def built_in_measure(name: str, settings: MeasureSettings) -> PairMeasure:
    """The :class:`~simkit.metrics.pairs.PairMeasure` of built-in measure ``name`` under ``settings``."""
    return PAIR_MEASURES[name](settings)


def plugin_measure(name: str, settings: MeasureSettings) -> PairMeasure:
    """The :class:`~simkit.metrics.pairs.PluginPair` of registered measure ``name`` (its catalogue row)."""
    row = MEASURES[name]
    if row.function is None:
        raise SimkitError(f"measure {name!r} is not a plug-in; register it with simkit.register_measure")
    return PluginPair(name, row.function, row.input_kind, settings.rsa_distance)


def _grid(measure: PairMeasure, prep_a: list[Any], prep_b: list[Any], device: torch.device) -> Tensor:
    """Every pair's value ``(La, Lb)`` float64; NaN where a side was not prepared (a constant layer)."""
    out = torch.full((len(prep_a), len(prep_b)), float("nan"), dtype=torch.float64, device=device)
    for i, a in enumerate(prep_a):
        for j, b in enumerate(prep_b):
            if a is not None and b is not None:
                out[i, j] = measure.pair(a, b)
    return out


def _check_memory(measure: PairMeasure, part: Any, widths: list[int]) -> None:
    need = sum(measure.layer_bytes(part.n, d) for d in widths)
    if need > part.budget:
        raise over_budget(f"{measure.name} keeps every layer prepared from all n={part.n} samples", need, part.budget)


def pairwise_values(part: Any, name: str, samples: Any, build: Any) -> dict[str, dict[str, Any]]:
    """Measure ``name`` over all layer pairs of ``samples`` (the stored part's
    :class:`~simkit.metrics.streaming.stored.Samples`), with its null when ``part.null`` asks for one:
    ``{name: {"value": (La, Lb)[, "null", ...]}}``. ``build(name, settings)`` gives its PairMeasure."""
    xa, xb, perms, const_a, const_b = samples
    measure: PairMeasure = build(name, part.settings)
    check_pair_n(measure, part.n, getattr(measure, "k", None))
    _check_memory(measure, part, part.dims_a + part.dims_b)
    prep_a = [None if bool(c) else measure.prepare(x, "a") for x, c in zip(xa, const_a, strict=True)]
    prep_b = [None if bool(c) else measure.prepare(x, "b") for x, c in zip(xb, const_b, strict=True)]
    device = xa[0].device
    result: dict[str, Any] = {"value": mask_constant(_grid(measure, prep_a, prep_b, device), const_a, const_b)}
    if part.null and perms is not None:
        draws = []
        for pk in perms:
            shuffled = [None if p is None else measure.permuted(p, pk) for p in prep_b]
            draws.append(_grid(measure, prep_a, shuffled, device))
            part.report(f"{name} null ({part.null} permutations)", 1, part.null)
        result.update(null_summary(mask_constant(torch.stack(draws), const_a, const_b)))
    return {name: result}


def compute_pairwise(part: Any, measures: list[str], samples: Any) -> dict[str, dict[str, Any]]:
    """Family ``pairwise``: each built-in measure of :data:`~simkit.metrics.pairs.PAIR_MEASURES`."""
    out: dict[str, dict[str, Any]] = {}
    for name in measures:
        out.update(pairwise_values(part, name, samples, built_in_measure))
    return out


def compute_plugin(part: Any, measures: list[str], samples: Any) -> dict[str, dict[str, Any]]:
    """Family ``plugin``: each registered measure, its function per pair."""
    out: dict[str, dict[str, Any]] = {}
    for name in measures:
        out.update(pairwise_values(part, name, samples, plugin_measure))
    return out


def pairwise_notes(part: Any, name: str) -> dict[str, Any]:
    """``describe()`` entries of a built-in pairwise measure: its settings and how it was computed."""
    settings = {s: getattr(part.settings, s) for s in MEASURES[name].settings}
    return {**settings, "note": "each layer prepared once from all samples (in either mode), then every pair"}


def plugin_notes(part: Any, name: str) -> dict[str, Any]:
    """``describe()`` entries of a plug-in: its function and what it receives."""
    row = MEASURES[name]
    fn = row.function
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    return {"function": where, "input": row.input_kind, "note": "a plug-in measure, called per pair on all samples"}
