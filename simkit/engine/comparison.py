"""Compare two models (``compare``) or two activation caches (``compare_caches``) layer by layer.

Both models see the same batches in one pass; each layer's statistics are computed once per batch and
all pairs come from one matrix product (see ``simkit.metrics.streaming``). Under torchrun each rank
takes every world_size-th global batch and the accumulators are reduced over ranks
(``simkit.engine.measure``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch import nn

from simkit import distributed
from simkit.engine.assemble import compare_result, selector
from simkit.engine.batches import count_rows, data_label, global_batches, steps
from simkit.engine.measure import Activations, measure
from simkit.engine.options import DEFAULT_MEMORY_BUDGET, DEFAULT_METRICS, engine_options
from simkit.engine.sources import Tap, check_same_samples, read_manifest, select_cached_layers, stream_caches
from simkit.errors import SimkitError
from simkit.layers import resolve_layers
from simkit.progress import progress_bar
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


def compare(model_a: nn.Module, model_b: nn.Module, data: Any, *,
            layers_a: str | Sequence[str] = "blocks", layers_b: str | Sequence[str] = "blocks",
            metrics: Sequence[str] = DEFAULT_METRICS, mode: str = "minibatch", batch_size: int = 64,
            n: int | None = None, reduce: str = "auto", null: int | None = None, seed: int = 0,
            device: str | torch.device = "cpu", output_index: Any = None, rbf_factor: float = 1.0,
            knn_k: int = 10, memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET, shape_alpha: float = 0.5,
            cca_eps: float = 0.0, svcca_keep: float = 0.99, ridge_lambda: float = 1e-2, ridge_folds: int = 5,
            rsa_distance: str = "correlation", rsa_compare: str = "spearman", progress: bool = True,
            names: tuple[str, str] | None = None, data_name: str | None = None,
            seeds: Mapping[str, int] | None = None, data_b: Any = None) -> CompareResult:
    """Compare every chosen layer of ``model_a`` with every chosen layer of ``model_b``.

    model_a, model_b: nn.Modules (load spec strings with ``simkit.models.load_model``).
    data: Tensor (N, ...), dict of tensors, ``simkit.data.Dataset`` or an iterable of batches (load spec
    strings with ``simkit.data.load_data``).
    layers_*: names, globs, ``type:Class`` and presets (``blocks``), as a list or a comma string.
    null: permutations of B's samples for the null band (None: ``simkit.engine.options.DEFAULT_NULL``
    when every metric is a minibatch CKA, else 0). seed: the permutation null's seed.
    shape_alpha ... rsa_compare: settings of the measures beyond CKA (``simkit.metrics.settings.MeasureSettings``).
    Runtime only (recorded, no effect on the numbers): ``names`` of the models (default: the specs
    ``simkit.models.load_model`` loaded them from, else model_a/model_b), ``data_name`` (default: a
    Dataset's spec), ``seeds`` the caller made the models and data with (``meta.seeds``).
    data_b: B's own inputs for the same samples in the same order, when B reads them differently (text
    tokenised by each model's own tokenizer); default: B sees ``data``.
    The models are moved to ``device`` (and stay there); their train/eval flags are restored and no
    hook is left behind. Passing the same module twice runs one forward pass per batch.
    Returns a CompareResult: ``.matrix(metric)`` is (L_a, L_b); ``.to_frame()`` the long table.
    """
    model_a, model_b = check_module(model_a, "model_a"), check_module(model_b, "model_b")
    data = check_data(data)
    if data_b is not None:
        data_b = check_data(data_b)
        if count_rows(data) is None or count_rows(data_b) != count_rows(data):
            raise SimkitError(f"`data_b` must hold the same samples as `data` ({count_rows(data)} rows), "
                              f"got {count_rows(data_b)} rows")
    if names is None:
        names = (_spec_of(model_a, "model_a"), _spec_of(model_b, "model_b"))
    options = engine_options(metrics=metrics, mode=mode, batch_size=batch_size, n=n, null=null, seed=seed,
                             rbf_factor=rbf_factor, knn_k=knn_k, memory_budget_bytes=memory_budget_bytes,
                             device=device, shape_alpha=shape_alpha, cca_eps=cca_eps,
                             svcca_keep=svcca_keep, ridge_lambda=ridge_lambda, ridge_folds=ridge_folds,
                             rsa_distance=rsa_distance, rsa_compare=rsa_compare)
    chosen_a = resolve_layers(model_a, layers_a)
    chosen_b = resolve_layers(model_b, layers_b)
    model_a.to(options.device)
    model_b.to(options.device)

    started = time.perf_counter()
    bar = progress_bar(progress)
    task = bar.add_task(f"compare ({options.mode})", total=steps(count_rows(data), n, batch_size))

    # one model against itself: one set of hooks and one forward pass per batch feed both sides
    same = model_a is model_b and data_b is None
    union = chosen_a + [name for name in chosen_b if name not in chosen_a] if same else chosen_a

    def activations() -> Iterator[Activations]:
        with bar:
            stream = global_batches(data, batch_size, n, rank=distributed.rank(),
                                    world_size=distributed.world_size())
            stream_b = None if data_b is None else global_batches(
                data_b, batch_size, n, rank=distributed.rank(), world_size=distributed.world_size())
            for index, batch in stream:
                if same:
                    acts = dict(zip(union, tap_a.step(batch), strict=True))
                    yield index, [acts[name] for name in chosen_a], [acts[name] for name in chosen_b]
                else:
                    batch_b = batch if stream_b is None else next(stream_b)[1]
                    yield index, tap_a.step(batch), tap_b.step(batch_b)
                bar.advance(task, distributed.world_size())

    with ExitStack() as stack:
        tap_a = stack.enter_context(Tap(model_a, union, names[0], reduce=reduce, output_index=output_index,
                                        device=options.device))
        tap_b = tap_a if same else stack.enter_context(
            Tap(model_b, chosen_b, names[1], reduce=reduce, output_index=output_index, device=options.device))
        measured = measure(activations(), options, names_a=[f"{name!r} ({names[0]})" for name in chosen_a],
                           names_b=[f"{name!r} ({names[1]})" for name in chosen_b], progress=progress)
    seconds = time.perf_counter() - started
    rows = tap_a.layer_rows("a", measured.dims_a, chosen_a) + tap_b.layer_rows("b", measured.dims_b, chosen_b)
    forward = tap_a.forward_seconds + (0.0 if same else tap_b.forward_seconds)
    return compare_result(
        options, measured, model_a=names[0], model_b=names[1], data=data_label(data, data_name),
        layers_a=chosen_a, layers_b=chosen_b, layer_rows=rows,
        settings={"layers_a": selector(layers_a), "layers_b": selector(layers_b), "reduce": reduce,
                  "output_index": output_index},
        seeds=dict(seeds or {}), seconds=seconds, timings={"forward": forward})


def compare_caches(path_a: str | Path, path_b: str | Path, *, layers_a: str | Sequence[str] = "blocks",
                   layers_b: str | Sequence[str] = "blocks", metrics: Sequence[str] = DEFAULT_METRICS,
                   mode: str = "minibatch", batch_size: int = 64, n: int | None = None, null: int | None = None,
                   seed: int = 0, rbf_factor: float = 1.0, knn_k: int = 10,
                   memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET, device: str | torch.device = "cpu",
                   shape_alpha: float = 0.5, cca_eps: float = 0.0, svcca_keep: float = 0.99,
                   ridge_lambda: float = 1e-2, ridge_folds: int = 5, rsa_distance: str = "correlation",
                   rsa_compare: str = "spearman", progress: bool = True) -> CompareResult:
    """Compare two activation caches (written by ``simkit.engine.capture``) as ``compare`` compares two
    models; the metrics run on ``device``. The names, data and seeds recorded come from the manifests."""
    options = engine_options(metrics=metrics, mode=mode, batch_size=batch_size, n=n, null=null, seed=seed,
                             rbf_factor=rbf_factor, knn_k=knn_k, memory_budget_bytes=memory_budget_bytes,
                             device=device, shape_alpha=shape_alpha, cca_eps=cca_eps,
                             svcca_keep=svcca_keep, ridge_lambda=ridge_lambda, ridge_folds=ridge_folds,
                             rsa_distance=rsa_distance, rsa_compare=rsa_compare)
    paths = [path_a, path_b]
    manifests = [read_manifest(path_a), read_manifest(path_b)]
    check_same_samples(manifests, paths)
    chosen = [select_cached_layers(manifests[0], layers_a), select_cached_layers(manifests[1], layers_b)]
    started = time.perf_counter()
    bar = progress_bar(progress)
    task = bar.add_task(f"compare caches ({options.mode})", total=steps(int(manifests[0]["n"]), n, batch_size))

    def activations() -> Iterator[Activations]:
        with bar:
            for index, sides in stream_caches(paths, chosen, batch_size, n, options.device):
                yield index, sides[0], sides[1]
                bar.advance(task, distributed.world_size())

    measured = measure(activations(), options, names_a=[f"{name!r} ({path_a})" for name in chosen[0]],
                       names_b=[f"{name!r} ({path_b})" for name in chosen[1]], progress=progress)
    rows = []
    for side, manifest, layer_names in zip("ab", manifests, chosen, strict=True):
        by_name = {layer["name"]: layer for layer in manifest["layers"]}
        rows += [{"model": side, **by_name[name]} for name in layer_names]
    seconds = time.perf_counter() - started
    return compare_result(
        options, measured, model_a=manifests[0]["model"], model_b=manifests[1]["model"],
        data=manifests[0]["data"], layers_a=chosen[0], layers_b=chosen[1], layer_rows=rows,
        settings={"layers_a": selector(layers_a), "layers_b": selector(layers_b),
                  "reduce": manifests[0]["reduce"]},
        seeds={"model_a": manifests[0].get("seed"), "model_b": manifests[1].get("seed")},
        seconds=seconds, caches=[str(path_a), str(path_b)])
