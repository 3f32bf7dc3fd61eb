"""``SimilarityCallback``: ``simkit.Monitor`` as a Lightning callback (needs ``lightning``: the
``simkit[lightning]`` extra; this module imports it, ``simkit.monitor`` does not)::

    trainer = L.Trainer(callbacks=[SimilarityCallback(probe, layers="net.blocks.*", every=50,
                                                      run_dir="runs/sim")], logger=TensorBoardLogger(...))

It measures the LightningModule at the start of training (its step 0), every ``every`` global steps
(``on_train_batch_end``), at the end of every validation epoch (``when="validation"`` or ``"both"``) and at
the end of training, and logs each value and its chance level through the trainer's loggers (TensorBoard,
MLflow, W&B, CSV: ``log_metrics``; the matrix image where the logger takes images), plus ``steps.csv``,
the report and figures in ``run_dir`` and any other ``trackers``.

Under DDP (or any multi-process strategy) the monitor lives and measures on global rank 0 only, on that
rank's replica of the module, which holds the same weights as every other after each optimizer step; the
other ranks do nothing, and no collective operation is made, so it cannot hang or desynchronise them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as exc:  # the optional extra
    from simkit.errors import SimkitError

    raise SimkitError("lightning is not installed; pip install lightning (or simkit[lightning]) to use "
                      "SimilarityCallback") from exc

from simkit.errors import SimkitError
from simkit.monitor.monitor import Monitor
from simkit.monitor.trackers import png_array
from simkit.results import TrendResult
from simkit.settings.monitor import MonitorSettings

WHEN = ("train", "validation", "both")


class LoggerTracker:
    """The trainer's loggers as one tracker: scalars through ``log_metrics``, images where the logger takes
    them (TensorBoard's ``add_image``, MLflow artifacts, W&B's ``log_image``)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def log(self, step: int, scalars: Mapping[str, float], images: Mapping[str, bytes]) -> None:
        for logger in self.trainer.loggers:
            logger.log_metrics(dict(scalars), step=step)
            for tag, png in images.items():
                log_image(logger, tag, png, step)

    def close(self) -> None:
        for logger in self.trainer.loggers:
            logger.save()


def log_image(logger: Any, tag: str, png: bytes, step: int) -> None:
    """One image into ``logger`` when it takes images (else nothing)."""
    experiment = logger.experiment
    if hasattr(experiment, "add_image"):  # TensorBoard's SummaryWriter
        experiment.add_image(tag, png_array(png), global_step=step, dataformats="HWC")
    elif hasattr(logger, "run_id") and hasattr(experiment, "log_artifact"):  # MLflow's client
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / f"{tag.rsplit('/', 1)[-1]}_step{int(step):08d}.png"
            path.write_bytes(png)
            experiment.log_artifact(logger.run_id, str(path), artifact_path="similarity")
    elif hasattr(logger, "log_image"):  # W&B
        logger.log_image(key=tag, images=[(png_array(png)[..., :3] * 255).astype("uint8")], step=step)


class SimilarityCallback(pl.Callback):
    """Similarity of the LightningModule's layers to a reference while it trains (module docstring).

    probe, settings, layers, reference_model, reference_layers, run_dir, trackers, report, figures and keyword
    ``changes``: as ``simkit.Monitor`` takes them. when: ``train`` (every ``every`` global steps), ``validation``
    (at the end of each validation epoch) or ``both``. loggers: also log through the trainer's loggers.
    After ``fit``, :attr:`result` is the run's TrendResult (on rank 0; None elsewhere).
    """

    def __init__(self, probe: Any, settings: MonitorSettings | None = None, *, layers: str | Sequence[str] = "blocks",
                 reference_model: Any = None, reference_layers: str | Sequence[str] | None = None,
                 run_dir: str | Path | None = None, trackers: Sequence[Any] | str | None = None, when: str = "train",
                 loggers: bool = True, report: bool = True, figures: Sequence[str] = ("png", "svg"),
                 **changes: Any) -> None:
        if when not in WHEN:
            raise SimkitError(f"`when` must be one of {', '.join(WHEN)}, got {when!r}")
        self.probe, self.when, self.loggers = probe, when, loggers
        self.options = {"settings": settings, "layers": layers, "reference_model": reference_model,
                        "reference_layers": reference_layers, "run_dir": run_dir, "report": report,
                        "figures": figures, **changes}
        self.trackers = trackers
        self.monitor: Monitor | None = None
        self.result: TrendResult | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Build the monitor on global rank 0 when fitting starts."""
        if stage != "fit" or not trainer.is_global_zero or self.monitor is not None:
            return
        trackers = list([self.trackers] if isinstance(self.trackers, str) else self.trackers or [])
        if self.loggers:
            trackers.append(LoggerTracker(trainer))
        self.monitor = Monitor(pl_module, self.probe, trackers=trackers, **self.options)

    def _measure(self, trainer: Any) -> None:
        if self.monitor is not None and self.monitor.last_step != trainer.global_step:
            self.monitor.measure(trainer.global_step)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._measure(trainer)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.monitor is not None and self.when != "validation":
            self.monitor.step(trainer.global_step)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.when != "train" and not trainer.sanity_checking:
            self._measure(trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._measure(trainer)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self.result = self.monitor.close()
            self.monitor = None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.monitor is not None:
            self.monitor.abort()
            self.monitor = None
