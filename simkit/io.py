"""Atomic file writing: every file simkit writes goes to a temporary name and is renamed into place,
so an interrupted run never leaves a half-written file behind."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp_path)`` then rename ``tmp_path`` onto ``path`` (same directory, atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns ``path``."""
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` (through :func:`to_jsonable`, indented) to ``path`` atomically."""
    return write_text(path, json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n")


def write_csv(path: str | Path, frame) -> Path:
    """Write a pandas DataFrame as CSV without its index."""
    return atomic_write(path, lambda p: frame.to_csv(p, index=False))


def save_torch(path: str | Path, obj: Any) -> Path:
    """``torch.save(obj)`` to ``path`` atomically."""
    import torch

    return atomic_write(path, lambda p: torch.save(obj, p))


def to_jsonable(obj: Any) -> Any:
    """Convert numpy/torch scalars and arrays, tuples and Paths into plain JSON types.

    NaN and ±inf become ``null``: strict JSON has no such numbers, and other tools read these files.
    """
    import numpy as np

    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if hasattr(obj, "detach") and hasattr(obj, "tolist"):  # torch.Tensor
        return to_jsonable(obj.detach().cpu().tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
