"""The checking phase of :func:`simkit.stitching.runner.stitch`: arguments, data split and labels.

:func:`prepare` turns ``stitch``'s arguments into a :class:`Prepared` (the training part and the
evaluation set as tensors, the layer pairs, the device) or raises SimkitError naming what cannot run,
before anything is written or trained.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from simkit.data import Dataset, check_finite
from simkit.errors import SimkitError
from simkit.forward import resolve_device
from simkit.provenance import Timer
from simkit.rundir import RunDir, fingerprint
from simkit.seeding import generator
from simkit.settings.stitch import StitchSettings
from simkit.stitching.pairs import layer_pairs


@dataclass(frozen=True)
class Prepared:
    """What the checks leave for the run: settings, the parts of the data as tensors, the layer pairs.

    train / test: the training part (stitches, IRIs, ``train``) and the evaluation set;
    x_train, y_train, x_test, y_test: their inputs (n, ...) and labels (n,) or None;
    x_val, y_val: the validation split carved from the stitching data when ``settings.val_every`` > 0
    (``(n_val, ...)``, ``(n_val,)``; None otherwise), which ``train`` then no longer holds.
    """

    settings: StitchSettings
    data: Dataset
    test_data: Dataset | None
    names: tuple[str, str]
    dev: torch.device
    train: Dataset
    test: Dataset
    x_train: Tensor
    y_train: Tensor | None
    x_test: Tensor
    y_test: Tensor | None
    pairs: list[tuple[str, str]]
    tokens: bool
    x_val: Tensor | None = None
    y_val: Tensor | None = None

    @property
    def objectives(self) -> list[str]:
        """The settings' objectives, parsed."""
        return self.settings.objectives


def checked_settings(settings: StitchSettings | None) -> StitchSettings:
    """``settings`` (default: :class:`StitchSettings`'s defaults), validated."""
    settings = settings if settings is not None else StitchSettings()
    if not isinstance(settings, StitchSettings):
        raise SimkitError(f"`settings` must be a StitchSettings, got {type(settings).__name__}")
    return settings.validate()


def check_arguments(model_a: Any, model_b: Any, data: Any) -> None:
    """SimkitError unless both models are torch modules and ``data`` is a simkit Dataset."""
    for label, model in (("model_a", model_a), ("model_b", model_b)):
        if not isinstance(model, nn.Module):
            raise SimkitError(f"`{label}` must be a torch.nn.Module, got {type(model).__name__}; load a model "
                              "spec with simkit.models.load_model")
    if not isinstance(data, Dataset):
        raise SimkitError(f"`data` must be a simkit Dataset, got {type(data).__name__}; load a data spec "
                          "with simkit.data.load_data")


def split(dataset: Dataset, test_data: Dataset | None, seed: int) -> tuple[Dataset, Dataset]:
    """(training part, evaluation set): the data's own split without ``test_data``; with it, all of the
    data's own samples train (a native test split of the data is left unused) and the evaluation set is
    ``test_data``'s native test split when it has one, else all of ``test_data``."""
    if test_data is None:
        return dataset.train_test(seed=seed)
    train = Dataset(dataset.inputs, dataset.labels, dataset.spec, None, dataset.info)
    return train, test_data.test if test_data.test is not None else test_data


def validation_split(train: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """(fitting part, validation split) of the stitching data ``train``: ``round(fraction · n)`` samples
    (at least 1) drawn by a generator seeded from ``derive_seed(seed, "validation")``, both parts in
    their original order; SimkitError when fewer than two samples would be left to fit on."""
    n = len(train)
    n_val = max(1, int(round(fraction * n)))
    if n - n_val < 2:
        raise SimkitError(f"`val_fraction` {fraction:g} of {n} stitching samples leaves {n - n_val} to train the "
                          "stitches on; use more data or a smaller `val_fraction`")
    order = torch.randperm(n, generator=generator(seed, "validation"))
    val = order[:n_val].sort().values
    keep = torch.ones(n, dtype=torch.bool)
    keep[val] = False
    fit_part = train.take(keep.nonzero().squeeze(1))
    return Dataset(fit_part.inputs, fit_part.labels, train.spec, None, train.info), train.take(val)


def check_test_data(test_data: Dataset | None, x_train: Tensor) -> None:
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


def _load(data: Dataset, test_data: Dataset | None, settings: StitchSettings) -> tuple[Dataset, Dataset]:
    """The capped, finite data split into (training part, evaluation set)."""
    dataset = data.cap(settings.n)
    check_finite(dataset)
    if test_data is not None and not isinstance(test_data, Dataset):
        check_test_data(test_data, torch.empty(0))
    return split(dataset, test_data, settings.seed)


def _check_labels(data: Dataset, train: Dataset, test: Dataset, settings: StitchSettings) -> None:
    """SimkitError when an objective or ``train`` needs labels the data lacks; a warning (for the
    caller of ``stitch``) when the evaluation set has none."""
    if "hlm" in settings.objectives and train.labels is None:
        raise SimkitError(f"the HLM objective needs labels but data {data.spec!r} has none; "
                          "use labelled data or drop hlm from `objective`")
    if settings.train > 0 and train.labels is None:
        raise SimkitError(f"`train` trains A and B with cross-entropy but data {data.spec!r} has no labels; "
                          "use labelled data or set `train` to 0")
    if test.labels is None:
        warnings.warn(f"data {data.spec!r} has no labels: accuracies and penalties are NaN", stacklevel=4)


def prepare(model_a: nn.Module, model_b: nn.Module, data: Dataset, settings: StitchSettings,
            test_data: Dataset | None, names: tuple[str, str], device: str | torch.device,
            timer: Timer) -> Prepared:
    """Check ``stitch``'s data, split it (timed as ``load``) and pick the layer pairs; called by
    ``stitch`` itself (its warnings point at ``stitch``'s caller)."""
    dev = resolve_device(device)
    with timer("load"):
        train, test = _load(data, test_data, settings)
    x_train, x_test = train.inputs, test.inputs
    if isinstance(x_train, dict) or isinstance(x_test, dict):
        raise SimkitError("simkit stitch needs tensor inputs (images, signals, vectors), not tokenised text")
    check_test_data(test_data, x_train)
    _check_labels(data, train, test, settings)
    pairs = layer_pairs(model_a, model_b, settings.layer_a, settings.layer_b, settings.layers)
    tokens = settings.tokens or any(isinstance(m, nn.Embedding) for m in model_a.modules())
    x_val = y_val = None
    if settings.val_every > 0:
        train, val = validation_split(train, settings.val_fraction, settings.seed)
        fit_x, val_x = train.inputs, val.inputs
        if isinstance(fit_x, dict) or isinstance(val_x, dict):
            raise SimkitError("simkit stitch needs tensor inputs (images, signals, vectors), not tokenised text")
        x_train, x_val, y_val = fit_x, val_x, val.labels
    return Prepared(settings=settings, data=data, test_data=test_data, names=names, dev=dev, train=train,
                    test=test, x_train=x_train, y_train=train.labels, x_test=x_test, y_test=test.labels,
                    pairs=pairs, tokens=tokens, x_val=x_val, y_val=y_val)


def value_range(train: Dataset, x: Tensor) -> tuple[tuple[float, float], str]:
    """The IRIs' clamp range and where it came from: the data info's ``value_range``, else (with a
    warning for ``stitch``'s caller, three frames up) the training inputs' min/max."""
    given = train.info.get("value_range")
    if given is not None:
        return (float(given[0]), float(given[1])), "data info"
    warnings.warn("the data spec gives no value_range; IRIs are clamped to the training inputs' min/max",
                  stacklevel=4)
    return (float(x.min()), float(x.max())), "training min/max"


def python_inputs(run_dir: RunDir | str | Path | None, settings: StitchSettings, model_a: nn.Module,
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
