"""Many-model studies: a model × model similarity matrix from activation caches, in one pass.

Every cache contributes one layer (chosen by ``pairing``); all caches stream in lockstep and one
all-pairs accumulator gives the whole matrix, so M models cost one pass over the data, not M².
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from simkit import distributed
from simkit.engine.assemble import study_result
from simkit.engine.batches import steps
from simkit.engine.measure import Activations, measure
from simkit.engine.options import DEFAULT_MEMORY_BUDGET, DEFAULT_METRICS, engine_options
from simkit.engine.sources import check_same_samples, read_manifest, select_cached_layers, stream_caches
from simkit.errors import SimkitError
from simkit.progress import progress_bar
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


def study(paths: Sequence[str | Path], *, pairing: str = "last", metrics: Sequence[str] = DEFAULT_METRICS,
          mode: str = "minibatch", batch_size: int = 64, n: int | None = None, null: int | None = None, seed: int = 0,
          rbf_factor: float = 1.0, knn_k: int = 10, memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
          device: str | torch.device = "cpu", shape_alpha: float = 0.5, cca_eps: float = 0.0,
          svcca_keep: float = 0.99, ridge_lambda: float = 1e-2, ridge_folds: int = 5,
          rsa_distance: str = "correlation", rsa_compare: str = "spearman", progress: bool = True) -> StudyResult:
    """Compare every pair of cached models (caches written by ``simkit.engine.capture``) at one layer
    each; the metrics run on ``device``. Returns a StudyResult (``.matrix(metric)`` is M × M; for the
    directional ``ridge_r2`` row models predict column models)."""
    options = engine_options(metrics=metrics, mode=mode, batch_size=batch_size, n=n, null=null, seed=seed,
                             rbf_factor=rbf_factor, knn_k=knn_k, memory_budget_bytes=memory_budget_bytes,
                             device=device, shape_alpha=shape_alpha, cca_eps=cca_eps,
                             svcca_keep=svcca_keep, ridge_lambda=ridge_lambda, ridge_folds=ridge_folds,
                             rsa_distance=rsa_distance, rsa_compare=rsa_compare)
    if isinstance(paths, str | Path) or len(paths) < 2:
        raise SimkitError("a study needs at least two caches in `paths`")
    manifests = [read_manifest(p) for p in paths]
    check_same_samples(manifests, paths)
    layers = pairing_layers(manifests, pairing)
    labels = model_labels(paths)
    started = time.perf_counter()
    bar = progress_bar(progress)
    task = bar.add_task(f"study ({options.mode})", total=steps(int(manifests[0]["n"]), n, batch_size))

    def activations() -> Iterator[Activations]:
        with bar:
            for index, sides in stream_caches(paths, [[name] for name in layers], batch_size, n, options.device):
                acts = [side[0] for side in sides]
                yield index, acts, acts
                bar.advance(task, distributed.world_size())

    measured = measure(activations(), options, progress=progress)
    reductions = [m["reduce"] for m in manifests]
    return study_result(
        options, measured, labels=labels, layers=layers, models=[m["model"] for m in manifests],
        caches=[str(p) for p in paths], data=manifests[0]["data"], pairing=pairing,
        settings={"reduce": reductions[0] if len(set(reductions)) == 1 else reductions},
        seeds={"models": {label: m.get("seed") for label, m in zip(labels, manifests, strict=True)}},
        seconds=time.perf_counter() - started)
