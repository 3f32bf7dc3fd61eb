"""Where a monitor's numbers go besides its run directory: TensorBoard, MLflow, Weights & Biases.

A tracker has ``log(step, scalars, images)`` (``scalars``: ``{tag: float}``, ``images``: ``{tag: PNG
bytes}``, the layer × layer matrix of each measure) and ``close()``. Each is an optional extra, imported
only when used (``pip install 'simkit[tensorboard]'``, ``[mlflow]``, ``[wandb]``); a missing package is a
SimkitError saying what to install. Tags: ``similarity/<metric>/<layer>`` and ``chance/<metric>/<layer>``
(``<layer>~<reference layer>`` when the pair's names differ), images ``matrix/<metric>``.

- :class:`TensorBoardTracker` (``log_dir``): a scalar per layer pair and its chance level, the matrix as an
  image, through ``torch.utils.tensorboard.SummaryWriter`` (needs the ``tensorboard`` package);
- :class:`MLflowTracker`: metrics (``log_batch``) and the matrix figure as an artifact
  (``similarity/<metric>_step<step>.png``) into the active MLflow run, a given ``run_id``, or a run it
  starts (and ends) in ``experiment``; ``tracking_uri`` as MLflow takes it (a ``file:`` store needs
  ``MLFLOW_ALLOW_FILE_STORE=true`` from MLflow 3.7 on);
- :class:`WandbTracker`: ``run.log`` into the active W&B run or one it starts with ``init`` keywords
  (``mode="offline"`` works without network); steps go to the ``simkit/step`` axis, so the steps of a
  ``final`` reference, logged at the end, are kept although W&B's own step has moved on.
"""

from __future__ import annotations

import io
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from simkit.errors import SimkitError, unknown_name_error

#: the tracker names ``trackers=`` takes besides tracker objects
TRACKER_NAMES = ("tensorboard", "mlflow", "wandb")


@runtime_checkable
class Tracker(Protocol):
    """What a monitor sends its measurements to."""

    def log(self, step: int, scalars: Mapping[str, float], images: Mapping[str, bytes]) -> None:
        """Record ``scalars`` and ``images`` (PNG bytes) at training step ``step``."""

    def close(self) -> None:
        """Flush and release what the tracker holds."""


def missing(package: str, extra: str) -> SimkitError:
    """The one message for an optional package that is not installed."""
    return SimkitError(f"{package} is not installed; pip install '{package}' (or simkit[{extra}]) to log there")


def png_array(png: bytes) -> Any:
    """PNG bytes as an (H, W, C) float array in [0, 1]."""
    from matplotlib import image

    return image.imread(io.BytesIO(png), format="png")


class TensorBoardTracker:
    """Scalars and matrix images into TensorBoard event files under ``log_dir``."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise missing("tensorboard", "tensorboard") from None
        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, step: int, scalars: Mapping[str, float], images: Mapping[str, bytes]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=step)
        for tag, png in images.items():
            self.writer.add_image(tag, png_array(png), global_step=step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


_MLFLOW_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


def mlflow_key(tag: str) -> str:
    """``tag`` with the characters MLflow refuses in a metric name replaced by ``_``."""
    return _MLFLOW_KEY.sub("_", tag)


class MLflowTracker:
    """Metrics and matrix figures (artifacts) into an MLflow run: ``run_id``, else the active run, else a
    run started in ``experiment`` (default: MLflow's default experiment) and ended by :meth:`close`."""

    def __init__(self, run_id: str | None = None, *, tracking_uri: str | None = None,
                 experiment: str | None = None, run_name: str | None = None) -> None:
        try:
            import mlflow
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise missing("mlflow", "mlflow") from None
        self.client = MlflowClient(tracking_uri=tracking_uri)
        active = mlflow.active_run() if run_id is None and tracking_uri is None else None
        self.started = run_id is None and active is None
        if run_id is None:
            run_id = active.info.run_id if active is not None else self._new_run(experiment, run_name)
        self.run_id = run_id

    def _new_run(self, experiment: str | None, run_name: str | None) -> str:
        experiment_id = "0"
        if experiment is not None:
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        return self.client.create_run(experiment_id, run_name=run_name).info.run_id

    def log(self, step: int, scalars: Mapping[str, float], images: Mapping[str, bytes]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(tag), float(value), stamp, int(step)) for tag, value in scalars.items()]
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])
        with tempfile.TemporaryDirectory() as folder:
            for tag, png in images.items():
                path = Path(folder) / f"{tag.rsplit('/', 1)[-1]}_step{int(step):08d}.png"
                path.write_bytes(png)
                self.client.log_artifact(self.run_id, str(path), artifact_path="similarity")

    def close(self) -> None:
        if self.started:
            self.client.set_terminated(self.run_id)


class WandbTracker:
    """Scalars and matrix images into a W&B run: ``run``, else the active one, else ``wandb.init(**init)``
    (finished by :meth:`close`)."""

    STEP = "simkit/step"

    def __init__(self, run: Any = None, **init: Any) -> None:
        try:
            import wandb
        except ImportError:
            raise missing("wandb", "wandb") from None
        self.wandb = wandb
        self.started = run is None and wandb.run is None
        self.run = run or wandb.run or wandb.init(**init)
        self.run.define_metric(self.STEP)
        for prefix in ("similarity", "chance", "matrix"):
            self.run.define_metric(f"{prefix}/*", step_metric=self.STEP)

    def log(self, step: int, scalars: Mapping[str, float], images: Mapping[str, bytes]) -> None:
        pictures = {tag: self.wandb.Image((png_array(png)[..., :3] * 255).astype("uint8"))
                    for tag, png in images.items()}
        self.run.log({**scalars, **pictures, self.STEP: int(step)})

    def close(self) -> None:
        if self.started:
            self.run.finish()


def make_trackers(trackers: Sequence[Any] | str | None, run_dir: Path | None) -> list[Any]:
    """Tracker objects from ``trackers``: objects with ``log``/``close`` as they are, and the names
    ``tensorboard`` (event files in ``run_dir/tensorboard``), ``mlflow`` (the active MLflow run, else a new
    one) and ``wandb`` (the active W&B run, else a new one)."""
    if trackers is None:
        return []
    given = [trackers] if isinstance(trackers, str) else list(trackers)
    out = []
    for tracker in given:
        if not isinstance(tracker, str):
            if not isinstance(tracker, Tracker):
                raise SimkitError(f"`trackers`: a {type(tracker).__name__} has no log(step, scalars, images) and "
                                  f"close(); pass one of {', '.join(TRACKER_NAMES)} or a tracker object")
            out.append(tracker)
        elif tracker == "tensorboard":
            if run_dir is None:
                raise SimkitError("`trackers` tensorboard writes into `run_dir`/tensorboard; pass `run_dir`, or "
                                  "TensorBoardTracker(log_dir)")
            out.append(TensorBoardTracker(run_dir / "tensorboard"))
        elif tracker == "mlflow":
            out.append(MLflowTracker())
        elif tracker == "wandb":
            out.append(WandbTracker())
        else:
            raise unknown_name_error("tracker", tracker, TRACKER_NAMES, "or pass a tracker object")
    return out
