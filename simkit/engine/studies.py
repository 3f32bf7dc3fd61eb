"""Many-model studies: a model × model similarity matrix from activation caches, in one pass.

Every cache contributes one layer (chosen by ``pairing``); all caches stream in lockstep and one
all-pairs accumulator gives the whole matrix, so M models cost one pass over the data, not M².
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simkit.engine.arrays import MEMORY, Side, align, as_source, is_imported, stream_sides
from simkit.engine.assemble import Run, study_result
from simkit.engine.comparison import cache_activations
from simkit.engine.measure import Activations, measure
from simkit.engine.samples import refuse_samples
from simkit.engine.sources import check_same_samples, is_cache, read_manifest, select_cached_layers
from simkit.engine.study_views import study_views
from simkit.errors import SimkitError
from simkit.forward import resolve_device
from simkit.metrics.settings import CompareSettings, resolve_settings
from simkit.results import StudyResult

PAIRING_HELP = ("last, first, depth[:F] (each cache's layer at relative depth F of its cached layers, 0 = "
                "first, 1 = last; default 0.5), one layer name for all, one name per cache (A,B,C), or "
                "alternative names across architectures (A=B: each cache uses the one it holds)")


def pairing_layers(manifests: Sequence[dict[str, Any]], pairing: str) -> list[str]:
    """One cached layer per model, chosen by ``pairing`` (see :data:`PAIRING_HELP`)."""
    text = pairing.strip()
    if text in ("last", "first"):
        return [m["layers"][-1 if text == "last" else 0]["name"] for m in manifests]
    if text == "depth" or text.startswith("depth:"):
        fraction = relative_depth(text)
        return [layer_at_depth(m, fraction) for m in manifests]
    if "=" in text:
        return [alternative_layer(m, text, index, len(manifests)) for index, m in enumerate(manifests)]
    names = [part.strip() for part in text.split(",") if part.strip()]
    if len(names) == 1:
        names = names * len(manifests)
    if len(names) != len(manifests):
        raise SimkitError(f"`pairing` lists {len(names)} layers for {len(manifests)} caches; give one name "
                          "for all, one per cache, A=B names across architectures, depth[:F], or last/first")
    return [select_cached_layers(m, name)[0] for m, name in zip(manifests, names, strict=True)]


def relative_depth(text: str) -> float:
    """F of ``depth[:F]`` (default 0.5), checked to lie in [0, 1]."""
    given = text.partition(":")[2].strip() or "0.5"
    try:
        fraction = float(given)
    except ValueError:
        fraction = float("nan")
    if not 0.0 <= fraction <= 1.0:
        raise SimkitError(f"`pairing` {text!r} is not a relative depth; give depth:F with F from 0 (each "
                          "cache's first layer) to 1 (its last), e.g. depth:0.5")
    return fraction


def depth_index(count: int, fraction: float) -> int:
    """The index of the layer nearest relative depth ``fraction`` among ``count`` layers (layer i sits at
    i / (count − 1); halves round up)."""
    return min(count - 1, int(np.floor(fraction * (count - 1) + 0.5)))


def layer_at_depth(manifest: dict[str, Any], fraction: float) -> str:
    """The cached layer of ``manifest`` nearest relative depth ``fraction`` (in the cache's layer order)."""
    layers = manifest["layers"]
    return layers[depth_index(len(layers), fraction)]["name"]


def alternative_layer(manifest: dict[str, Any], text: str, index: int, caches: int) -> str:
    """The one name of ``A=B[=C…]`` the cache holds; when it holds several, the ``index``-th name (one
    name per cache, in order) if there are as many names as caches."""
    names = [part.strip() for part in text.split("=")]
    if "," in text or not all(names):
        raise SimkitError(f"`pairing` {text!r} mixes forms; give A=B (names of one layer across "
                          "architectures, each cache using the one it holds) or A,B,C (one name per cache)")
    held = {layer["name"] for layer in manifest["layers"]}
    hits = [name for name in dict.fromkeys(names) if name in held]
    if len(hits) == 1:
        return hits[0]
    if len(names) == caches and names[index] in held:
        return names[index]
    if not hits:
        shown = ", ".join(layer["name"] for layer in manifest["layers"][:8])
        raise SimkitError(f"`pairing` {text!r}: the cache of {manifest['model']} holds none of "
                          f"{', '.join(names)}; it holds: {shown}")
    raise SimkitError(f"`pairing` {text!r}: the cache of {manifest['model']} holds {' and '.join(hits)}; "
                      "give one name per cache in cache order (A=B=C) or A,B,C")


def model_labels(paths: Sequence[str | Path]) -> list[str]:
    """Short unique labels: the cache folder names, or full paths when those collide."""
    short = [Path(p).name for p in paths]
    return short if len(set(short)) == len(short) else [str(p) for p in paths]


def check_names(names: Sequence[str], count: int) -> list[str]:
    """``names`` as a list of ``count`` distinct non-empty labels, one per model; else a SimkitError."""
    given = [str(name).strip() for name in ([names] if isinstance(names, str) else names)]
    if len(given) != count or not all(given) or len(set(given)) != count:
        raise SimkitError(f"`names` gives {len(given)} names ({', '.join(given) or 'none'}) for {count} models; "
                          "give one distinct, non-empty name per model, in order")
    return given


def study(paths: Sequence[Any], settings: CompareSettings | None = None, *, pairing: str = "last",
          device: str | torch.device = "cpu", progress: bool = True, names: Sequence[str] | None = None,
          **changes: Any) -> StudyResult:
    """Compare every pair of cached models (caches written by ``simkit.engine.capture``) at one layer
    each; the metrics run on ``device``; ``settings`` and keyword ``changes`` as in ``compare``. Returns a
    StudyResult (``.matrix(metric)`` is M × M; for the directional ``ridge_r2`` row models predict column
    models). ``names``: one label per cache, for the tables and reports (default: the cache folders' names).
    ``paths`` may mix caches with activations (files, directories, mappings of arrays, loaded sources:
    ``simkit.engine.arrays``), matched by sample IDs when all have them, else by position."""
    given = settings or CompareSettings()
    chosen = resolve_settings(settings, changes)
    target = resolve_device(device)
    refuse_samples(chosen.samples, "a study")
    if isinstance(paths, str | Path) or len(paths) < 2:
        raise SimkitError("a study needs at least two caches in `paths`")
    if not all(isinstance(p, str | Path) and is_cache(p) and not is_imported(p) for p in paths):
        return study_sources(paths, Run(given.updated(**changes), chosen, str(target), {"pairing": pairing,
                             "reduce": "auto"}, {}), pairing=pairing, progress=progress, names=names)
    manifests = [read_manifest(p) for p in paths]
    check_same_samples(manifests, paths)
    layers = pairing_layers(manifests, pairing)
    labels = model_labels(paths) if names is None else check_names(names, len(paths))
    started = time.perf_counter()
    stream = cache_activations(paths, [[name] for name in layers], chosen, target, int(manifests[0]["n"]),
                               progress, "study")
    measured = measure((_both_sides(index, [side[0] for side in sides]) for index, sides in stream), chosen,
                       target, progress=progress)
    reductions = [m["reduce"] for m in manifests]
    run = Run(given.updated(**changes), chosen, str(target),
              {"pairing": pairing, "reduce": reductions[0] if len(set(reductions)) == 1 else reductions},
              {"models": {label: m.get("seed") for label, m in zip(labels, manifests, strict=True)}})
    result = study_result(
        run, measured, labels=labels, layers=layers, models=[m["model"] for m in manifests],
        caches=[str(p) for p in paths], data=manifests[0]["data"], seconds=time.perf_counter() - started)
    return with_models_and_views(result, manifests, layers)


def study_sources(entries: Sequence[Any], run: Run, *, pairing: str, progress: bool,
                  names: Sequence[str] | None) -> StudyResult:
    """A study over activation sources (``simkit.engine.arrays``): one pass over their aligned samples, one
    layer each (``pairing``), the same result as a study of caches plus each source's provenance and the
    ``samples`` alignment in the summary."""
    target = torch.device(run.device)
    started = time.perf_counter()
    with ExitStack() as stack:
        sources = [stack.enter_context(as_source(entry, f"paths[{i}]", label=f"arrays {i + 1}"))
                   for i, entry in enumerate(entries)]
        alignment = align(sources, run.settings.overlap())
        views = [source.manifest_view() for source in sources]
        layers = pairing_layers(views, pairing)
        labels = model_labels([str(s.path or s.label) for s in sources]) if names is None else check_names(names, len(sources))
        sides = [Side(source, [layer], index, "auto")
                 for source, layer, index in zip(sources, layers, alignment.index, strict=True)]
        stream = stream_sides(sides, alignment.matched, run.settings, target, progress, "study")
        measured = measure((_both_sides(index, [side[0] for side in acts]) for index, acts in stream),
                           run.settings, target, progress=progress)
        result = study_result(run, measured, labels=labels, layers=layers, models=[s.label for s in sources],
                              caches=[str(s.path) if s.path is not None else MEMORY for s in sources],
                              data="activations", seconds=time.perf_counter() - started)
        result.meta["sources"] = {label: s.origin() for label, s in zip(labels, sources, strict=True)}
    result.summary["samples"] = alignment.record(labels)
    return with_models_and_views(result, views, layers)


def with_models_and_views(result: StudyResult, manifests: Sequence[dict[str, Any]],
                          layers: Sequence[str]) -> StudyResult:
    """``result`` with each model's weights (``summary.weights``, in model order, and the ``models``
    table's ``weights`` column), the relative depth of its chosen layer among its cached layers (``depth``,
    0 = first, 1 = last) and the ``embedding`` and ``linkage`` tables (``simkit.engine.study_views``)."""
    weights = [str(m.get("weights", "unknown (a cache written before weights were recorded)")) for m in manifests]
    names = [[layer["name"] for layer in m["layers"]] for m in manifests]
    models = result.tables["models"]
    models["weights"] = weights
    models["depth"] = [names_of.index(layer) / (len(names_of) - 1) if len(names_of) > 1 else 1.0
                       for names_of, layer in zip(names, layers, strict=True)]
    result.summary["weights"] = weights
    matrices = {metric: result.matrix(metric) for metric in result.summary["metrics"]}
    result.tables.update(study_views(matrices))
    return result


def _both_sides(index: int, acts: list[torch.Tensor]) -> Activations:
    """Every model's layer on both sides of the all-pairs accumulator."""
    return index, acts, acts
