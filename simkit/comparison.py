"""The comparison engine: stream batches through two models once, feed every layer pair's accumulators.

``compare(model_a, model_b, data)`` returns a :class:`CompareResult` holding a layer × layer matrix per
metric. Both models see the same batches in one pass; each layer's statistics are computed once per
batch and all pairs come from one matrix product (see ``simkit.metrics.streaming``). Under torchrun
each rank takes every world_size-th batch and the accumulators' sums are all-reduced.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from simkit import distributed
from simkit.batches import Batch, check_batch_size, count_rows, iter_batches
from simkit.errors import SimkitError
from simkit.forward import forward_error, resolve_device, run_model
from simkit.metrics.streaming import METRICS, MODES
from simkit.progress import progress_bar
from simkit.results import CompareResult
from simkit.runinfo import run_meta

DEFAULT_METRICS = ("linear_cka", "unbiased_cka")


def check_metrics(metrics: Sequence[str]) -> list[str]:
    """Validated, de-duplicated metric names in the given order."""
    out: list[str] = []
    for name in metrics:
        if name not in METRICS:
            from simkit.errors import unknown_name_error

            raise unknown_name_error("metric", name, METRICS, "valid: " + ", ".join(METRICS))
        if name not in out:
            out.append(name)
    if not out:
        raise SimkitError("no metric chosen; pass at least one of " + ", ".join(METRICS))
    return out


def _to_device(batch: Batch, device: torch.device, dtype: torch.dtype | None) -> Batch:
    def move(t: torch.Tensor) -> torch.Tensor:
        if dtype is not None and t.is_floating_point():
            return t.to(device=device, dtype=dtype, non_blocking=True)
        return t.to(device=device, non_blocking=True)

    if isinstance(batch, dict):
        return {key: move(value) for key, value in batch.items()}
    return move(batch)


def _float_dtype(model: nn.Module) -> torch.dtype | None:
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return None


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    modes = {name: module.training for name, module in model.named_modules()}
    model.eval()
    try:
        yield
    finally:
        for name, module in model.named_modules():
            module.training = modes.get(name, module.training)


class Tap:
    """One model's chosen layers captured batch by batch (hooks live until ``close``)."""

    def __init__(self, model: nn.Module, layers: list[str], label: str, *, reduce: str, output_index: Any,
                 device: torch.device):
        from simkit.layers import record_layers

        self.model, self.layers, self.label, self.device = model, layers, label, device
        self.dtype = _float_dtype(model)
        self._stack = ExitStack()
        self._stack.enter_context(_eval_mode(model))
        self.capture = self._stack.enter_context(record_layers(model, layers, reduce=reduce,
                                                         output_index=output_index))
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
                run_model(self.model, _to_device(batch, self.device, self.dtype))
            except (RuntimeError, TypeError, ValueError) as exc:
                with suppress(SimkitError):  # drop what the partial forward captured
                    self.capture.pop()
                if isinstance(exc, SimkitError):  # raised by a hook (e.g. a reduction): already clear
                    raise
                raise forward_error(exc, batch, f"model {self.label}") from exc
        self.forward_seconds += time.perf_counter() - start
        acts = self.capture.pop()  # finiteness is checked by the accumulator, without another pass
        return [acts[name] for name in self.layers]

    def layer_rows(self, side: str, dims: list[int], layers: list[str] | None = None) -> list[dict[str, Any]]:
        """Rows of the ``layers`` table: name, module type, raw output shape, reduction, width.

        ``layers`` (default: every layer of this tap) and ``dims`` are parallel lists.
        """
        rows = []
        for name, dim in zip(self.layers if layers is None else layers, dims, strict=True):
            shape = self.capture.shapes.get(name)
            rows.append({"model": side, "name": name, "type": type(self.model.get_submodule(name)).__name__,
                         "shape": "x".join(str(s) for s in shape[1:]) if shape is not None else "",
                         "reduction": self.capture.reductions.get(name, ""), "dim": dim})
        return rows


@dataclass
class Measured:
    """What streaming produced: per metric the matrices, plus the sample count and layer widths."""

    values: dict[str, dict[str, np.ndarray]]
    rows: int
    dims_a: list[int]
    dims_b: list[int]
    method: dict[str, Any]
    compute_seconds: float


def measure(activations: Iterable[tuple[list[torch.Tensor], list[torch.Tensor]]], metrics: list[str],
            mode: str, device: torch.device | str = "cpu", **accumulator_options: Any) -> Measured:
    """Feed every (acts_a, acts_b) batch to one all-pairs accumulator, reduce over ranks, compute.

    acts_a: one (b, p_i) tensor per layer of side A; acts_b likewise. The accumulator is created from
    the first batch's widths; options go to ``simkit.metrics.streaming.make_accumulator``.
    """
    from simkit.metrics.streaming import make_accumulator

    accumulator = None
    dims_a: list[int] = []
    dims_b: list[int] = []
    rows = 0
    for acts_a, acts_b in activations:
        if accumulator is None:
            dims_a = [int(a.shape[1]) for a in acts_a]
            dims_b = [int(b.shape[1]) for b in acts_b]
            accumulator = make_accumulator(metrics, mode, dims_a, dims_b, **accumulator_options)
        accumulator.update(acts_a, acts_b)
        rows += int(acts_a[0].shape[0])
    if distributed.is_distributed():
        if accumulator is None:  # a rank that got no batch still joins the reductions, with empty sums
            dims_a, dims_b = next((d for d in distributed.all_gather_objects(None) if d), ([], []))
            if dims_a:
                accumulator = make_accumulator(metrics, mode, dims_a, dims_b, **accumulator_options)
        else:
            distributed.all_gather_objects((dims_a, dims_b))
        if accumulator is not None:
            accumulator.reduce_over_ranks(device)
        total = torch.tensor([rows], dtype=torch.float64)
        rows = int(distributed.all_reduce_sum(total).item())
    if accumulator is None:
        raise SimkitError("the data yielded no samples; check --data and --n")
    if "unbiased_cka" in metrics and rows < 4:
        raise SimkitError(f"unbiased CKA needs at least 4 samples, got {rows}; raise --n")
    start = time.perf_counter()
    values = accumulator.compute()
    return Measured(values, rows, dims_a, dims_b, accumulator.describe(), time.perf_counter() - start)


def similarity_frame(values: dict[str, dict[str, np.ndarray]], layers_a: list[str],
                     layers_b: list[str]) -> pd.DataFrame:
    """Long table ``layer_a, layer_b, metric, value[, null_mean, null_p95]`` from computed matrices."""
    parts = []
    grid_a, grid_b = np.meshgrid(np.arange(len(layers_a)), np.arange(len(layers_b)), indexing="ij")
    for metric, arrays in values.items():
        part = pd.DataFrame({
            "layer_a": np.asarray(layers_a, dtype=object)[grid_a.ravel()],
            "layer_b": np.asarray(layers_b, dtype=object)[grid_b.ravel()],
            "metric": metric,
            "value": np.asarray(arrays["value"], dtype=np.float64).ravel(),
        })
        for column in ("null_mean", "null_p95"):
            if column in arrays:
                part[column] = np.asarray(arrays[column], dtype=np.float64).ravel()
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def compare_summary(model_a: str, model_b: str, data: str, measured: Measured, mode: str, metrics: list[str],
                    layers_a: list[str], layers_b: list[str], batch_size: int, seconds: float) -> dict[str, Any]:
    """The ``summary`` of a compare result (the contract keys), shared by models and caches."""
    return {"model_a": model_a, "model_b": model_b, "data": data, "n": measured.rows, "mode": mode,
            "metrics": metrics, "n_layers_a": len(layers_a), "n_layers_b": len(layers_b),
            "batch_size": batch_size, "seconds": round(seconds, 3)}


def layers_meta(layers: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """``{"a": [...], "b": [...]}``: each side's layers with shape, reduction and width for result.json."""
    return {side: [{k: v for k, v in row.items() if k != "model"}
                   for row in layers[layers["model"] == side].to_dict(orient="records")] for side in ("a", "b")}


def compare(model_a: nn.Module, model_b: nn.Module, data: Any, *,
            layers_a: str | Sequence[str] = "blocks", layers_b: str | Sequence[str] = "blocks",
            metrics: Sequence[str] = DEFAULT_METRICS, mode: str = "minibatch", batch_size: int = 64,
            n: int | None = None, reduce: str = "auto", null: int = 0, seed: int = 0,
            device: str | torch.device = "cpu", output_index: Any = None, rbf_factor: float = 1.0,
            knn_k: int = 10, memory_budget_bytes: int = 2**30, progress: bool = True,
            names: tuple[str, str] = ("model_a", "model_b"), data_name: str | None = None,
            ) -> CompareResult:
    """Compare every chosen layer of ``model_a`` with every chosen layer of ``model_b``.

    model_a, model_b: nn.Modules, or model specs (``"torchvision:resnet18"``) loaded as the CLI does
    (A seeded with ``seed``, B with ``seed + 1``; the specs become the result's model names).
    data: Tensor (N, ...), dict of tensors, ``simkit.data.Dataset``, an iterable of batches, or a data
    spec string (``"mnist1d"``, loaded with ``n`` and ``seed``).
    layers_*: names, globs, ``type:Class`` and presets (``blocks``), as a list or a comma string.
    The models are moved to ``device`` (and stay there); their train/eval flags are restored and no
    hook is left behind. Passing the same module twice runs one forward pass per batch.
    Returns a CompareResult: ``.matrix(metric)`` is (L_a, L_b); ``.to_frame()`` the long table.
    """
    from simkit.layers import resolve_layers

    metrics = check_metrics(metrics)
    if isinstance(model_a, str) or isinstance(model_b, str):
        from simkit.models import load_model

        names = (model_a if isinstance(model_a, str) else names[0], model_b if isinstance(model_b, str) else names[1])
        model_a = load_model(model_a, seed=seed) if isinstance(model_a, str) else model_a
        model_b = load_model(model_b, seed=seed + 1) if isinstance(model_b, str) else model_b
    if isinstance(data, str):
        from simkit.data import load_data

        data_name = data_name or data
        data = load_data(data, n=n, seed=seed)
    for side, model in (("model_a", model_a), ("model_b", model_b)):
        if not isinstance(model, nn.Module):
            raise SimkitError(f"{side} must be an nn.Module or a model spec string, got {type(model).__name__}")
    check_batch_size(batch_size)
    if mode not in MODES:
        raise SimkitError(f"unknown mode {mode!r}; choose exact or minibatch")
    if null < 0:
        raise SimkitError(f"--null must be 0 or a positive number of permutations, got {null}")
    device = resolve_device(device)
    chosen_a = resolve_layers(model_a, layers_a)
    chosen_b = resolve_layers(model_b, layers_b)
    model_a.to(device)
    model_b.to(device)

    started = time.perf_counter()
    total = count_rows(data)
    if total is not None and n is not None:
        total = min(total, n)
    steps = None if total is None else -(-total // batch_size)
    bar = progress_bar(progress)
    task = bar.add_task(f"compare ({mode})", total=steps)

    # one model against itself: one set of hooks and one forward pass per batch feed both sides
    same = model_a is model_b
    union = chosen_a + [name for name in chosen_b if name not in chosen_a] if same else chosen_a

    def activations():
        with bar:
            for batch in iter_batches(data, batch_size, n, rank=distributed.rank(),
                                      world_size=distributed.world_size()):
                if same:
                    acts = dict(zip(union, tap_a.step(batch), strict=True))
                    yield [acts[name] for name in chosen_a], [acts[name] for name in chosen_b]
                else:
                    yield tap_a.step(batch), tap_b.step(batch)
                bar.advance(task, distributed.world_size())

    options = dict(null=null, seed=seed, rbf_factor=rbf_factor, knn_k=knn_k,
                   memory_budget_bytes=memory_budget_bytes, device=device,
                   names_a=[f"{name!r} ({names[0]})" for name in chosen_a],
                   names_b=[f"{name!r} ({names[1]})" for name in chosen_b])
    with ExitStack() as stack:
        tap_a = stack.enter_context(Tap(model_a, union, names[0], reduce=reduce, output_index=output_index,
                                        device=device))
        tap_b = tap_a if same else stack.enter_context(
            Tap(model_b, chosen_b, names[1], reduce=reduce, output_index=output_index, device=device))
        measured = measure(activations(), metrics, mode, **options)
    frame = similarity_frame(measured.values, chosen_a, chosen_b)
    seconds = time.perf_counter() - started

    layer_rows = (tap_a.layer_rows("a", measured.dims_a, chosen_a)
                  + tap_b.layer_rows("b", measured.dims_b, chosen_b))
    layers = pd.DataFrame(layer_rows)

    summary = compare_summary(names[0], names[1], data_name or type(data).__name__, measured, mode, metrics,
                              chosen_a, chosen_b, batch_size, seconds)
    meta = run_meta(
        layers=layers_meta(layers),
        settings={"layers_a": layers_a if isinstance(layers_a, str) else list(layers_a),
                  "layers_b": layers_b if isinstance(layers_b, str) else list(layers_b),
                  "reduce": reduce, "null": null, "seed": seed, "device": str(device),
                  "rbf_factor": rbf_factor, "knn_k": knn_k},
        method=measured.method,
        timings={"total": round(seconds, 3),
                 "forward": round(tap_a.forward_seconds + (0.0 if same else tap_b.forward_seconds), 3),
                 "metrics_final": round(measured.compute_seconds, 3)},
    )
    return CompareResult(summary=summary, tables={"similarity": frame, "layers": layers}, meta=meta)

