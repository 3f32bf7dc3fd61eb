"""The F3 worker process: ``python -m simkit.grafting.f3_worker INPUTS RUN_DIR fresh|resume [HANG_AT]``.

Rebuilds the suite's task from the files the runner wrote into INPUTS (``settings.json``, the initial
model, the data tensors: :func:`simkit.grafting.tasks.save_task`), runs (or resumes) the grafted F3
training in RUN_DIR with the settings' ``threads`` torch threads and writes the per-step losses to
``RUN_DIR/f3_losses.json``. With HANG_AT it blocks at that stage-2 step (after checkpointing as usual)
so the parent can kill it with SIGKILL.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from simkit.grafting.experiments import run_f3_training
from simkit.grafting.tasks import load_task
from simkit.io import write_json
from simkit.settings.graft import GraftSettings


def main(argv: list[str]) -> None:
    """F3 training from ``argv`` = INPUTS RUN_DIR fresh|resume [HANG_AT]; writes RUN_DIR/f3_losses.json."""
    inputs, run_dir, mode = argv[:3]
    hang_at = int(argv[3]) if len(argv) > 3 else None
    folder = Path(inputs)
    settings = GraftSettings(**json.loads((folder / "settings.json").read_text(encoding="utf-8")))
    torch.set_num_threads(settings.threads)
    losses = run_f3_training(load_task(folder), settings, Path(run_dir), resume=(mode == "resume"),
                             hang_at=hang_at)
    write_json(Path(run_dir) / "f3_losses.json", losses)


if __name__ == "__main__":
    main(sys.argv[1:])
