"""Where the engine's activations come from: model taps (forward passes with recording hooks) and
activation caches (``manifest.json`` + safetensors shards written by ``simkit.engine.capture``).

A cache directory holds ``shard-00000.safetensors`` ... (one ``(rows, dim)`` tensor per layer) and
``manifest.json`` (model, data, layers with shapes and reductions, n, shards). The manifest is written
last, so an interrupted capture never looks like a cache. Readers stream shard by shard, so caches
larger than memory work.
"""

from __future__ import annotations

import fnmatch
import json
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open
from torch import nn

from simkit import distributed
from simkit.engine.batches import Batch, count_rows, global_batches, rebatch, steps
from simkit.engine.samples import SampleRows, batch_mask
from simkit.errors import SimkitError, unknown_name_error
from simkit.forward import eval_mode, float_dtype, forward_error, run_model
from simkit.layers import record_layers
from simkit.metrics.settings import CompareSettings
from simkit.progress import progress_bar

FORMAT = "simkit-activations/1"
MANIFEST = "manifest.json"


# ------------------------------------------------------------------------------------------ model taps


def _inputs_for(batch: Batch, device: torch.device, dtype: torch.dtype | None) -> Batch:
    """``batch`` on ``device``, floating-point inputs cast to the model's dtype."""
    def move(t: torch.Tensor) -> torch.Tensor:
        if dtype is not None and t.is_floating_point():
            return t.to(device=device, dtype=dtype, non_blocking=True)
        return t.to(device=device, non_blocking=True)

    if isinstance(batch, dict):
        return {key: move(value) for key, value in batch.items()}
    return move(batch)


#: the half-precision dtypes a model may run in (``simkit.models.load_model(..., dtype=...)``)
HALF = (torch.float16, torch.bfloat16)


def upcast_half(acts: torch.Tensor, layer: str, label: str, dtype: torch.dtype) -> torch.Tensor:
    """A half-precision layer's activations in float32 (the sums stay float64); an overflow (inf or NaN) is
    a SimkitError naming the layer and a wider dtype."""
    if not bool(torch.isfinite(acts).all()):
        wider = "bfloat16 or float32" if dtype == torch.float16 else "float32"
        raise SimkitError(f"layer {layer!r} of model {label} overflows in {str(dtype).replace('torch.', '')} (inf or "
                          f"NaN in its activations); load the model with `dtype` {wider}")
    return acts.float()


class Tap:
    """One model's chosen layers recorded batch by batch (``simkit.layers.record_layers``), the model in
    eval mode; hooks and every module's train/eval flag are restored on ``close``. ``raw``: each layer's
    output kept in its own shape ``(b, ...)`` (tokens or positions as samples), not reduced."""

    def __init__(self, model: nn.Module, layers: list[str], label: str, *, reduce: str, output_index: Any,
                 device: torch.device, raw: bool = False):
        self.model, self.layers, self.label, self.device, self.raw = model, layers, label, device, raw
        reduce = "flatten" if raw else reduce   # a view of the output, reshaped back in step
        self.dtype = float_dtype(model)
        self._stack = ExitStack()
        try:
            self._stack.enter_context(eval_mode(model))
            self.recorder = self._stack.enter_context(record_layers(model, layers, reduce=reduce,
                                                                    output_index=output_index, eval_mode=False))
        except BaseException:
            self._stack.close()
            raise
        self.forward_seconds = 0.0

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Tap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def step(self, batch: Batch) -> list[torch.Tensor]:
        """One (b, d) tensor per chosen layer, in selection order."""
        start = time.perf_counter()
        with torch.no_grad():
            try:
                run_model(self.model, _inputs_for(batch, self.device, self.dtype))
            except (RuntimeError, TypeError, ValueError) as exc:
                with suppress(SimkitError):  # drop what the partial forward recorded
                    self.recorder.pop()
                if isinstance(exc, SimkitError):  # raised by a hook (e.g. a reduction): already clear
                    raise
                raise forward_error(exc, batch, f"model {self.label}") from exc
        self.forward_seconds += time.perf_counter() - start
        acts = self.recorder.pop()  # finiteness is checked by the accumulator, without another pass
        if self.raw:
            acts = {name: t.reshape(self.recorder.shapes[name]) for name, t in acts.items()}
        if self.dtype in HALF:
            return [upcast_half(acts[name], name, self.label, self.dtype) for name in self.layers]
        return [acts[name] for name in self.layers]

    def layer_rows(self, side: str, dims: list[int], layers: list[str] | None = None) -> list[dict[str, Any]]:
        """Rows of the ``layers`` table: model side, name, module type, raw output shape, reduction, width.

        ``layers`` (default: every layer of this tap) and ``dims`` are parallel lists.
        """
        rows = []
        for name, dim in zip(self.layers if layers is None else layers, dims, strict=True):
            shape = self.recorder.shapes.get(name)
            rows.append({"model": side, "name": name, "type": type(self.model.get_submodule(name)).__name__,
                         "shape": "x".join(str(s) for s in shape[1:]) if shape is not None else "",
                         "reduction": self.recorder.reductions.get(name, ""), "dim": dim})
        return rows


class TapPair:
    """Both models of a comparison tapped together: their chosen layers batch by batch, as the engine's
    ``(global index, acts_a, acts_b)`` stream. One model against itself (``shared``) uses one set of
    hooks and one forward pass per batch for both sides."""

    def __init__(self, model_a: nn.Module, model_b: nn.Module, layers_a: list[str], layers_b: list[str],
                 names: tuple[str, str], *, reduce: str, output_index: Any, device: torch.device, shared: bool,
                 layout: SampleRows | None = None):
        self.layers_a, self.layers_b, self.shared, self.layout = layers_a, layers_b, shared, layout
        raw = layout is not None
        self.union = layers_a + [name for name in layers_b if name not in layers_a] if shared else layers_a
        self._stack = ExitStack()
        try:
            self.a = self._stack.enter_context(Tap(model_a, self.union, names[0], reduce=reduce,
                                                   output_index=output_index, device=device, raw=raw))
            self.b = self.a if shared else self._stack.enter_context(
                Tap(model_b, layers_b, names[1], reduce=reduce, output_index=output_index, device=device, raw=raw))
        except BaseException:
            self._stack.close()
            raise

    def __enter__(self) -> TapPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def step(self, batch: Batch, batch_b: Batch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Both sides' activations of one batch (``batch_b``: B's form of the same samples)."""
        if self.shared:
            acts = dict(zip(self.union, self.a.step(batch), strict=True))
            return [acts[name] for name in self.layers_a], [acts[name] for name in self.layers_b]
        return self.a.step(batch), self.b.step(batch_b)

    def activations(self, data: Any, data_b: Any, settings: CompareSettings, progress: bool) -> Iterator[
            tuple[int, list[torch.Tensor], list[torch.Tensor]]]:
        """This rank's ``(global index, acts_a, acts_b)`` batches of ``data`` (and ``data_b`` for B), with a
        progress bar; ``settings``: the validated CompareSettings (batch size, n, mode)."""
        bar = progress_bar(progress)
        task = bar.add_task(f"compare ({settings.mode})", total=steps(count_rows(data), settings.n,
                                                                         settings.batch_size))
        where = {"rank": distributed.rank(), "world_size": distributed.world_size()}
        with bar:
            stream = global_batches(data, settings.batch_size, settings.n, **where)
            stream_b = None if data_b is None else global_batches(data_b, settings.batch_size, settings.n, **where)
            for index, batch in stream:
                batch_b = batch if stream_b is None else next(stream_b)[1]
                acts_a, acts_b = self.step(batch, batch_b)
                if self.layout is not None:   # tokens or positions as the samples
                    acts_a, acts_b = self.layout.rows(index, acts_a, acts_b, (batch_mask(batch), batch_mask(batch_b)),
                                                      (self.layers_a, self.layers_b))
                yield index, acts_a, acts_b
                bar.advance(task, distributed.world_size())

    def layer_rows(self, measured: Any) -> list[dict[str, Any]]:
        """The ``layers`` table's rows of both sides (``measured``: the engine's Measured, for the widths)."""
        rows = (self.a.layer_rows("a", measured.dims_a, self.layers_a)
                + self.b.layer_rows("b", measured.dims_b, self.layers_b))
        return rows if self.layout is None else [{**row, "reduction": self.layout.label()} for row in rows]

    def forward_seconds(self) -> float:
        """Seconds spent in the models' forward passes."""
        return self.a.forward_seconds + (0.0 if self.shared else self.b.forward_seconds)


# ---------------------------------------------------------------------------------------- cache readers


def is_cache(path: str | Path) -> bool:
    """True when ``path`` is a directory written by ``simkit.engine.capture``."""
    return (Path(path) / MANIFEST).is_file()


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The parsed ``manifest.json`` of the cache directory ``path`` (model, data, n, layers with dims)."""
    path = Path(path)
    if not is_cache(path):
        raise SimkitError(f"{path} is not an activation cache (no {MANIFEST}); write one with `simkit capture`")
    try:
        manifest: dict[str, Any] = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        detail = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        raise SimkitError(f"{path / MANIFEST} is not valid JSON ({detail}); the cache is damaged: write it "
                          "again with `simkit capture`") from None
    if not isinstance(manifest, dict):
        raise SimkitError(f"{path / MANIFEST} is not a cache manifest (a JSON object); write the cache again "
                          "with `simkit capture`")
    if manifest.get("format") != FORMAT:
        raise SimkitError(f"{path} has cache format {manifest.get('format')!r}; this simkit reads {FORMAT}")
    try:
        layers = [str(layer["name"]) for layer in manifest["layers"]]
        shards = [(str(shard["file"]), int(shard["rows"])) for shard in manifest["shards"]]
        int(manifest["n"])
        manifest["model"], manifest["data"]
    except (KeyError, TypeError, ValueError):
        raise SimkitError(f"{path / MANIFEST} lacks the layers, shards or sample count of a cache; write the "
                          "cache again with `simkit capture`") from None
    missing = [file for file, _ in shards if not (path / file).is_file()]
    if missing:
        raise SimkitError(f"cache {path} is incomplete: shard {missing[0]} is missing ({len(missing)} of "
                          f"{len(shards)}); write the cache again with `simkit capture`")
    if len(set(layers)) != len(layers):
        raise SimkitError(f"{path / MANIFEST} names a layer twice; write the cache again with `simkit capture`")
    return manifest


def select_cached_layers(manifest: dict[str, Any], selector: str | Sequence[str]) -> list[str]:
    """Cached layer names chosen by names and globs (``blocks`` = every cached layer), in cache order."""
    return select_names([layer["name"] for layer in manifest["layers"]], selector, "cached layer",
                        f"the cache of {manifest['model']}")


def select_names(names: Sequence[str], selector: str | Sequence[str], kind: str, owner: str) -> list[str]:
    """Names out of ``names`` chosen by names and globs (``blocks`` or ``all`` = every name), in the order of
    ``names``; a part that matches nothing is a SimkitError naming the ``kind`` and what ``owner`` holds."""
    parts = selector.split(",") if isinstance(selector, str) else list(selector)
    chosen: list[str] = []
    for part in (p.strip() for p in parts):
        if part in ("blocks", "all"):
            hits = list(names)
        elif any(ch in part for ch in "*?["):
            hits = [name for name in names if fnmatch.fnmatchcase(name, part)]
        else:
            hits = [part] if part in names else []
        if not hits:
            raise unknown_name_error(kind, part, names, f"{owner} holds: {', '.join(names[:8])}")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def iter_cache(path: str | Path, layers: list[str]) -> Iterator[dict[str, torch.Tensor]]:
    """Yield each shard's chosen layers, one shard in memory at a time."""
    manifest = read_manifest(path)
    for shard in manifest["shards"]:
        file = Path(path) / shard["file"]
        try:
            with safe_open(str(file), framework="pt") as handle:
                tensors = {name: handle.get_tensor(name) for name in layers}
        except Exception as exc:  # SafetensorError, OSError: a truncated, foreign or unreadable shard
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise SimkitError(f"cache {path}: cannot read shard {shard['file']} ({first}); the cache is "
                              "damaged: write it again with `simkit capture`") from None
        if any(t.shape[0] != shard["rows"] for t in tensors.values()):
            raise SimkitError(f"cache {path}: shard {shard['file']} does not hold the {shard['rows']} rows its "
                              "manifest says; write the cache again with `simkit capture`")
        yield tensors


def stream_caches(paths: Sequence[str | Path], layers: Sequence[list[str]], batch_size: int, n: int | None,
                  device: torch.device | str = "cpu") -> Iterator[tuple[int, list[list[torch.Tensor]]]]:
    """Lockstep global batches over several caches, this rank's share: ``(global index, per cache one
    (b, d) float32 tensor per layer)``, on ``device`` (already checked by the caller)."""
    rank, world = distributed.rank(), distributed.world_size()
    streams = [rebatch(iter_cache(p, names), batch_size, n, rank, world)
               for p, names in zip(paths, layers, strict=True)]
    for batches in zip(*streams, strict=True):
        index = batches[0][0]
        tensors: list[list[torch.Tensor]] = []
        for (_, batch), names in zip(batches, layers, strict=True):
            shard = cast(dict[str, torch.Tensor], batch)  # a cache's batches are dicts of layer tensors
            tensors.append([shard[name].to(device=device, dtype=torch.float32) for name in names])
        yield index, tensors


def check_same_samples(manifests: Sequence[dict[str, Any]], paths: Sequence[str | Path]) -> None:
    """Caches compared together must hold the same samples in the same order: the same data spec and n,
    and the same ``samples_sha256`` (content and order, ``simkit.engine.caches.SampleDigest``); a cache
    written before digests were recorded is compared with a warning that its samples cannot be checked."""
    first = manifests[0]
    for manifest, path in zip(manifests[1:], paths[1:], strict=True):
        for key in ("data", "n"):
            if manifest[key] != first[key]:
                raise SimkitError(f"caches hold different data: {paths[0]} has {key}={first[key]!r} but "
                                  f"{path} has {key}={manifest[key]!r}; capture both with the same `data` and `n`")
        digests = [first.get("samples_sha256"), manifest.get("samples_sha256")]
        if None in digests:
            warnings.warn(f"{paths[0] if digests[0] is None else path} records no digest of its samples "
                          "(written by an older simkit): that both caches hold the same samples is not checked; "
                          "capture it again to have it checked", RuntimeWarning, stacklevel=3)
        elif digests[0] != digests[1] or first.get("samples_digest_of") != manifest.get("samples_digest_of"):
            raise SimkitError(f"caches hold different samples although both read {first['data']!r} (n = "
                              f"{first['n']}): the sample digests of {paths[0]} ({str(digests[0])[:12]}…) and {path} "
                              f"({str(digests[1])[:12]}…) differ, so the data changed between the captures or came "
                              f"in another order{_data_seeds(first, manifest)}; capture both again from the same data "
                              "with the same `data_seed` (the data's seed, apart from the model's `seed`)")


def _data_seeds(first: dict[str, Any], other: dict[str, Any]) -> str:
    """`` (data seeds 0 and 1)`` when both manifests record different data seeds, else nothing."""
    seeds = first.get("data_seed"), other.get("data_seed")
    return f" (data seeds {seeds[0]} and {seeds[1]})" if None not in seeds and seeds[0] != seeds[1] else ""
