"""Many-model studies: a model × model similarity matrix from activation caches, in one pass.

Every cache contributes one layer (chosen by ``pairing``); all caches stream in lockstep and one
all-pairs accumulator gives the whole matrix, so M models cost one pass over the data, not M².
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from simkit.cache import check_same_samples, read_manifest, select_cached_layers, stream_caches
from simkit.errors import SimkitError
from simkit.forward import resolve_device
from simkit.results import StudyResult
from simkit.runinfo import run_meta


def pairing_layers(manifests: Sequence[dict[str, Any]], pairing: str) -> list[str]:
    """One cached layer per model: ``last``, ``first``, one name for all, or one name per cache."""
    names = [part.strip() for part in pairing.split(",") if part.strip()]
    if pairing in ("last", "first"):
        return [m["layers"][-1 if pairing == "last" else 0]["name"] for m in manifests]
    if len(names) == 1:
        names = names * len(manifests)
    if len(names) != len(manifests):
        raise SimkitError(f"--pairing lists {len(names)} layers for {len(manifests)} caches; give one name "
                          "for all, one per cache, or last/first")
    return [select_cached_layers(m, name)[0] for m, name in zip(manifests, names, strict=True)]


def model_labels(paths: Sequence[str | Path]) -> list[str]:
    """Short unique labels: the cache folder names, or full paths when those collide."""
    short = [Path(p).name for p in paths]
    return short if len(set(short)) == len(short) else [str(p) for p in paths]


def run_study(paths: Sequence[str | Path], *, pairing: str = "last",
              metrics: Sequence[str] = ("linear_cka", "unbiased_cka"), mode: str = "minibatch",
              batch_size: int = 64, n: int | None = None, null: int = 0, seed: int = 0,
              progress: bool = True, device: str | torch.device = "cpu", **options: Any) -> StudyResult:
    """Compare every pair of cached models at one layer each (the metrics run on ``device``); returns a
    StudyResult."""
    from simkit.comparison import check_metrics, measure, similarity_frame

    metrics = check_metrics(metrics)
    if len(paths) < 2:
        raise SimkitError("a study needs at least two caches")
    manifests = [read_manifest(p) for p in paths]
    check_same_samples(manifests, paths)
    layers = pairing_layers(manifests, pairing)
    labels = model_labels(paths)
    started = time.perf_counter()
    device = resolve_device(device)

    def batches():
        for sides in stream_caches(paths, [[name] for name in layers], batch_size, n, device):
            acts = [side[0] for side in sides]
            yield acts, acts

    measured = measure(batches(), metrics, mode, device, null=null, seed=seed, **options)
    frame = similarity_frame(measured.values, labels, labels).rename(
        columns={"layer_a": "model_a", "layer_b": "model_b"})
    layer_of = dict(zip(labels, layers, strict=True))
    frame.insert(2, "layer_a", frame["model_a"].map(layer_of))
    frame.insert(3, "layer_b", frame["model_b"].map(layer_of))
    models = pd.DataFrame({"label": labels, "model": [m["model"] for m in manifests], "layer": layers,
                           "cache": [str(p) for p in paths]})
    seconds = time.perf_counter() - started
    summary = {"models": labels, "metric": metrics[0], "metrics": metrics, "pairing": pairing,
               "data": manifests[0]["data"], "n": measured.rows, "mode": mode, "seconds": round(seconds, 3)}
    meta = run_meta(method=measured.method, settings={"null": null, "seed": seed, "batch_size": batch_size,
                                                      "device": str(device)})
    return StudyResult(summary=summary, tables={"study": frame, "models": models}, meta=meta)
