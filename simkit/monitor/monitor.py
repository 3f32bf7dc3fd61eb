"""``simkit.Monitor``: similarity of a model under training to a reference, every ``every`` steps, in
any training loop::

    monitor = simkit.Monitor(model, probe, layers="blocks", every=100, run_dir="runs/sim",
                             trackers=["tensorboard"])           # reference="first" by default
    for step, batch in enumerate(loader):
        ...                                                      # the user's training step
        monitor.step(step)                                       # measures when step % every == 0
    result = monitor.close()                                     # a TrendResult: report, figures, steps.csv

Each measurement records the chosen layers' outputs on the fixed probe set in eval mode under
``no_grad`` (``simkit.monitor.probe``: modes, grad mode and random generators restored, hooks removed),
compares them with the reference's through the engine's accumulator (``simkit.monitor.measure``: every
value with its chance level) and sends the rows to the run directory's ``steps.csv`` and the trackers.

References: ``first`` (the model's own probe activations at the first measured step), ``final`` (the
activations of every measured step are kept, in ``run_dir/activations/`` when there is a run directory,
else in memory, and compared with the last step's at :meth:`Monitor.close`, as SVCCA does; the trackers
get those values then, at their steps), ``fixed`` (``reference_model``, measured once) and ``alongside``
(``reference_model``, a second model in training, measured at every step). The monitor measures in the
process that calls it: under DDP call it on rank 0 only (the Lightning callback does), it uses no
collective operation.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from simkit.engine.batches import data_label
from simkit.errors import SimkitError
from simkit.forward import Batch, batch_rows
from simkit.io import save_torch
from simkit.layers import resolve_layers
from simkit.metrics.streaming.minibatch import GramMemo
from simkit.monitor.measure import check_pairs, chosen_pairs, measure_step
from simkit.monitor.outputs import StepsTable, matrix_png, scalars_of
from simkit.monitor.probe import model_device, probe_activations, probe_inputs
from simkit.monitor.result import trend_result
from simkit.monitor.trackers import make_trackers
from simkit.provenance import weights_of
from simkit.results import TrendResult
from simkit.rundir import check_run_path, release_lock, take_lock
from simkit.settings.monitor import MonitorSettings

Acts = list[torch.Tensor]


def monitor_settings(settings: MonitorSettings | None, changes: dict[str, Any]) -> MonitorSettings:
    """``settings`` (default :class:`MonitorSettings`) with keyword ``changes`` applied, validated once."""
    if settings is not None and not isinstance(settings, MonitorSettings):
        raise SimkitError(f"`settings` must be a simkit.MonitorSettings, got {type(settings).__name__}")
    return (settings or MonitorSettings()).updated(**changes).validate()


def check_reference(reference: str, reference_model: nn.Module | None) -> None:
    """A reference model is given exactly when the reference is ``fixed`` or ``alongside``."""
    needs = reference in ("fixed", "alongside")
    if needs and not isinstance(reference_model, nn.Module):
        raise SimkitError(f"`reference` {reference} compares with `reference_model`; pass the nn.Module to compare "
                          "with (or use `reference` first or final)")
    if not needs and reference_model is not None:
        raise SimkitError(f"`reference_model` is compared with only when `reference` is fixed or alongside, got "
                          f"`reference` {reference}; drop it or choose one of those")


class ActivationStore:
    """The probe activations of every measured step (reference ``final``): files in ``folder`` (removed by
    :meth:`clear`), else CPU memory."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.steps: list[int] = []
        self.kept: dict[int, Acts] = {}

    def add(self, step: int, acts: Acts) -> None:
        """Keep step ``step``'s activations."""
        cpu = [a.detach().cpu() for a in acts]
        if self.folder is not None:
            save_torch(self.folder / f"step-{step:012d}.pt", cpu)
        else:
            self.kept[step] = cpu
        self.steps.append(step)

    def get(self, step: int) -> Acts:
        """Step ``step``'s activations (CPU)."""
        if self.folder is None:
            return self.kept[step]
        return torch.load(self.folder / f"step-{step:012d}.pt", map_location="cpu", weights_only=True)

    def clear(self) -> None:
        """Forget every step (and remove the folder)."""
        self.steps, self.kept = [], {}
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


class Monitor:
    """Similarity of ``model``'s layers to a reference on a fixed probe set while it trains.

    model: the nn.Module under training. probe: a Tensor (N, ...), a dict of tensors, a simkit ``Dataset``,
    a map-style dataset or a DataLoader; its first ``n`` samples (default 512) are taken once.
    settings: :class:`~simkit.settings.monitor.MonitorSettings`; keyword ``changes`` replace its fields
    (``Monitor(model, x, every=50, metrics=["unbiased_cka", "linear_cka"])``); ``reference=`` an nn.Module is
    ``reference="fixed"`` with that module. layers / reference_layers: selectors as in ``simkit.compare``
    (names, globs, ``type:Class``, ``blocks``; reference_layers default to ``layers``). reference_model:
    the model of reference ``fixed`` or ``alongside``. run_dir: where ``steps.csv`` (after every
    measurement), then ``result.json``, ``report.html``, ``steps.parquet`` (with pyarrow) and
    ``figures/`` (at :meth:`close`) go; None: nowhere. trackers: names (``tensorboard``, ``mlflow``,
    ``wandb``) or tracker objects (``simkit.monitor.trackers``). figures: formats of the figure files.
    """

    def __init__(self, model: nn.Module, probe: Any, settings: MonitorSettings | None = None, *,
                 layers: str | Sequence[str] = "blocks", reference_model: nn.Module | None = None,
                 reference_layers: str | Sequence[str] | None = None, run_dir: str | Path | None = None,
                 trackers: Sequence[Any] | str | None = None, report: bool = True,
                 figures: Sequence[str] = ("png", "svg"), data_name: str | None = None, **changes: Any) -> None:
        if isinstance(changes.get("reference"), nn.Module):
            reference_model, changes["reference"] = changes["reference"], "fixed"
        if not isinstance(model, nn.Module):
            raise SimkitError(f"`model` must be an nn.Module, got {type(model).__name__}")
        self.settings = monitor_settings(settings, changes)
        check_reference(self.settings.reference, reference_model)
        self.model, self.reference_model = model, reference_model
        self.layers = resolve_layers(model, layers)
        self.reference_layers = resolve_layers(reference_model if reference_model is not None else model,
                                               layers if reference_layers is None else reference_layers)
        check_pairs(self.layers, self.reference_layers, self.settings.pairs)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        if self.run_dir is not None:
            check_run_path(self.run_dir)
        self.inputs: Batch = probe_inputs(probe, self.settings.n)
        self.data = data_label(probe, data_name)
        self.selectors = {"layers": layers, "reference_layers": reference_layers}
        self.report, self.figures = report, tuple(figures)
        self.trackers = make_trackers(trackers, self.run_dir)
        self.table = StepsTable(self.run_dir)
        self.store = ActivationStore(self.run_dir / "activations" if self.run_dir is not None else None)
        self._reference: Acts | None = None
        self._memo: GramMemo | None = None
        self._last_step: int | None = None
        self._seconds = 0.0
        self._locked = False
        self.result: TrendResult | None = None

    # ----------------------------------------------------------------------------------------- measuring
    @property
    def last_step(self) -> int | None:
        """The step of the last measurement (None before the first)."""
        return self._last_step

    def due(self, global_step: int) -> bool:
        """Whether :meth:`step` measures at ``global_step`` (every ``every`` steps, once per step)."""
        return global_step % self.settings.every == 0 and global_step != self._last_step

    def step(self, global_step: int) -> pd.DataFrame | None:
        """Measure when ``global_step`` is a multiple of ``every`` (once per step): the rows logged (None
        when not measured, or with reference ``final``, whose values come at :meth:`close`)."""
        return self.measure(global_step) if self.due(int(global_step)) else None

    def measure(self, global_step: int) -> pd.DataFrame | None:
        """Measure now, at training step ``global_step`` (see :meth:`step`)."""
        if self.result is not None:
            raise SimkitError("this Monitor is closed; make a new one to measure again")
        started = time.perf_counter()
        step = int(global_step)
        self._last_step = step
        acts = self._activations(self.model, self.layers)
        rows = None
        if self.settings.reference == "final":
            self._hold()
            self.store.add(step, acts)
        else:
            reference = self._reference_acts(acts)
            rows = self._record(measure_step(step, acts, reference, self.layers, self.reference_layers,
                                             self.settings, self._memo))
        self._seconds += time.perf_counter() - started
        return rows

    def _activations(self, model: nn.Module, layers: list[str]) -> Acts:
        return probe_activations(model, self.inputs, layers, batch_size=self.settings.batch_size,
                                 reduce=self.settings.reduce)

    def _reference_acts(self, acts: Acts) -> Acts:
        """The reference's activations at this step (first: this step's, once; fixed: once; alongside: now)."""
        reference = self.settings.reference
        if reference == "alongside" or self._reference is None:
            if reference == "first":
                self._reference = [a.clone() for a in acts]
            else:
                assert self.reference_model is not None  # check_reference
                self._reference = self._activations(self.reference_model, self.reference_layers)
            self._memo = None if reference == "alongside" else GramMemo()  # a fixed reference's Grams, once
        device = model_device(self.model)
        return [r.to(device) for r in self._reference]

    def _record(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Keep a step's rows, write them, send them to the trackers."""
        self._hold()
        rows = chosen_pairs(frame, self.settings.pairs)
        self.table.add(rows)
        if self.trackers:
            step = int(frame["step"].iloc[0])
            images = {f"matrix/{metric}": matrix_png(frame, metric, step)
                      for metric in dict.fromkeys(frame["metric"])} if self.settings.images else {}
            scalars = scalars_of(rows)
            for tracker in self.trackers:
                tracker.log(step, scalars, images)
        return rows

    def _hold(self) -> None:
        """Make the run directory this monitor's before its first write (its lock, until :meth:`close`)."""
        if self.run_dir is not None and not self._locked:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            take_lock(self.run_dir, "monitor")
            self._locked = True

    # ----------------------------------------------------------------------------------------- the end
    def close(self) -> TrendResult:
        """Finish: compare the stored steps with the last one (reference ``final``), write the run directory
        (``result.json``, the tables, ``report.html``, ``figures/``), close the trackers; the result."""
        if self.result is not None:
            return self.result
        if self.settings.reference == "final":
            self._compare_with_final()
        if self.table.frame().empty:
            self.abort()
            raise SimkitError(f"the monitor measured nothing: no step was a multiple of `every` "
                              f"({self.settings.every}); lower `every` or call measure(step) yourself")
        result = trend_result(self.table.frame(), self.settings, layers=self.layers,
                              reference_layers=self.reference_layers, reference=self.settings.reference,
                              model=_model_name(self.model), data=self.data, probe_samples=batch_rows(self.inputs),
                              timings={"monitor": self._seconds}, entry="simkit.Monitor",
                              selectors=_plain_selectors(self.selectors), weights=self._weights())
        self._save(result)
        self.result = result
        self._release()
        return result

    def _weights(self) -> dict[str, str]:
        """What the models' weights are, for the report: the model's start, then trained; the reference's."""
        out = {"model": f"{weights_of(self.model)}, measured while it trained"}
        if self.reference_model is not None:
            trained = ", trained alongside" if self.settings.reference == "alongside" else ""
            out["reference"] = weights_of(self.reference_model) + trained
        return out

    def _compare_with_final(self) -> None:
        if not self.store.steps:
            return
        started = time.perf_counter()
        device = model_device(self.model)
        final = [a.to(device) for a in self.store.get(self.store.steps[-1])]
        memo = GramMemo()
        for step in self.store.steps:
            acts = [a.to(device) for a in self.store.get(step)]
            self._record(measure_step(step, acts, final, self.layers, self.layers, self.settings, memo))
        self.store.clear()
        self._seconds += time.perf_counter() - started

    def _save(self, result: TrendResult) -> None:
        run_dir = self.run_dir
        if run_dir is None or not len(result.tables["steps"]):
            return
        from simkit.report import save_run

        self._hold()
        if self.figures and self.report:  # the report's own figures, kept while it renders: built once
            from simkit.plotting import parse_formats, write_figures
            from simkit.report.figures import collect_figures

            _, figures = collect_figures(lambda: save_run(result, run_dir, report=True))
            write_figures(figures, run_dir / "figures", parse_formats(self.figures))
        else:
            save_run(result, run_dir, report=self.report)
            if self.figures:
                result.savefig(run_dir / "figures", formats=self.figures)
        self.table.finish()

    def _release(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []
        if self._locked and self.run_dir is not None:
            release_lock(self.run_dir)
            self._locked = False

    def abort(self) -> None:
        """End without a result: close the trackers, drop stored activations, release the run directory."""
        self.store.clear()
        self._release()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, kind: Any, *rest: Any) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def _model_name(model: nn.Module) -> str:
    spec = getattr(model, "simkit_spec", None)
    return spec if isinstance(spec, str) else type(model).__name__


def _plain_selectors(selectors: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if v is None or isinstance(v, str) else list(v)) for k, v in selectors.items()}
