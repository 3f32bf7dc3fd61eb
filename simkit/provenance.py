"""What every run directory records about how it was made: command, versions, seeds, timings, and what
the models' weights were (:func:`weights_of`, :func:`weights_words`)."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch stays off the import path of the base (the CLI's --help)
    from torch import nn


def _simkit_version() -> str:
    """The installed distribution's version (what ``simkit.__version__`` says), read without importing
    the ``simkit`` package root: the base imports nothing above itself."""
    try:
        return importlib.metadata.version("simkit")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def versions() -> dict[str, str]:
    """Versions of Python and of the packages that shape the numbers."""
    import numpy  # slow imports, kept off the CLI's fast path (--help)
    import torch

    out = {"python": platform.python_version(), "simkit": _simkit_version(),
           "torch": torch.__version__, "numpy": numpy.__version__}
    for name in ("torchvision", "timm", "transformers", "pandas"):
        module = sys.modules.get(name)
        if module is not None:
            out[name] = getattr(module, "__version__", "?")
    return out


def run_meta(**fields: Any) -> dict[str, Any]:
    """The standard ``meta`` block of a result: the command line, versions, time, plus ``fields``."""
    from simkit.distributed import world_size

    return {
        "command": list(sys.argv),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "world_size": world_size(),
        **fields,
    }


class Timer:
    """Collects named wall-clock durations in seconds: ``with timer("forward"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def weights_of(model: nn.Module) -> str:
    """What a model's weights are, for reports: "random init, seed 0", the weights file, "pretrained
    (the hf: directory)" (from ``simkit.models.load_model``), else "as given (a module simkit did not load)"."""
    weights = getattr(model, "simkit_weights", None)
    if not isinstance(weights, str):
        return "as given (a module simkit did not load)"
    seed = getattr(model, "simkit_seed", None)
    return f"{weights}, seed {seed}" if weights == "random init" and isinstance(seed, int) else weights


def weights_words(model: nn.Module, epochs: float = 0, seeds: int = 1) -> str:
    """:func:`weights_of` for a runner's report: the (first seed's) model's weights, "(the first of N
    seeds …)" when each seed builds its own, then ", then trained here for E epochs" when the run did."""
    words = weights_of(model) + (f" (the first of {seeds} seeds, each built with its own)" if seeds > 1 else "")
    return f"{words}, then trained here for {epochs:g} epoch{'' if epochs == 1 else 's'}" if epochs > 0 else words
