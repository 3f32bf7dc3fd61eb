"""Checkpoint files, RNG states and the per-step metrics log of a training run.

A checkpoint (``run_dir/checkpoints/<name>.pt``, written atomically with ``simkit.io.save_torch``)
holds only tensors and plain Python data, so it loads with ``torch.load(weights_only=True)``:
nothing is unpickled. Keys: version, name, finished, step, epoch, batch_in_epoch, model, optimizer,
controller (plateau/scheduler state), rng (python, numpy, torch, cuda), history, config, graft_log.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from simkit.errors import SimkitError
from simkit.io import atomic_write, save_torch, write_error

CHECKPOINT_VERSION = 1


def checkpoint_path(run_dir: str | Path, name: str) -> Path:
    """Where checkpoint ``name`` lives: ``run_dir/checkpoints/<name>.pt``."""
    return Path(run_dir) / "checkpoints" / f"{name}.pt"


def log_path(run_dir: str | Path, name: str) -> Path:
    """Where run ``name``'s per-step metrics log lives: ``run_dir/<name>.log.csv``."""
    return Path(run_dir) / f"{name}.log.csv"


def rng_state() -> dict[str, Any]:
    """Every RNG state that training can touch: Python, numpy, torch CPU and (if initialised) CUDA."""
    version, internal, gauss = random.getstate()
    # legacy=True always gives the tuple; numpy's stubs type the result as tuple | dict
    numpy_state = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state(legacy=True))
    kind, keys, pos, has_gauss, cached = numpy_state
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    npst = state["numpy"]
    np.random.set_state((npst["kind"], npst["keys"].numpy().astype(np.uint32), npst["pos"],
                         npst["has_gauss"], npst["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` atomically (a reader never sees a half-written file)."""
    return save_torch(path, {"version": CHECKPOINT_VERSION, **payload})


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors and plain data only, no pickle)."""
    path = Path(path)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise SimkitError(f"no checkpoint at {path}; run without `resume` first") from None
    except Exception as exc:  # a corrupt or foreign file
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")[:160]
        raise SimkitError(f"{path} is not a readable simkit checkpoint ({type(exc).__name__}: {first}); "
                          "delete it and rerun without `resume`") from None
    if not isinstance(data, dict) or data.get("version") != CHECKPOINT_VERSION:
        raise SimkitError(f"{path} is not a simkit checkpoint of version {CHECKPOINT_VERSION}; "
                          "delete it and rerun without `resume`")
    return data


class MetricsLog:
    """``<name>.log.csv``: one row per step (step, loss, lr by default), appended and flushed as it runs.

    On resume the rows after the checkpoint's step are dropped (those steps are redone), so the file
    always matches the run's history.
    """

    HEADER = ("step", "loss", "lr")

    def __init__(self, path: Path | None, *, keep_until: int | None, columns: tuple[str, ...] = HEADER) -> None:
        self.path, self.columns = path, tuple(columns)
        self._file = None
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        rows: list[list[str]] = []
        if keep_until is not None and path.is_file():
            with path.open(newline="", encoding="utf-8") as fh:
                reader = csv.reader(fh)
                next(reader, None)
                rows = [row for row in reader if row and int(row[0]) <= keep_until]
        def rewrite(tmp: Path) -> None:
            with tmp.open("w", newline="", encoding="utf-8") as fh:
                writer = csv.writer(fh)
                writer.writerow(self.columns)
                writer.writerows(rows)

        atomic_write(path, rewrite)  # the kept rows, atomically: a full disk leaves the old log whole
        try:
            self._file = path.open("a", newline="", encoding="utf-8")
        except OSError as exc:
            raise write_error(path, exc) from None
        self._writer = csv.writer(self._file)

    def write(self, step: int, *values: float) -> None:
        """One row: the step, then one value per remaining column (floats written exactly, via repr). A
        failed append (a full disk) is a :class:`~simkit.io.WriteError` naming the log; the checkpoint
        before it is intact and a resume drops the rows after it."""
        if self._file is None:
            return
        try:
            self._writer.writerow([step, *(repr(v) for v in values)])
            self._file.flush()
        except OSError as exc:
            raise write_error(self.path or "the training log", exc) from None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
