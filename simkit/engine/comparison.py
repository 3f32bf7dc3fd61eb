"""Compare two models (``compare``) or two activation caches (``compare_caches``) layer by layer.

Both models see the same batches in one pass; each layer's statistics are computed once per batch and
all pairs come from one matrix product (see ``simkit.metrics.streaming``). Under torchrun each rank
takes every world_size-th global batch and the accumulators are reduced over ranks
(``simkit.engine.measure``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from simkit import distributed
from simkit.engine.arrays import IMPORTED, compare_arrays
from simkit.engine.assemble import Run, compare_result, selector
from simkit.engine.batches import count_rows, data_label, steps
from simkit.engine.measure import measure
from simkit.engine.samples import SampleRows, mask_of, refuse_samples
from simkit.engine.sources import (
    TapPair,
    check_same_samples,
    read_manifest,
    select_cached_layers,
    stream_caches,
)
from simkit.errors import SimkitError
from simkit.forward import resolve_device
from simkit.layers import resolve_layers
from simkit.metrics.settings import CompareSettings, resolve_settings
from simkit.progress import progress_bar
from simkit.provenance import weights_of
from simkit.results import CompareResult


def check_module(value: Any, argument: str) -> nn.Module:
    """``value`` as an nn.Module; a spec string is a SimkitError saying how to load it."""
    if isinstance(value, str):
        raise SimkitError(f"`{argument}` is a spec string ({value!r}); load it first with "
                          "simkit.models.load_model(spec)")
    if not isinstance(value, nn.Module):
        raise SimkitError(f"`{argument}` must be an nn.Module, got {type(value).__name__}")
    return value


def _spec_of(model: nn.Module, default: str) -> str:
    """The spec ``simkit.models.load_model`` loaded ``model`` from (``model.simkit_spec``), else ``default``."""
    spec = getattr(model, "simkit_spec", None)
    return spec if isinstance(spec, str) else default


def check_data(data: Any) -> Any:
    """``data`` unless it is a spec string (a SimkitError saying how to load it)."""
    if isinstance(data, str):
        raise SimkitError(f"`data` is a spec string ({data!r}); load it first with simkit.data.load_data(spec)")
    return data


def _seeds_of(model_a: nn.Module, model_b: nn.Module, data: Any = None) -> dict[str, int]:
    """The seeds ``simkit.models.load_model`` initialised the models with (``model.simkit_seed``) and the
    seed ``simkit.data.load_data`` made the data with (``info["data_seed"]``: ``data``), where known."""
    info = getattr(data, "info", None)
    seeds = {side: getattr(model, "simkit_seed", None) for side, model in (("model_a", model_a), ("model_b", model_b))}
    seeds["data"] = info.get("data_seed") if isinstance(info, dict) else None
    return {side: seed for side, seed in seeds.items() if isinstance(seed, int)}


def _expected_rows(total: int | None, cap: int | None) -> int | None:
    """The samples a comparison will see: the data's rows capped by ``n`` (None when unknown)."""
    if total is None:
        return None
    return total if cap is None else min(total, cap)


def _check_data_b(data: Any, data_b: Any) -> Any:
    """``data_b`` (None, or the same samples as ``data`` in B's form)."""
    if data_b is None:
        return None
    data_b = check_data(data_b)
    if count_rows(data) is None or count_rows(data_b) != count_rows(data):
        raise SimkitError(f"`data_b` must hold the same samples as `data` ({count_rows(data)} rows), "
                          f"got {count_rows(data_b)} rows")
    return data_b


def compare(model_a: nn.Module, model_b: nn.Module, data: Any, settings: CompareSettings | None = None, *,
            layers_a: str | Sequence[str] = "blocks", layers_b: str | Sequence[str] = "blocks",
            reduce: str = "auto", device: str | torch.device = "cpu", output_index: Any = None,
            progress: bool = True, names: tuple[str, str] | None = None, data_name: str | None = None,
            data_b: Any = None, **changes: Any) -> CompareResult:
    """Compare every chosen layer of ``model_a`` with every chosen layer of ``model_b``.

    model_a, model_b: nn.Modules (load spec strings with ``simkit.models.load_model``).
    data: Tensor (N, ...), dict of tensors, ``simkit.data.Dataset``, a map-style dataset or an iterable
    of batches (load spec strings with ``simkit.data.load_data``).
    settings: :class:`~simkit.metrics.settings.CompareSettings` (metrics, mode, batch size, n, null, seed,
    memory budget and the measures' own settings); keyword ``changes`` replace its fields
    (``compare(a, b, x, metrics=["cca"])``). Validated once, before any work.
    layers_*: names, globs, ``type:Class`` and presets (``blocks``), as a list or a comma string.
    Runtime only (recorded, no effect on the numbers): ``names`` of the models (default: the specs
    ``simkit.models.load_model`` loaded them from, else model_a/model_b), ``data_name`` (default: a
    Dataset's spec). The seeds the models were made with come from ``load_model`` (``meta.seeds``).
    data_b: B's own inputs for the same samples in the same order, when B reads them differently (text
    tokenised by each model's own tokenizer); default: B sees ``data``.
    The models are moved to ``device`` (and stay there); their train/eval flags are restored and no
    hook is left behind. Passing the same module twice runs one forward pass per batch.
    Returns a CompareResult: ``.matrix(metric)`` is (L_a, L_b); ``.to_frame()`` the long table.
    """
    given = settings or CompareSettings()
    model_a, model_b = check_module(model_a, "model_a"), check_module(model_b, "model_b")
    data = check_data(data)
    data_b = _check_data_b(data, data_b)
    chosen = resolve_settings(settings, changes)
    target = resolve_device(device)
    names = names or (_spec_of(model_a, "model_a"), _spec_of(model_b, "model_b"))
    chosen_a, chosen_b = resolve_layers(model_a, layers_a), resolve_layers(model_b, layers_b)
    model_a.to(target)
    model_b.to(target)
    started = time.perf_counter()
    layout = _sample_rows(chosen, data)
    taps = TapPair(model_a, model_b, chosen_a, chosen_b, names, reduce=reduce, output_index=output_index,
                   device=target, shared=model_a is model_b and data_b is None, layout=layout)
    with taps:
        stream = taps.activations(data, data_b, chosen, progress)
        measured = measure(stream, chosen, target, names_a=[f"{name!r} ({names[0]})" for name in chosen_a],
                           names_b=[f"{name!r} ({names[1]})" for name in chosen_b], progress=progress,
                           expected_rows=_expected_rows(count_rows(data), chosen.n), layout=layout)
    seconds = time.perf_counter() - started
    dtypes = _dtypes_of(model_a, model_b)
    run = Run(given.updated(**changes), chosen, str(target),
              {"layers_a": selector(layers_a), "layers_b": selector(layers_b), "reduce": reduce,
               "output_index": output_index, **({"dtype": dtypes} if dtypes else {})},
              _seeds_of(model_a, model_b, data))
    result = compare_result(run, measured, model_a=names[0], model_b=names[1], data=data_label(data, data_name),
                            layers_a=chosen_a, layers_b=chosen_b, layer_rows=taps.layer_rows(measured),
                            seconds=seconds, timings={"forward": taps.forward_seconds()},
                            weights=(weights_of(model_a), weights_of(model_b)),
                            specs={"model_a": _spec_of(model_a, names[0]), "model_b": _spec_of(model_b, names[1])})
    if dtypes:
        result.summary["dtype"] = dtypes
    if layout is not None:
        result.summary["sample_unit"] = layout.record()
    return result


def _sample_rows(settings: CompareSettings, data: Any) -> SampleRows | None:
    """Tokens or positions as samples (``settings.samples``; None for sequences): the sequences compared,
    each one's tokens counted by the data's attention mask when it has one."""
    if settings.samples == "sequences":
        return None
    sequences = _expected_rows(count_rows(data), settings.n)
    if sequences is None:
        raise SimkitError(f"`samples` {settings.samples} needs data of a known length (a tensor, a dict of tensors or "
                          "a Dataset); give the data as one of those")
    mask = mask_of(data) if settings.samples == "tokens" else None
    counts = None if mask is None else mask[:sequences].bool().sum(1).numpy()
    return SampleRows(settings.samples, sequences, settings.batch_size, counts)


def _dtypes_of(model_a: nn.Module, model_b: nn.Module) -> str | None:
    """The dtype the models were loaded in (``simkit.models.load_model(..., dtype=...)``): one name when
    both agree, else ``"X (A), Y (B)"``; None when neither was given one."""
    given = [getattr(model, "simkit_dtype", None) for model in (model_a, model_b)]
    if given == [None, None]:
        return None
    named = [str(d) if d else "as loaded" for d in given]
    return named[0] if named[0] == named[1] else f"{named[0]} (A), {named[1]} (B)"


def compare_caches(path_a: str | Path, path_b: str | Path, settings: CompareSettings | None = None, *,
                   layers_a: str | Sequence[str] = "blocks", layers_b: str | Sequence[str] = "blocks",
                   device: str | torch.device = "cpu", progress: bool = True, names: tuple[str, str] | None = None,
                   **changes: Any) -> CompareResult:
    """Compare two activation caches (written by ``simkit.engine.capture``) as ``compare`` compares two
    models; the metrics run on ``device``. ``settings`` and keyword ``changes`` as in ``compare``. The
    data and seeds recorded come from the manifests, and so do the names unless ``names`` gives them
    (the manifests' model specs stay in ``meta.specs``)."""
    given = settings or CompareSettings()
    chosen_settings = resolve_settings(settings, changes)
    target = resolve_device(device)
    paths = [path_a, path_b]
    manifests = [read_manifest(path_a), read_manifest(path_b)]
    refuse_samples(chosen_settings.samples, "a pair of caches")
    if any(manifest.get("source") == IMPORTED for manifest in manifests):  # aligned by IDs or position
        return compare_arrays(path_a, path_b, settings, layers_a=layers_a, layers_b=layers_b, device=device,
                              progress=progress, names=names, **changes)
    check_same_samples(manifests, paths)
    chosen = [select_cached_layers(manifests[0], layers_a), select_cached_layers(manifests[1], layers_b)]
    started = time.perf_counter()
    stream = cache_activations(paths, chosen, chosen_settings, target, int(manifests[0]["n"]), progress,
                               "compare caches")
    measured = measure(((index, sides[0], sides[1]) for index, sides in stream), chosen_settings, target,
                       names_a=[f"{name!r} ({path_a})" for name in chosen[0]],
                       names_b=[f"{name!r} ({path_b})" for name in chosen[1]], progress=progress,
                       expected_rows=_expected_rows(int(manifests[0]["n"]), chosen_settings.n))
    run = Run(given.updated(**changes), chosen_settings, str(target),
              {"layers_a": selector(layers_a), "layers_b": selector(layers_b), "reduce": manifests[0]["reduce"]},
              {"model_a": manifests[0].get("seed"), "model_b": manifests[1].get("seed")})
    names = names or (manifests[0]["model"], manifests[1]["model"])
    return compare_result(
        run, measured, model_a=names[0], model_b=names[1], data=manifests[0]["data"],
        specs={"model_a": manifests[0]["model"], "model_b": manifests[1]["model"]},
        layers_a=chosen[0], layers_b=chosen[1], layer_rows=cached_layer_rows(manifests, chosen),
        seconds=time.perf_counter() - started, caches=[str(path_a), str(path_b)],
        weights=(manifests[0].get("weights", "unknown (an older cache)"),
                 manifests[1].get("weights", "unknown (an older cache)")))


def cache_activations(paths: Sequence[str | Path], chosen: Sequence[list[str]], settings: CompareSettings,
                      device: torch.device, rows: int, progress: bool, label: str) -> Iterator[tuple[int, list]]:
    """``(global index, one list of layer tensors per cache)`` for this rank's batches, with a progress bar."""
    bar = progress_bar(progress)
    task = bar.add_task(f"{label} ({settings.mode})", total=steps(rows, settings.n, settings.batch_size))
    with bar:
        for index, sides in stream_caches(paths, chosen, settings.batch_size, settings.n, device):
            yield index, sides
            bar.advance(task, distributed.world_size())


def cached_layer_rows(manifests: Sequence[dict[str, Any]], chosen: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """One row per chosen cached layer and side (model, name, type, shape, reduction, dim)."""
    rows = []
    for side, manifest, layer_names in zip("ab", manifests, chosen, strict=True):
        by_name = {layer["name"]: layer for layer in manifest["layers"]}
        rows += [{"model": side, **by_name[name]} for name in layer_names]
    return rows
