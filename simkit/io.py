"""Atomic file writing: every file simkit writes goes to a temporary name and is renamed into place,
so an interrupted run never leaves a half-written file behind."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simkit.errors import SimkitError

_UMASK = os.umask(0)
os.umask(_UMASK)


class WriteError(SimkitError, OSError):
    """A file could not be written (a full disk, a quota, a file too large, no permission): a SimkitError
    (one line, exit 2) that is also an OSError, so that code which tolerates a failed write (a cache)
    still does. ``errno``, ``strerror`` and ``filename`` are those of the OSError met."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "cannot write a file"


# what to do about a failed write, by errno
_FIXES = {
    errno.ENOSPC: "free space on that disk (or choose another place) and run again",
    errno.EDQUOT: "free space within your disk quota (or choose another place) and run again",
    errno.EFBIG: "the file system takes no file that large: choose another place and run again",
    errno.EACCES: "make the folder writable (or choose another place) and run again",
    errno.EROFS: "the file system is read-only: choose another place and run again",
}


def write_error(path: str | Path, exc: OSError) -> WriteError:
    """The one-line error of a failed write of ``path``: the file, the cause, the fix; earlier files are
    as they were (every write is atomic)."""
    cause = exc.strerror or type(exc).__name__
    code = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    fix = _FIXES.get(exc.errno or 0, "check the disk and the folder, then run again")
    error = WriteError(f"cannot write {path}: {cause}{f' ({code})' if code else ''}; the files written before "
                       f"are intact; {fix} (a training run continues from its last checkpoint with `resume`)")
    error.errno, error.strerror, error.filename = exc.errno, exc.strerror, str(path)
    return error


def _fill(write: Callable[[Path], object], tmp: Path) -> None:
    """Write the temporary file (the one place a write can meet a full disk; tests inject faults here)."""
    write(tmp)


#: the suffix of a staged file (a complete file written for a later rename; an interrupted save leaves it)
STAGED = ".staged"


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp_path)`` then rename ``tmp_path`` onto ``path`` (same directory, atomic).

    Any failure removes the temporary file, so ``path`` holds either its earlier bytes or the new ones
    in full. An OSError (a full disk: ENOSPC, EDQUOT, EFBIG; no permission) is raised as a
    :class:`WriteError` naming ``path`` and the cause."""
    path = Path(path)
    tmp = stage(path, write, suffix=".tmp")
    try:
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(path, exc) from None
    return path


def stage(path: str | Path, write: Callable[[Path], object], suffix: str = STAGED) -> Path:
    """Call ``write(tmp_path)`` on a new file beside ``path`` (``.<name>.<random><suffix>``) and return it,
    complete, for the caller to rename onto ``path`` (``RunResult.save`` commits a set of them together).
    Any failure removes it; an OSError is raised as a :class:`WriteError` naming ``path``."""
    path = Path(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
        tmp = Path(name)
        os.close(fd)
        _fill(write, tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
    except BaseException as exc:
        if tmp is not None:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise write_error(path, exc) from None
        raise
    return tmp


def file_sha256(path: str | Path) -> str | None:
    """Hex sha256 of a file's bytes (None when there is no such file)."""
    path = Path(path)
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns ``path``."""
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` (through :func:`to_jsonable`, indented) to ``path`` atomically."""
    return write_text(path, json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n")


def write_csv(path: str | Path, frame) -> Path:
    """Write a pandas DataFrame as CSV without its index."""
    return atomic_write(path, lambda p: frame.to_csv(p, index=False))


def stage_csv(path: str | Path, frame) -> Path:
    """A DataFrame as CSV without its index, staged for ``path`` (:func:`stage`)."""
    return stage(path, lambda p: frame.to_csv(p, index=False))


class _Sink:
    """A binary file for ``torch.save`` that remembers the OSError its writes met: torch reports a full
    disk as a RuntimeError ("unexpected pos", "iostream error") that no longer says why."""

    def __init__(self, handle: Any):
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.handle.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.handle.flush()


def save_torch(path: str | Path, obj: Any) -> Path:
    """``torch.save(obj)`` to ``path`` atomically (a full disk is a :class:`WriteError`, as for every write)."""
    import torch

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            sink = _Sink(handle)
            try:
                torch.save(obj, sink)  # type: ignore[arg-type]
            except RuntimeError:
                if sink.error is not None:
                    raise sink.error from None
                raise

    return atomic_write(path, write)


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
