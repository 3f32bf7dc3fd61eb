"""Similarity during training: ``Monitor`` for any training loop, ``trend`` for a series of checkpoints, and
the trackers they log to.

- ``Monitor(model, probe, MonitorSettings(...), layers=..., run_dir=..., trackers=...)``: ``step(global_step)``
  measures every ``every`` steps, ``close()`` returns a ``TrendResult`` (``simkit.monitor.monitor``);
- ``trend(checkpoints, data, TrendSettings(...), ...)`` → ``TrendResult``: every checkpoint's layers against
  the first, the final or a reference model, one checkpoint at a time, resumable (``simkit.monitor.series``);
- trackers (``simkit.monitor.trackers``): ``TensorBoardTracker``, ``MLflowTracker``, ``WandbTracker``;
- ``simkit.monitor.lightning.SimilarityCallback``: the monitor as a Lightning callback (imports lightning,
  so it is not imported here).
"""

from __future__ import annotations

from simkit.monitor.monitor import Monitor
from simkit.monitor.series import trend
from simkit.monitor.trackers import MLflowTracker, TensorBoardTracker, Tracker, WandbTracker
from simkit.settings.monitor import MonitorSettings, TrendSettings

__all__ = ["MLflowTracker", "Monitor", "MonitorSettings", "TensorBoardTracker", "Tracker", "TrendSettings",
           "WandbTracker", "trend"]
