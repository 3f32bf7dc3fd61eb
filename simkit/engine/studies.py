"""Many-model studies: a model × model similarity matrix from activation caches, in one pass.

Every cache contributes one layer (chosen by ``pairing``); all caches stream in lockstep and one
all-pairs accumulator gives the whole matrix, so M models cost one pass over the data, not M².
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from simkit.engine.assemble import Run, study_result
from simkit.engine.comparison import cache_activations
from simkit.engine.measure import Activations, measure
from simkit.engine.sources import check_same_samples, read_manifest, select_cached_layers
from simkit.errors import SimkitError
from simkit.forward import resolve_device
from simkit.metrics.settings import CompareSettings, resolve_settings
from simkit.results import StudyResult


def pairing_layers(manifests: Sequence[dict[str, Any]], pairing: str) -> list[str]:
    """One cached layer per model: ``last``, ``first``, one name for all, or one name per cache."""
    names = [part.strip() for part in pairing.split(",") if part.strip()]
    if pairing in ("last", "first"):
        return [m["layers"][-1 if pairing == "last" else 0]["name"] for m in manifests]
    if len(names) == 1:
        names = names * len(manifests)
    if len(names) != len(manifests):
        raise SimkitError(f"`pairing` lists {len(names)} layers for {len(manifests)} caches; give one name "
                          "for all, one per cache, or last/first")
    return [select_cached_layers(m, name)[0] for m, name in zip(manifests, names, strict=True)]


def model_labels(paths: Sequence[str | Path]) -> list[str]:
    """Short unique labels: the cache folder names, or full paths when those collide."""
    short = [Path(p).name for p in paths]
    return short if len(set(short)) == len(short) else [str(p) for p in paths]


def study(paths: Sequence[str | Path], settings: CompareSettings | None = None, *, pairing: str = "last",
          device: str | torch.device = "cpu", progress: bool = True, **changes: Any) -> StudyResult:
    """Compare every pair of cached models (caches written by ``simkit.engine.capture``) at one layer
    each; the metrics run on ``device``; ``settings`` and keyword ``changes`` as in ``compare``. Returns a
    StudyResult (``.matrix(metric)`` is M × M; for the directional ``ridge_r2`` row models predict column
    models)."""
    given = settings or CompareSettings()
    chosen = resolve_settings(settings, changes)
    target = resolve_device(device)
    if isinstance(paths, str | Path) or len(paths) < 2:
        raise SimkitError("a study needs at least two caches in `paths`")
    manifests = [read_manifest(p) for p in paths]
    check_same_samples(manifests, paths)
    layers = pairing_layers(manifests, pairing)
    labels = model_labels(paths)
    started = time.perf_counter()
    stream = cache_activations(paths, [[name] for name in layers], chosen, target, int(manifests[0]["n"]),
                               progress, "study")
    measured = measure((_both_sides(index, [side[0] for side in sides]) for index, sides in stream), chosen,
                       target, progress=progress)
    reductions = [m["reduce"] for m in manifests]
    run = Run(given.updated(**changes), chosen, str(target),
              {"pairing": pairing, "reduce": reductions[0] if len(set(reductions)) == 1 else reductions},
              {"models": {label: m.get("seed") for label, m in zip(labels, manifests, strict=True)}})
    return study_result(
        run, measured, labels=labels, layers=layers, models=[m["model"] for m in manifests],
        caches=[str(p) for p in paths], data=manifests[0]["data"], seconds=time.perf_counter() - started)


def _both_sides(index: int, acts: list[torch.Tensor]) -> Activations:
    """Every model's layer on both sides of the all-pairs accumulator."""
    return index, acts, acts
