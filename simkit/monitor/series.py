"""A series of checkpoints as a trend: ``trend(checkpoints, data, TrendSettings(...))`` → ``TrendResult``.

For every checkpoint (in step order), each chosen layer's similarity to the reference on a fixed probe set:
the first checkpoint, the final one, or a reference model. One checkpoint is loaded at a time; the probe
activations of the reference are computed once and cached in the run directory
(``checkpoints/trend-reference.pt``), and each checkpoint's rows are saved there as soon as they are
measured (``checkpoints/trend-step-<step>.pt``), so a run that is killed resumes (``resume=True``) with
the checkpoints not yet measured and ends with the same result as an uninterrupted one.

Checkpoints: a folder (its ``.pt``, ``.pth``, ``.ckpt``, ``.bin`` and ``.safetensors`` files), a glob, a
list of files, or ``{step: nn.Module or a callable returning one}``. A file's step is the last number in
its name (``step_0400.pt`` → 400, ``epoch=3-step=400.ckpt`` → 400); files without one are numbered by
their order. Files load as ``simkit.models.load_model("file:PATH[,arch=ARCH]")``: a state dict needs
``arch`` (the architecture spec), a ``.safetensors`` written by ``simkit.models.save_model`` does not.
"""

from __future__ import annotations

import glob
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from simkit.engine.batches import data_label
from simkit.errors import SimkitError
from simkit.forward import Batch, batch_rows, resolve_device
from simkit.io import save_torch
from simkit.layers import resolve_layers
from simkit.monitor.measure import check_pairs, chosen_pairs, measure_step
from simkit.monitor.probe import probe_activations, probe_inputs
from simkit.monitor.result import trend_result
from simkit.progress import progress_bar
from simkit.provenance import weights_of
from simkit.results import TrendResult
from simkit.rundir import RunDir, fingerprint
from simkit.settings.monitor import TREND_REFERENCES, TrendSettings

#: the file suffixes a checkpoint folder is searched for
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors")
_NUMBER = re.compile(r"\d+")
_REFERENCE_FILE = "trend-reference.pt"


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of the series: its training step and how to get its model."""

    step: int
    load: Callable[[], nn.Module]
    path: Path | None = None


def step_of(path: Path) -> int | None:
    """The last number in a file's name without its suffix (None when it has none)."""
    numbers = _NUMBER.findall(path.name[: -len(path.suffix)] if path.suffix else path.name)
    return int(numbers[-1]) if numbers else None


def checkpoint_files(source: str | Path | Sequence[str | Path]) -> list[Path]:
    """The files of ``source``: a folder's checkpoint files, a glob's matches, a list of files, one file."""
    if not isinstance(source, str | Path):
        paths = [Path(p) for p in source]
    elif Path(source).is_dir():
        paths = sorted(p for p in Path(source).iterdir()
                       if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES and not p.name.startswith("."))
    elif any(c in str(source) for c in "*?["):
        paths = sorted(Path(p) for p in glob.glob(str(source)) if Path(p).is_file())
    else:
        paths = [Path(source)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SimkitError(f"`checkpoints`: {missing[0]} is not a file; pass a folder, a glob or checkpoint files")
    if not paths:
        raise SimkitError(f"`checkpoints`: no checkpoint file in {source} (looked for "
                          f"{', '.join('*' + s for s in CHECKPOINT_SUFFIXES)}); pass a folder, a glob or files")
    return paths


def _file_loader(path: Path, arch: str | None, trust: bool, seed: int) -> Callable[[], nn.Module]:
    def load() -> nn.Module:
        from simkit.models import load_model

        return load_model(f"file:{path}" + (f",arch={arch}" if arch else ""), trust=trust, seed=seed)

    return load


def find_checkpoints(checkpoints: Any, *, arch: str | None = None, trust: bool = False,
                     seed: int = 0) -> list[Checkpoint]:
    """The series in step order (see the module docstring); a SimkitError for two checkpoints of one step."""
    if isinstance(checkpoints, Mapping):
        found = [Checkpoint(int(step), _module_loader(value, int(step))) for step, value in checkpoints.items()]
    else:
        files = checkpoint_files(checkpoints)
        numbers = [step_of(p) for p in files]
        order = [n for n in numbers if n is not None] if None not in numbers else list(range(len(files)))
        found = [Checkpoint(step, _file_loader(p, arch, trust, seed), p) for step, p in zip(order, files, strict=True)]
    found.sort(key=lambda c: c.step)
    steps = [c.step for c in found]
    repeated = sorted({s for s in steps if steps.count(s) > 1})
    if repeated:
        raise SimkitError(f"`checkpoints`: several checkpoints of step {repeated[0]}; keep one file per step")
    if not found:
        raise SimkitError("`checkpoints` is empty; pass at least one checkpoint")
    return found


def _module_loader(value: Any, step: int) -> Callable[[], nn.Module]:
    if isinstance(value, nn.Module):
        return lambda: value
    if callable(value):
        return value
    raise SimkitError(f"`checkpoints`[{step}] must be an nn.Module or a callable returning one, got "
                      f"{type(value).__name__}")


def trend_settings(settings: TrendSettings | None, changes: dict[str, Any]) -> TrendSettings:
    """``settings`` (default :class:`TrendSettings`) with keyword ``changes``, validated once."""
    if settings is not None and not isinstance(settings, TrendSettings):
        raise SimkitError(f"`settings` must be a simkit.TrendSettings, got {type(settings).__name__}")
    return (settings or TrendSettings()).updated(**changes).validate()


@dataclass
class Series:
    """What a trend run works with: the settings, checkpoints, probe, layers and where to save."""

    settings: TrendSettings
    checkpoints: list[Checkpoint]
    inputs: Batch
    layers: list[str]
    reference_layers: list[str]
    reference_model: nn.Module | None
    device: torch.device
    folder: Path | None

    def activations(self, model: nn.Module, layers: list[str]) -> list[torch.Tensor]:
        """``model``'s probe activations (moved to the device)."""
        model.to(self.device)
        return probe_activations(model, self.inputs, layers, batch_size=self.settings.batch_size,
                                 reduce=self.settings.reduce, device=self.device)

    def reference_checkpoint(self) -> Checkpoint | None:
        """The checkpoint that is the reference (first, final), None for a reference model."""
        reference = self.settings.reference
        return self.checkpoints[0] if reference == "first" else self.checkpoints[-1] if reference == "final" else None


def trend(checkpoints: Any, data: Any, settings: TrendSettings | None = None, *, arch: str | None = None,
          reference_model: nn.Module | None = None, layers: str | Sequence[str] = "blocks",
          reference_layers: str | Sequence[str] | None = None, run_dir: RunDir | str | Path | None = None,
          resume: bool = False, device: str | torch.device = "cpu", progress: bool = True, trust: bool = False,
          data_name: str | None = None, **changes: Any) -> TrendResult:
    """Each checkpoint's layers against the reference on the first ``n`` samples of ``data``.

    checkpoints: a folder, a glob, checkpoint files, or ``{step: module or loader}`` (module docstring).
    data: a Tensor, a dict of tensors, a simkit Dataset, a map-style dataset or a DataLoader.
    settings: :class:`~simkit.settings.monitor.TrendSettings` (keyword ``changes`` replace its fields):
    ``reference`` first, final, or the name of ``reference_model`` (a model spec on the command line).
    arch: the architecture spec of state-dict files; trust: allow pickled files. layers / reference_layers:
    selectors as in ``simkit.compare``. run_dir: a RunDir or path; its ``checkpoints/`` keeps the reference's
    probe activations and each measured checkpoint's rows, so ``resume=True`` continues a killed run.
    Returns a TrendResult (the CLI saves it with its report and figures).
    """
    chosen = trend_settings(settings, changes)
    _check_reference(chosen.reference, reference_model)
    found = find_checkpoints(checkpoints, arch=arch, trust=trust, seed=chosen.seed)
    inputs = probe_inputs(data, chosen.n)
    first = found[0].load()
    selected = resolve_layers(first, layers)
    reference_names = resolve_layers(reference_model if reference_model is not None else first,
                                     layers if reference_layers is None else reference_layers)
    check_pairs(selected, reference_names, chosen.pairs)
    opened = _open_run_dir(run_dir, chosen, found, inputs, reference_model, resume,
                           {"layers": layers, "reference_layers": reference_layers, "arch": arch})
    series = Series(chosen, found, inputs, selected, reference_names, reference_model, resolve_device(device),
                    opened.checkpoints if opened is not None else None)
    started = time.perf_counter()
    if opened is not None:
        opened.start()
    steps = _measure_all(series, progress)
    return trend_result(steps, chosen, layers=selected, reference_layers=reference_names, reference=chosen.reference,
                        model=_series_name(found), data=data_label(data, data_name), probe_samples=batch_rows(inputs),
                        timings={"total": time.perf_counter() - started}, entry="simkit.trend",
                        checkpoints={str(c.step): str(c.path) if c.path else "in memory" for c in found},
                        selectors={"layers": _plain(layers), "reference_layers": _plain(reference_layers)},
                        arch=arch, device=str(series.device), weights=_weights(found, reference_model))


def _check_reference(reference: str, reference_model: nn.Module | None) -> None:
    if reference in TREND_REFERENCES:
        if reference_model is not None:
            raise SimkitError(f"`reference_model` is used only when `reference` names it, not with `reference` "
                              f"{reference}; drop it, or set `reference` to its name")
        return
    if not isinstance(reference_model, nn.Module):
        raise SimkitError(f"`reference` {reference!r} is neither first nor final, so it names a model: pass that "
                          "model as `reference_model` (load a spec with simkit.models.load_model)")


def _open_run_dir(run_dir: RunDir | str | Path | None, settings: TrendSettings, found: list[Checkpoint],
                  inputs: Batch, reference_model: nn.Module | None, resume: bool,
                  own: dict[str, Any]) -> RunDir | None:
    """The run directory (checked, not started): a RunDir as given, a path tied to the inputs."""
    if isinstance(run_dir, RunDir) or run_dir is None:
        if run_dir is None and resume:
            raise SimkitError("`resume` needs `run_dir`: the directory of the run to continue")
        return run_dir
    files = [c.path for c in found if c.path is not None]
    inputs_record = {**settings.to_dict(), **{k: _plain(v) for k, v in own.items()},
                     "checkpoint_steps": [c.step for c in found], "probe": fingerprint(inputs),
                     "reference_model": fingerprint(reference_model) if reference_model is not None else None,
                     "modules": [fingerprint(c.load()) for c in found if c.path is None]}
    return RunDir(run_dir, "trend", inputs_record, files={"checkpoints": files}, resume=resume)


def _measure_all(series: Series, progress: bool) -> pd.DataFrame:
    """Every checkpoint's rows, one checkpoint loaded at a time (rows saved as they are measured)."""
    reference = _reference_acts(series)
    parts = []
    with progress_bar(progress) as bar:
        task = bar.add_task("checkpoints", total=len(series.checkpoints))
        for checkpoint in series.checkpoints:
            parts.append(_rows_of(series, checkpoint, reference))
            bar.advance(task)
    return chosen_pairs(pd.concat(parts, ignore_index=True), series.settings.pairs)


def _reference_acts(series: Series) -> list[torch.Tensor]:
    """The reference's probe activations: read from the run directory's cache, else computed (and cached)."""
    cached = series.folder / _REFERENCE_FILE if series.folder is not None else None
    if cached is not None and cached.is_file():
        return [a.to(series.device) for a in torch.load(cached, map_location="cpu", weights_only=True)]
    checkpoint = series.reference_checkpoint()
    if checkpoint is not None:
        acts = series.activations(checkpoint.load(), series.layers)
    else:
        assert series.reference_model is not None  # _check_reference
        acts = series.activations(series.reference_model, series.reference_layers)
    if cached is not None:
        save_torch(cached, [a.detach().cpu() for a in acts])
    return acts


def _rows_of(series: Series, checkpoint: Checkpoint, reference: list[torch.Tensor]) -> pd.DataFrame:
    """One checkpoint's rows: read back when a killed run saved them, else measured (and saved)."""
    saved = series.folder / f"trend-step-{checkpoint.step:012d}.pt" if series.folder is not None else None
    if saved is not None and saved.is_file():
        return frame_of(torch.load(saved, map_location="cpu", weights_only=True))
    own = series.reference_checkpoint()
    acts = reference if own is not None and own.step == checkpoint.step else \
        series.activations(checkpoint.load(), series.layers)
    rows = measure_step(checkpoint.step, acts, reference, series.layers, series.reference_layers, series.settings)
    if saved is not None:
        save_torch(saved, columns_of(rows))
    return rows


def columns_of(frame: pd.DataFrame) -> dict[str, Any]:
    """A frame as what ``torch.load(weights_only=True)`` reads back exactly: text columns as lists, numbers
    and flags as tensors (float64, int64, bool), in column order."""
    out: dict[str, Any] = {}
    for name in frame.columns:
        column = frame[name]
        if pd.api.types.is_bool_dtype(column) or pd.api.types.is_numeric_dtype(column):
            out[name] = torch.from_numpy(column.to_numpy().copy())
        else:
            out[name] = [str(v) for v in column]
    return out


def frame_of(columns: Mapping[str, Any]) -> pd.DataFrame:
    """The frame :func:`columns_of` saved."""
    return pd.DataFrame({name: (v.numpy() if isinstance(v, torch.Tensor) else list(v)) for name, v in columns.items()})


def _weights(found: list[Checkpoint], reference_model: nn.Module | None) -> dict[str, str]:
    """What the models' weights are, for the report: the checkpoints' (and a reference model's)."""
    where = "checkpoint files" if found[0].path is not None else "modules in memory"
    out = {"checkpoints": f"{len(found)} {where}, steps {found[0].step} to {found[-1].step}"}
    if reference_model is not None:
        out["reference"] = weights_of(reference_model)
    return out


def _series_name(found: list[Checkpoint]) -> str:
    """The series' name in the report: the checkpoints' folder, else "checkpoints"."""
    folders = {str(c.path.parent) for c in found if c.path is not None}
    return folders.pop() if len(folders) == 1 else "checkpoints"


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, str) else list(value)
