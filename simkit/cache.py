"""Activation caches: capture a model's layers once, compare many times without the model.

A cache directory holds safetensors shards (``shard-00000.safetensors``: one ``(rows, dim)`` tensor per
layer) and ``manifest.json`` (model, data, layers with shapes and reductions, n, shards). The manifest
is written last, so an interrupted capture never looks like a cache. Comparing streams shard by
shard, so caches larger than memory work.
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from simkit import distributed
from simkit.batches import check_batch_size, count_rows, iter_batches, rebatch
from simkit.errors import SimkitError, unknown_name_error
from simkit.forward import resolve_device
from simkit.io import atomic_write, write_json
from simkit.runinfo import run_meta

FORMAT = "simkit-activations/1"
MANIFEST = "manifest.json"


def is_cache(path: str | Path) -> bool:
    """True when ``path`` is a directory written by ``capture_to_cache``."""
    return (Path(path) / MANIFEST).is_file()


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The parsed ``manifest.json`` of the cache directory ``path`` (model, data, n, layers with dims)."""
    path = Path(path)
    if not is_cache(path):
        raise SimkitError(f"{path} is not an activation cache (no {MANIFEST}); write one with `simkit capture`")
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise SimkitError(f"{path} has cache format {manifest.get('format')!r}; this simkit reads {FORMAT}")
    return manifest


def capture_to_cache(model: nn.Module, data: Any, out: str | Path, *, layers: str | Sequence[str] = "blocks",
                     reduce: str = "flatten", batch_size: int = 64, n: int | None = None,
                     device: str | torch.device = "cpu", output_index: Any = None, shard_bytes: int = 256 * 2**20,
                     dtype: torch.dtype = torch.float32, model_name: str = "model",
                     data_name: str | None = None, seed: int = 0, progress: bool = True) -> Path:
    """Run ``model`` over ``data`` once and write the chosen layers' activations to ``out``.

    Activations are reduced to (n, dim) per layer and stored in ``dtype``; shards hold about
    ``shard_bytes`` each. Returns the cache directory.
    """
    from safetensors.torch import save_file

    from simkit.layers import resolve_layers

    check_batch_size(batch_size)
    from simkit.comparison import Tap
    from simkit.progress import progress_bar

    if distributed.is_distributed():
        raise SimkitError("simkit capture runs in one process; launch it without torchrun")
    device = resolve_device(device)  # before anything is written
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    chosen = resolve_layers(model, layers)
    model.to(device)
    shards: list[dict[str, Any]] = []
    pending: list[list[torch.Tensor]] = []
    pending_bytes = 0
    rows = 0
    started = time.perf_counter()

    def flush() -> None:
        nonlocal pending, pending_bytes
        if not pending:
            return
        tensors = {name: torch.cat([part[i] for part in pending]).contiguous()
                   for i, name in enumerate(chosen)}
        name = f"shard-{len(shards):05d}.safetensors"
        atomic_write(out / name, lambda p: save_file(tensors, str(p)))
        shards.append({"file": name, "rows": int(next(iter(tensors.values())).shape[0])})
        pending, pending_bytes = [], 0

    total = count_rows(data)
    steps = None if total is None else -(-min(total, n or total) // batch_size)
    bar = progress_bar(progress)
    task = bar.add_task("capture", total=steps)
    with Tap(model, chosen, model_name, reduce=reduce, output_index=output_index,
             device=device) as tap, bar:
        for batch in iter_batches(data, batch_size, n):
            acts = [a.detach().to("cpu", dtype) for a in tap.step(batch)]
            dims = [int(a.shape[1]) for a in acts]
            pending.append(acts)
            pending_bytes += sum(a.numel() * a.element_size() for a in acts)
            rows += int(acts[0].shape[0])
            if pending_bytes >= shard_bytes:
                flush()
            bar.advance(task)
        flush()
        layer_rows = tap.layer_rows("a", dims) if rows else []
    if not rows:
        raise SimkitError("the data yielded no samples; check --data and --n")
    manifest = run_meta(
        format=FORMAT, model=model_name, data=data_name or type(data).__name__, n=rows, seed=seed,
        batch_size=batch_size, reduce=reduce, dtype=str(dtype).replace("torch.", ""),
        layers=[{k: v for k, v in row.items() if k != "model"} for row in layer_rows],
        shards=shards, seconds=round(time.perf_counter() - started, 3),
    )
    write_json(out / MANIFEST, manifest)
    return out


def select_cached_layers(manifest: dict[str, Any], selector: str | Sequence[str]) -> list[str]:
    """Cached layer names chosen by names and globs (``blocks`` = every cached layer), in cache order."""
    names = [layer["name"] for layer in manifest["layers"]]
    parts = selector.split(",") if isinstance(selector, str) else list(selector)
    chosen: list[str] = []
    for part in (p.strip() for p in parts):
        if part in ("blocks", "all"):
            hits = names
        elif any(ch in part for ch in "*?["):
            hits = [name for name in names if fnmatch.fnmatchcase(name, part)]
        else:
            hits = [part] if part in names else []
        if not hits:
            raise unknown_name_error("cached layer", part, names,
                                     f"the cache of {manifest['model']} holds: {', '.join(names[:8])}")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def iter_cache(path: str | Path, layers: list[str]) -> Iterator[dict[str, torch.Tensor]]:
    """Yield each shard's chosen layers, one shard in memory at a time."""
    from safetensors import safe_open

    manifest = read_manifest(path)
    for shard in manifest["shards"]:
        with safe_open(str(Path(path) / shard["file"]), framework="pt") as handle:
            yield {name: handle.get_tensor(name) for name in layers}


def stream_caches(paths: Sequence[str | Path], layers: Sequence[list[str]], batch_size: int,
                  n: int | None, device: str | torch.device = "cpu") -> Iterator[list[list[torch.Tensor]]]:
    """Lockstep global batches over several caches: per batch, per cache, one (b, d) float32 tensor per
    layer, on ``device`` (already checked by the caller, see ``simkit.forward.resolve_device``)."""
    rank, world = distributed.rank(), distributed.world_size()
    streams = [rebatch(iter_cache(p, names), batch_size, n, rank, world) for p, names in zip(paths, layers, strict=True)]
    for batches in zip(*streams, strict=True):
        yield [[batch[name].to(device=device, dtype=torch.float32) for name in names]
               for batch, names in zip(batches, layers, strict=True)]


def check_same_samples(manifests: Sequence[dict[str, Any]], paths: Sequence[str | Path]) -> None:
    """Caches compared together must hold the same samples in the same order."""
    first = manifests[0]
    for manifest, path in zip(manifests[1:], paths[1:], strict=True):
        for key in ("data", "n"):
            if manifest[key] != first[key]:
                raise SimkitError(f"caches hold different data: {paths[0]} has {key}={first[key]!r} but "
                                  f"{path} has {key}={manifest[key]!r}; capture both with the same --data and --n")


def compare_caches(path_a: str | Path, path_b: str | Path, *, layers_a: str | Sequence[str] = "blocks",
                   layers_b: str | Sequence[str] = "blocks", metrics: Sequence[str] = ("linear_cka", "unbiased_cka"),
                   mode: str = "minibatch", batch_size: int = 64, n: int | None = None, null: int = 0,
                   seed: int = 0, progress: bool = True, device: str | torch.device = "cpu", **options: Any):
    """Compare two caches as ``simkit.compare`` compares two models (the metrics run on ``device``);
    returns a CompareResult."""
    from simkit.comparison import (
        CompareResult,
        check_metrics,
        compare_summary,
        layers_meta,
        measure,
        similarity_frame,
    )

    metrics = check_metrics(metrics)
    manifests = [read_manifest(path_a), read_manifest(path_b)]
    check_same_samples(manifests, [path_a, path_b])
    chosen = [select_cached_layers(manifests[0], layers_a), select_cached_layers(manifests[1], layers_b)]
    started = time.perf_counter()
    device = resolve_device(device)
    batches = ((sides[0], sides[1]) for sides in stream_caches([path_a, path_b], chosen, batch_size, n, device))
    measured = measure(batches, metrics, mode, device, null=null, seed=seed,
                       names_a=[f"{n!r} ({path_a})" for n in chosen[0]],
                       names_b=[f"{n!r} ({path_b})" for n in chosen[1]], **options)
    frame = similarity_frame(measured.values, chosen[0], chosen[1])
    rows = []
    for side, manifest, names in zip("ab", manifests, chosen, strict=True):
        by_name = {layer["name"]: layer for layer in manifest["layers"]}
        rows += [{"model": side, **by_name[name]} for name in names]
    seconds = time.perf_counter() - started
    summary = compare_summary(manifests[0]["model"], manifests[1]["model"], manifests[0]["data"], measured, mode,
                              metrics, chosen[0], chosen[1], batch_size, seconds)
    layers = pd.DataFrame(rows)
    meta = run_meta(caches=[str(path_a), str(path_b)], method=measured.method, layers=layers_meta(layers),
                    settings={"null": null, "seed": seed, "reduce": manifests[0]["reduce"], "device": str(device)},
                    timings={"total": round(seconds, 3)})
    return CompareResult(summary=summary, tables={"similarity": frame, "layers": layers}, meta=meta)
