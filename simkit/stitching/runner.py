"""``stitch``: standard and invariance-aware stitching over layer pairs and objectives.

For each (layer of A, layer of B) pair and each setting — ``standard`` (the stitch is trained on the
stitching data's training inputs) and, with ``iri=True``, ``iri`` (trained only on IRIs of A at the
stitch layer, with targets from B on the IRIs and the originals' labels for HLM) — and each objective,
a stitch is initialised by least squares on that setting's inputs, trained with the shared loop, and
evaluated on the evaluation set (the data's test split, or ``test_data``): stitched accuracy, B's
accuracy and the penalty ``b_accuracy − stitched_accuracy``. With ``train`` > 0, copies of A and B are
first trained on the stitching data (stages ``train_a``, ``train_b``). A model at chance and IRIs that
missed their tolerance are warned about (``summary["warnings"]``, :mod:`simkit.stitching.checks`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from simkit.data import Dataset, check_finite
from simkit.errors import SimkitError
from simkit.forward import check_accepts, modes_kept, resolve_device
from simkit.results import StitchResult
from simkit.rundir import RunDir, fingerprint, open_run_dir
from simkit.runinfo import Timer, run_meta
from simkit.seeding import derive_seed
from simkit.stitching.checks import chance_accuracy, run_warnings
from simkit.stitching.halves import BackHalf, FrontHalf, frozen_copy, record
from simkit.stitching.iri import IRISet, generate_iris, tensor_digest
from simkit.stitching.iri import fingerprint as weights_digest
from simkit.stitching.layers import StitchLayer, check_bridgeable, infer_layout
from simkit.stitching.objectives import DESCRIPTIONS
from simkit.stitching.pairs import layer_pairs
from simkit.stitching.settings import StitchSettings
from simkit.stitching.stitched import StitchedModel, StitchLoss
from simkit.training import TrainConfig, TrainHistory, evaluate_accuracy, fit, train_classifier

__all__ = ["COLUMNS", "DEFAULT_CACHE", "StitchResult", "StitchSettings", "stitch"]

COLUMNS = ["layer_a", "layer_b", "objective", "setting", "stitched_accuracy", "b_accuracy", "penalty"]
DEFAULT_CACHE = Path("runs/.iri-cache")
COMMAND = "stitch"


def _value_range(train: Dataset, x: Tensor) -> tuple[tuple[float, float], str]:
    value_range = train.info.get("value_range")
    if value_range is not None:
        return (float(value_range[0]), float(value_range[1])), "data info"
    warnings.warn("the data spec gives no value_range; IRIs are clamped to the training inputs' min/max",
                  stacklevel=3)
    return (float(x.min()), float(x.max())), "training min/max"


def _check_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _batches(x: Tensor, size: int) -> Iterator[Tensor]:
    for start in range(0, len(x), size):
        yield x[start:start + size]


def _lstsq_state(front: FrontHalf, back: BackHalf, stitch: StitchLayer, x: Tensor, batch_size: int,
                 device: torch.device) -> tuple[dict[str, Tensor], float]:
    """Least-squares (DM) init of ``stitch`` from inputs ``x (n, ...)``: (state_dict, DM residual)."""
    def pairs() -> Iterator[tuple[Tensor, Tensor]]:
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
    """Top-1 accuracy on the evaluation set (in eval mode, every module's own mode kept after it);
    NaN when the data has no labels."""
    if y is None:
        return float("nan")
    with modes_kept(model):
        return evaluate_accuracy(model, x, y, batch_size=512)


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


def _split(dataset: Dataset, test_data: Dataset | None, seed: int) -> tuple[Dataset, Dataset]:
    """(training part, evaluation set): the data's own split without ``test_data``; with it, all of the
    data's own samples train (a native test split of the data is left unused) and the evaluation set is
    ``test_data``'s native test split when it has one, else all of ``test_data``."""
    if test_data is None:
        return dataset.train_test(seed=seed)
    train = Dataset(dataset.inputs, dataset.labels, dataset.spec, None, dataset.info)
    return train, test_data.test if test_data.test is not None else test_data


def _check_test_data(test_data: Dataset | None, x_train: Tensor) -> None:
    """SimkitError unless ``test_data`` is a labelled Dataset whose samples have the training inputs'
    shape ``x_train (n, ...)`` and are finite."""
    if test_data is None:
        return
    if not isinstance(test_data, Dataset):
        raise SimkitError(f"`test_data` must be a simkit Dataset, got {type(test_data).__name__}; load a data "
                          "spec with simkit.data.load_data")
    check_finite(test_data, "test_data")
    evaluation = test_data.test if test_data.test is not None else test_data
    if isinstance(evaluation.inputs, dict):
        raise SimkitError("`test_data` must hold tensor inputs (images, signals, vectors), not tokenised text")
    if evaluation.labels is None:
        raise SimkitError(f"`test_data` {test_data.spec!r} has no labels; the evaluation set needs labels "
                          "to measure accuracies")
    if tuple(evaluation.inputs.shape[1:]) != tuple(x_train.shape[1:]):
        raise SimkitError(f"`test_data` samples have shape {tuple(evaluation.inputs.shape[1:])} but the "
                          f"stitching data's have {tuple(x_train.shape[1:])}; give evaluation data of the same kind")


def _trained(model: nn.Module, train: Dataset, settings: StitchSettings, label: str, run_dir: Path | None,
             resume: bool, progress: bool, dev: torch.device) -> nn.Module:
    """A copy of ``model`` trained ``settings.train`` epochs with cross-entropy on ``train`` (stage
    ``train_<label>``, checkpointed and resumed like every stitch), in eval mode."""
    copy = frozen_copy(model).to(dev)
    for param in copy.parameters():
        param.requires_grad_(True)
    config = TrainConfig(epochs=settings.train, batch_size=settings.batch_size, lr=settings.lr, optimizer="adam",
                         seed=derive_seed(settings.seed, "train", label), progress=progress,
                         description=f"train model {label.upper()}")
    train_classifier(copy, train, config, run_dir=run_dir, name=f"train_{label}", resume=resume)
    return copy.eval()


def _cut(model_a: nn.Module, model_b: nn.Module, pairs: Sequence[tuple[str, str]], probe: Tensor, tokens: bool,
         dev: torch.device) -> list[tuple[Any, ...]]:
    """Cut both models at every pair and check that a stitch can bridge the shapes (fail fast):
    ``(la, lb, front, back, shape_a, shape_b, layout)`` per pair."""
    plan = []
    for la, lb in pairs:
        front, back = FrontHalf(model_a, la).to(dev), BackHalf(model_b, lb).to(dev)
        back.probe(probe)
        with torch.no_grad(), record(back.model, [lb]) as acts:
            back.model(probe)
            h_a = front(probe)
        shape_a, shape_b = tuple(h_a.shape[1:]), tuple(acts[lb].shape[1:])
        layout_a, layout_b = infer_layout(shape_a, tokens=tokens), infer_layout(shape_b, tokens=tokens)
        check_bridgeable(shape_a, shape_b, layout_a, layout_b, where=f"A.{la} → B.{lb}")
        plan.append((la, lb, front, back, shape_a, shape_b, layout_a))
    return plan


def stitch(model_a: nn.Module, model_b: nn.Module, data: Dataset, settings: StitchSettings | None = None, *,
           test_data: Dataset | None = None, run_dir: RunDir | str | Path | None = None, resume: bool = False,
           device: str | torch.device = "cpu", progress: bool = True,
           cache_dir: str | Path | None = DEFAULT_CACHE,
           names: Sequence[str] = ("model_a", "model_b")) -> StitchResult:
    """Stitch A's front half into B's back half at each layer pair; standard and (with ``iri``) IRI arms.

    model_a / model_b: the front (A) and back (B) models; never modified (halves work on frozen copies;
    with ``settings.train`` > 0 copies are trained first).
    data: a simkit Dataset (labels needed for HLM, ``train`` and accuracies); without ``test_data`` its
    native test split (or a seeded 80/20 split) is the evaluation set and the rest trains the stitches
    and seeds IRIs.
    test_data: an evaluation set of its own (its native test split when it has one, else all of it;
    labelled, samples shaped as ``data``'s); all of ``data``'s own samples then train the stitches.
    settings: what decides the numbers (:class:`StitchSettings`; default: the command's defaults).
    run_dir / resume: checkpoints of every stitch under ``run_dir/checkpoints`` and resume from them
    (a path is checked against the settings and fingerprints of the models and data, so a resume with
    other inputs is refused; a :class:`~simkit.rundir.RunDir` is used as it is).
    device: cpu, cuda or cuda:N. progress: progress bars. cache_dir: IRI cache (None: no cache).
    names: the models' names in the result (the CLI passes the specs).
    """
    timer = Timer()
    settings = settings if settings is not None else StitchSettings()
    if not isinstance(settings, StitchSettings):
        raise SimkitError(f"`settings` must be a StitchSettings, got {type(settings).__name__}")
    settings.validate()
    objectives = settings.objectives
    for label, model in (("model_a", model_a), ("model_b", model_b)):
        if not isinstance(model, nn.Module):
            raise SimkitError(f"`{label}` must be a torch.nn.Module, got {type(model).__name__}; load a model "
                              "spec with simkit.models.load_model")
    if not isinstance(data, Dataset):
        raise SimkitError(f"`data` must be a simkit Dataset, got {type(data).__name__}; load a data spec "
                          "with simkit.data.load_data")
    name_a, name_b = (str(name) for name in names)
    seed = settings.seed
    dev = resolve_device(device)
    with timer("load"):
        dataset = data.cap(settings.n)
        check_finite(dataset)
        if test_data is not None and not isinstance(test_data, Dataset):
            _check_test_data(test_data, torch.empty(0))
        train, test = _split(dataset, test_data, seed)
    x_train, y_train = train.inputs, train.labels
    x_test, y_test = test.inputs, test.labels
    if isinstance(x_train, dict) or isinstance(x_test, dict):
        raise SimkitError("simkit stitch needs tensor inputs (images, signals, vectors), not tokenised text")
    _check_test_data(test_data, x_train)
    if "hlm" in objectives and train.labels is None:
        raise SimkitError(f"the HLM objective needs labels but data {data.spec!r} has none; "
                          "use labelled data or drop hlm from `objective`")
    if settings.train > 0 and train.labels is None:
        raise SimkitError(f"`train` trains A and B with cross-entropy but data {data.spec!r} has no labels; "
                          "use labelled data or set `train` to 0")
    if test.labels is None:
        warnings.warn(f"data {data.spec!r} has no labels: accuracies and penalties are NaN", stacklevel=2)
    pairs = layer_pairs(model_a, model_b, settings.layer_a, settings.layer_b, settings.layers)
    tokens = settings.tokens or any(isinstance(m, nn.Embedding) for m in model_a.modules())
    _train_config(settings, progress, "check").validate()

    probe = x_train[:2].to(dev)
    check_accepts(model_a, probe, "model A")
    check_accepts(model_b, probe, "model B")
    plan = _cut(model_a, model_b, pairs, probe, tokens, dev)
    value_range, range_source = _value_range(train, x_train)
    run = open_run_dir(run_dir, COMMAND, _python_inputs(run_dir, settings, model_a, model_b, data, test_data),
                       resume=resume)
    if run is not None:
        run.start()  # the first write: everything above was checking
    checkpoints = run.path if run is not None else None

    if settings.train > 0:
        with timer("train_models"):
            model_a = _trained(model_a, train, settings, "a", checkpoints, resume, progress, dev)
            model_b = _trained(model_b, train, settings, "b", checkpoints, resume, progress, dev)
        plan = _cut(model_a, model_b, pairs, probe, tokens, dev)
    with timer("evaluate"):
        a_acc = _accuracy(frozen_copy(model_a).to(dev), x_test, y_test)
        b_acc = _accuracy(plan[0][3].model, x_test, y_test)

    arms = ["standard"] + (["iri"] if settings.iri else [])
    iri_settings = settings.iri_settings()
    iri_sets: dict[str, IRISet] = {}
    iri_cache: dict[str, Any] = {}
    cut_modes: dict[str, str] = {}
    rows, train_rows = [], []
    data_key = f"{data.spec}|n={len(train)}|{tensor_digest(x_train)}"
    fp_a = weights_digest(model_a) if settings.iri else ""
    for la, lb, front, back, shape_a, shape_b, layout in plan:
        cut_modes[f"{la}->{lb}"] = back.mode if back.mode == "cut" else f"replace ({back.reason})"
        for arm in arms:
            if arm == "iri":
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
            if settings.init == "lstsq":
                with timer("lstsq"):
                    init_state, residual = _lstsq_state(front, back, stitch0, inputs, 256, dev)
            else:
                init_state = {k: v.clone() for k, v in stitch0.state_dict().items()}
            for objective in objectives:
                layer = StitchLayer(shape_a, shape_b, layout).to(dev)
                layer.load_state_dict(init_state)
                stitched = StitchedModel(front, layer, back)
                config = _train_config(settings, progress, f"{arm} {objective} A.{la}→B.{lb}")
                data_t = (inputs, y_train) if y_train is not None else (inputs,)
                with timer("train"):
                    history = _fit(layer, StitchLoss(objective, stitched), data_t, config, checkpoints,
                                   _check_name(f"stitch_{la}__{lb}__{objective}__{arm}"), resume)
                with timer("evaluate"):
                    acc = _accuracy(stitched, x_test, y_test)
                rows.append({"layer_a": la, "layer_b": lb, "objective": objective, "setting": arm,
                             "stitched_accuracy": acc, "b_accuracy": b_acc, "penalty": b_acc - acc})
                train_rows.append({"layer_a": la, "layer_b": lb, "objective": objective, "setting": arm,
                                   "steps": history.steps,
                                   "final_loss": history.losses[-1] if history.losses else float("nan"),
                                   "lstsq_dm_residual": residual, "cut": back.mode})

    table = pd.DataFrame(rows, columns=COLUMNS)
    summary = _summary(table, objectives, arms, a_acc, b_acc, iri_sets, y_test, iri_settings.tol, len(pairs))
    for message in summary["warnings"]:
        warnings.warn(message, stacklevel=2)
    iri_table = pd.DataFrame([{"layer_a": la, **s.summary(), "iri_converged_fraction": s.summary()["reached_fraction"],
                               "tol": s.tol, "cache": iri_cache[la]["cache"]}
                              for la, s in iri_sets.items()])
    extra = {
        "pairs": [{"layer_a": la, "layer_b": lb, "depth_a": _relative_depth(model_a, la),
                   "depth_b": _relative_depth(model_b, lb)} for la, lb in pairs],
        "iri_histograms": {la: _histogram(s.rel_error) for la, s in iri_sets.items()},
        "iri_examples": {la: _examples(x_train, s, settings.examples) for la, s in iri_sets.items()},
        "objective_descriptions": {k: DESCRIPTIONS[k] for k in objectives},
    }
    meta = run_meta(
        model_a=name_a, model_b=name_b, data=data.spec, n=settings.n, seed=seed, n_train=len(train),
        n_test=len(test), test_data=None if test_data is None else test_data.spec, objectives=objectives,
        settings=arms, pairs=[list(p) for p in pairs], init=settings.init,
        train={"steps": settings.steps, "batch_size": settings.batch_size, "lr": settings.lr, "optimizer": "adam"},
        train_models_epochs=settings.train,
        iri=asdict(iri_settings) if settings.iri else None,
        value_range=list(value_range), value_range_source=range_source,
        cache_dir=None if cache_dir is None else str(cache_dir),
        iri_cache=dict(iri_cache), cut=cut_modes, device=str(dev), options=settings.to_dict(),
        timings=timer.seconds)
    tables = {"stitching": table, "training": pd.DataFrame(train_rows)}
    if len(iri_table):
        tables["iris"] = iri_table
    return StitchResult(summary=summary, tables=tables, meta=meta, extra=extra)


def _summary(table: pd.DataFrame, objectives: list[str], arms: list[str], a_acc: float, b_acc: float,
             iri_sets: dict[str, IRISet], labels: Tensor | None, tol: float, n_pairs: int) -> dict[str, Any]:
    """The result's summary: accuracies, IRI quality, mean penalty per objective and arm, warnings."""
    summary: dict[str, Any] = {"a_accuracy": a_acc, "b_accuracy": b_acc, "iri_relative_error_median": None,
                               "iri_converged_fraction": None}
    converged = {la: float(s.reached.double().mean()) for la, s in iri_sets.items()}
    medians = {la: float(s.rel_error.median()) for la, s in iri_sets.items()}
    if iri_sets:
        summary["iri_relative_error_median"] = float(torch.cat([s.rel_error for s in iri_sets.values()]).median())
        summary["iri_converged_fraction"] = min(converged.values())
    for objective in objectives:
        for arm in arms:
            part = table[(table.objective == objective) & (table.setting == arm)]
            summary[f"mean_penalty_{objective}_{arm}"] = float(part.penalty.mean())
    summary["pairs"] = n_pairs
    summary["chance_accuracy"] = chance_accuracy(labels) if labels is not None else None
    summary["warnings"] = run_warnings({"model A": a_acc, "model B": b_acc}, labels, converged, medians, tol)
    return summary


def _python_inputs(run_dir: RunDir | str | Path | None, settings: StitchSettings, model_a: nn.Module,
                   model_b: nn.Module, data: Dataset, test_data: Dataset | None = None) -> dict[str, Any]:
    """What a run directory given as a path records: the settings and fingerprints of the models and
    the data (nothing for a RunDir, which the CLI made with the specs, or for no run directory)."""
    if run_dir is None or isinstance(run_dir, RunDir):
        return {}
    inputs = {**settings.to_dict(), "model_a": fingerprint(model_a), "model_b": fingerprint(model_b),
              "data": fingerprint(data)}
    if test_data is not None:
        inputs["test_data"] = fingerprint(test_data)
    return inputs


def _train_config(settings: StitchSettings, progress: bool, description: str) -> TrainConfig:
    return TrainConfig(steps=settings.steps, batch_size=settings.batch_size, lr=settings.lr, optimizer="adam",
                       seed=settings.seed, progress=progress, description=description)


def _fit(stitch: StitchLayer, loss: StitchLoss, data: tuple[Tensor, ...], config: TrainConfig,
         run_dir: Path | None, name: str, resume: bool) -> TrainHistory:
    return fit(stitch, loss, data, config, params=list(stitch.parameters()), run_dir=run_dir, name=name,
               resume=resume)
