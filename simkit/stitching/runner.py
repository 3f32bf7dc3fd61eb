"""``run_stitching``: standard and invariance-aware stitching over layer pairs and objectives.

For each (layer of A, layer of B) pair and each setting — ``standard`` (the stitch is trained on clean
training inputs) and, with ``iri=True``, ``iri`` (trained only on IRIs of A at the stitch layer, with
targets from B on the IRIs and the originals' labels for HLM) — and each objective, a stitch is
initialised by least squares on that setting's inputs, trained with the shared loop, and evaluated on
the clean test set: stitched accuracy, B's accuracy and the penalty ``b_accuracy − stitched_accuracy``.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from simkit.errors import SimkitError
from simkit.forward import check_accepts, resolve_device
from simkit.results import StitchResult
from simkit.runinfo import Timer, run_meta
from simkit.stitching.halves import BackHalf, FrontHalf, record
from simkit.stitching.iri import IRISet, IRISettings, fingerprint, generate_iris, tensor_digest
from simkit.stitching.layers import StitchLayer, check_bridgeable, infer_layout
from simkit.stitching.objectives import DESCRIPTIONS, parse_objectives
from simkit.stitching.pairs import layer_pairs
from simkit.stitching.stitched import StitchedModel, StitchLoss

COLUMNS = ["layer_a", "layer_b", "objective", "setting", "stitched_accuracy", "b_accuracy", "penalty"]
DEFAULT_CACHE = Path("runs/.iri-cache")


def _model(model: nn.Module | str, name: str, seed: int, trust: bool) -> tuple[nn.Module, str]:
    if isinstance(model, nn.Module):
        return model, f"<{type(model).__name__} object>"
    from simkit.models import load_model

    return load_model(model, seed=seed, trust=trust), model


def _data(data: Any, n: int | None, seed: int):
    from simkit.data import Dataset, load_data

    if isinstance(data, Dataset):
        return (data.cap(n) if n is not None else data), data.spec
    if isinstance(data, str):
        return load_data(data, n=n, seed=seed), data
    raise SimkitError(f"data must be a spec string or a simkit Dataset, got {type(data).__name__}")


def _value_range(train, x: Tensor) -> tuple[tuple[float, float], str]:
    value_range = train.info.get("value_range")
    if value_range is not None:
        return (float(value_range[0]), float(value_range[1])), "data info"
    warnings.warn("the data spec gives no value_range; IRIs are clamped to the training inputs' min/max",
                  stacklevel=3)
    return (float(x.min()), float(x.max())), "training min/max"


def _check_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _batches(x: Tensor, size: int):
    for start in range(0, len(x), size):
        yield x[start:start + size]


def _lstsq_state(front: FrontHalf, back: BackHalf, stitch: StitchLayer, x: Tensor, batch_size: int,
                 device: torch.device) -> tuple[dict[str, Tensor], float]:
    """Least-squares (DM) init of ``stitch`` from inputs ``x (n, ...)``: (state_dict, DM residual)."""
    def pairs():
        for xb in _batches(x, batch_size):
            xb = xb.to(device)
            with torch.no_grad(), record(back.model, [back.layer]) as acts:
                back.model(xb)
                h_a = front(xb)
            yield h_a.cpu(), acts[back.layer].cpu()

    stitch.fit(pairs())
    return {k: v.clone() for k, v in stitch.state_dict().items()}, stitch.dm_residual_


@torch.no_grad()
def _accuracy(model: nn.Module, x: Tensor, y: Tensor | None) -> float:
    """Top-1 accuracy on the clean test set; NaN when the data has no labels."""
    from simkit.training import evaluate_accuracy

    return float("nan") if y is None else evaluate_accuracy(model, x, y, batch_size=512)


def _histogram(errors: Tensor, bins: int = 30) -> dict[str, list[float]]:
    values = np.log10(np.clip(errors.numpy(), 1e-12, None))
    counts, edges = np.histogram(values, bins=bins)
    return {"log10_edges": edges.tolist(), "counts": counts.tolist()}


MAX_EXAMPLE_VALUES = 3 * 64 * 64  # larger inputs are not copied into result.json


def _examples(x: Tensor, iris: IRISet, k: int) -> dict[str, Any]:
    """The first ``k`` originals, seeds and IRIs (as lists) for the report; none for large inputs."""
    if x[0].numel() > MAX_EXAMPLE_VALUES:
        k = 0
    idx = list(range(min(k, len(x))))
    seeds = iris.seed_index[idx]
    return {"original": x[idx].tolist(), "iri": iris.iris[idx].tolist(),
            "seed": [x[int(s)].tolist() if s >= 0 else None for s in seeds],
            "rel_error": iris.rel_error[idx].tolist(), "shape": list(x.shape[1:])}


def _relative_depth(model: nn.Module, name: str) -> float:
    names = [n for n, m in model.named_modules() if n]
    return (names.index(name) + 1) / len(names)


def run_stitching(model_a: nn.Module | str, model_b: nn.Module | str, data: Any, *,
                  layer_a: str | list[str] | None = None, layer_b: str | list[str] | None = None,
                  layers: str | None = None, objectives: str | list[str] = "fula", iri: bool = False,
                  steps: int = 300, batch_size: int = 128, lr: float = 1e-3, init: str = "lstsq",
                  iri_settings: IRISettings | None = None, seed: int = 0, n: int | None = None,
                  trust: bool = False, run_dir: str | Path | None = None, resume: bool = False,
                  cache_dir: str | Path | None = DEFAULT_CACHE, device: str = "cpu", tokens: bool = False,
                  progress: bool = True, examples: int = 4) -> StitchResult:
    """Stitch A's front half into B's back half at each layer pair; standard and (with ``iri``) IRI arms.

    model_a / model_b: modules or model specs (loaded with ``seed`` / ``trust``); never modified.
    data: a Dataset or data spec (needs labels for HLM and for accuracies); its native test split (or
    a seeded 80/20 split) is the clean evaluation set, the rest trains the stitches and seeds IRIs.
    layer_a / layer_b: module names (comma lists pair up) or ``layers="auto"``.
    objectives: comma list of hlm, slm, dm, fula. steps / batch_size / lr: stitch training (Adam);
    steps=0 keeps the least-squares init. init: "lstsq" or "default" (PyTorch init / identity).
    iri_settings: how IRIs are made (:class:`IRISettings`). cache_dir: IRI cache (None: no cache).
    run_dir / resume: checkpoints of every stitch under ``run_dir/checkpoints`` and resume from them.
    tokens: read 2-D activations (T, d) as tokens (linear stitch) rather than (C, L) feature maps.
    """
    timer = Timer()
    names = parse_objectives(objectives)
    if init not in ("lstsq", "default"):
        raise SimkitError(f"unknown stitch init {init!r}; use 'lstsq' (least squares) or 'default'")
    if steps < 0 or batch_size < 1:
        raise SimkitError(f"steps must be >= 0 and batch size >= 1, got {steps}, {batch_size}")
    iri_settings = iri_settings or IRISettings()
    iri_settings.validate()
    dev = resolve_device(device)
    with timer("load"):
        net_a, spec_a = _model(model_a, "A", seed, trust)
        net_b, spec_b = _model(model_b, "B", seed, trust)
        dataset, data_spec = _data(data, n, seed)
        train, test = dataset.train_test(seed=seed)
    if isinstance(train.inputs, dict):
        raise SimkitError("simkit stitch needs tensor inputs (images, signals, vectors), not tokenised text")
    if "hlm" in names and train.labels is None:
        raise SimkitError(f"the HLM objective needs labels but data {data_spec!r} has none; "
                          "use a labelled data spec or drop hlm from --objective")
    if test.labels is None:
        warnings.warn(f"data {data_spec!r} has no labels: accuracies and penalties are NaN", stacklevel=2)
    pairs = layer_pairs(net_a, net_b, layer_a, layer_b, layers)
    x_train, y_train = train.inputs, train.labels
    x_test, y_test = test.inputs, test.labels
    tokens = tokens or any(isinstance(m, nn.Embedding) for m in net_a.modules())

    # plan: cut both models at every pair and check that a stitch can bridge the shapes (fail fast)
    plan = []
    probe = x_train[:2].to(dev)
    check_accepts(net_a, probe, "model A")
    check_accepts(net_b, probe, "model B")
    for la, lb in pairs:
        front, back = FrontHalf(net_a, la).to(dev), BackHalf(net_b, lb).to(dev)
        back.probe(probe)
        with torch.no_grad(), record(back.model, [lb]) as acts:
            back.model(probe)
            h_a = front(probe)
        shape_a, shape_b = tuple(h_a.shape[1:]), tuple(acts[lb].shape[1:])
        layout_a, layout_b = infer_layout(shape_a, tokens=tokens), infer_layout(shape_b, tokens=tokens)
        check_bridgeable(shape_a, shape_b, layout_a, layout_b, where=f"A.{la} → B.{lb}")
        plan.append((la, lb, front, back, shape_a, shape_b, layout_a))

    with timer("evaluate"):
        a_acc = _accuracy(_frozen(net_a).to(dev), x_test, y_test)
        b_acc = _accuracy(plan[0][3].model, x_test, y_test)

    settings = ["standard"] + (["iri"] if iri else [])
    value_range, range_source = _value_range(train, x_train)
    iri_sets: dict[str, IRISet] = {}
    iri_cache: dict[str, Any] = {}
    cut_modes: dict[str, str] = {}
    rows, train_rows = [], []
    data_key = f"{data_spec}|n={len(train)}|{tensor_digest(x_train)}"
    fp_a = fingerprint(net_a) if iri else ""
    for la, lb, front, back, shape_a, shape_b, layout in plan:
        cut_modes[f"{la}->{lb}"] = back.mode if back.mode == "cut" else f"replace ({back.reason})"
        for setting in settings:
            if setting == "iri":
                if la not in iri_sets:
                    with timer("iri"):
                        iri_sets[la], iri_cache[la] = generate_iris(
                            front, x_train, iri_settings, value_range=value_range, seed=seed,
                            cache_dir=cache_dir, key_parts={"model": fp_a, "layer": la, "data": data_key},
                            progress=progress, description=f"IRIs A.{la}")
                inputs = iri_sets[la].iris
            else:
                inputs = x_train
            stitch0 = StitchLayer(shape_a, shape_b, layout).to(dev)
            residual = float("nan")
            if init == "lstsq":
                with timer("lstsq"):
                    init_state, residual = _lstsq_state(front, back, stitch0, inputs, 256, dev)
            else:
                init_state = {k: v.clone() for k, v in stitch0.state_dict().items()}
            for objective in names:
                stitch = StitchLayer(shape_a, shape_b, layout).to(dev)
                stitch.load_state_dict(init_state)
                stitched = StitchedModel(front, stitch, back)
                config = _train_config(steps, batch_size, lr, seed, progress,
                                       f"{setting} {objective} A.{la}→B.{lb}")
                data_t = (inputs, y_train) if y_train is not None else (inputs,)
                with timer("train"):
                    history = _fit(stitch, StitchLoss(objective, stitched), data_t, config, run_dir,
                                   _check_name(f"stitch_{la}__{lb}__{objective}__{setting}"), resume)
                with timer("evaluate"):
                    acc = _accuracy(stitched, x_test, y_test)
                rows.append({"layer_a": la, "layer_b": lb, "objective": objective, "setting": setting,
                             "stitched_accuracy": acc, "b_accuracy": b_acc, "penalty": b_acc - acc})
                train_rows.append({"layer_a": la, "layer_b": lb, "objective": objective, "setting": setting,
                                   "steps": history.steps,
                                   "final_loss": history.losses[-1] if history.losses else float("nan"),
                                   "lstsq_dm_residual": residual, "cut": back.mode})

    table = pd.DataFrame(rows, columns=COLUMNS)
    summary: dict[str, Any] = {"a_accuracy": a_acc, "b_accuracy": b_acc, "iri_relative_error_median": None}
    if iri_sets:
        summary["iri_relative_error_median"] = float(torch.cat([s.rel_error for s in iri_sets.values()]).median())
    for objective in names:
        for setting in settings:
            part = table[(table.objective == objective) & (table.setting == setting)]
            summary[f"mean_penalty_{objective}_{setting}"] = float(part.penalty.mean())
    summary["pairs"] = len(pairs)
    iri_table = pd.DataFrame([{"layer_a": la, **s.summary(), "tol": s.tol, "cache": iri_cache[la]["cache"]}
                              for la, s in iri_sets.items()])
    extra = {
        "pairs": [{"layer_a": la, "layer_b": lb, "depth_a": _relative_depth(net_a, la),
                   "depth_b": _relative_depth(net_b, lb)} for la, lb in pairs],
        "iri_histograms": {la: _histogram(s.rel_error) for la, s in iri_sets.items()},
        "iri_examples": {la: _examples(x_train, s, examples) for la, s in iri_sets.items()},
        "objective_descriptions": {k: DESCRIPTIONS[k] for k in names},
    }
    meta = run_meta(
        model_a=spec_a, model_b=spec_b, data=data_spec, n=n, seed=seed, n_train=len(train), n_test=len(test),
        objectives=names, settings=settings, pairs=[list(p) for p in pairs], init=init,
        train={"steps": steps, "batch_size": batch_size, "lr": lr, "optimizer": "adam"},
        iri=asdict(iri_settings) if iri else None, value_range=list(value_range), value_range_source=range_source,
        cache_dir=None if cache_dir is None else str(cache_dir),
        iri_cache={la: c for la, c in iri_cache.items()}, cut=cut_modes, device=str(dev),
        timings=timer.seconds)
    tables = {"stitching": table, "training": pd.DataFrame(train_rows)}
    if len(iri_table):
        tables["iris"] = iri_table
    return StitchResult(summary=summary, tables=tables, meta=meta, extra=extra)


def _frozen(model: nn.Module) -> nn.Module:
    from simkit.stitching.halves import frozen_copy

    return frozen_copy(model)


def _train_config(steps: int, batch_size: int, lr: float, seed: int, progress: bool, description: str):
    from simkit.training import TrainConfig

    return TrainConfig(steps=steps, batch_size=batch_size, lr=lr, optimizer="adam", seed=seed,
                       progress=progress, description=description)


def _fit(stitch, loss, data, config, run_dir, name, resume):
    from simkit.training import fit

    return fit(stitch, loss, data, config, params=list(stitch.parameters()), run_dir=run_dir, name=name,
               resume=resume)
