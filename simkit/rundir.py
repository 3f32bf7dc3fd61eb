"""The run directory of a resumable run, tied to the inputs that made it (``<path>/inputs.json``).

``RunDir(path, command, inputs, files=..., resume=...)`` only *checks*: that ``path`` can be a run
directory, that a resume has the same inputs as the run it continues, that a fresh run would not
discard checkpoints of unknown origin. It touches nothing, so a run that fails its own checks
afterwards leaves an earlier run in ``path`` byte-identical. ``start()`` is the first write: a fresh
run then removes the earlier run's ``checkpoints/`` (they must never be resumed into the new run) and
writes ``inputs.json`` (rank 0, atomically); a resume writes nothing. Runners call ``start()`` once
their own inputs are validated, right before the first work.

A started run directory belongs to one run at a time: ``start()`` takes an exclusive lock
(``fcntl.flock`` on ``<path>/.simkit.lock``, which holds the holder's process id and start time) before
its first write, and the lock is held until ``close()`` (the CLI's command wrapper, a ``with`` block) or
the process ends. A second run into the same directory is refused, naming the holder; a lock file
whose lock can be taken was left by a process that died (the kernel releases ``flock`` with the
process) and is taken over with a notice on stderr. The lock file is hidden (a dot name): digests,
results and the listing of a run directory leave it out.

``inputs``: JSON-able values by name (settings fields, spec strings, seeds). ``files``: name →
local files or directories whose contents the run reads, recorded by sha256 (a directory file by
file). Python callers that pass modules and tensors record them with :func:`fingerprint`.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from simkit.errors import SimkitError
from simkit.io import file_sha256

INPUTS_FILE = "inputs.json"
CHECKPOINTS_DIR = "checkpoints"
LOCK_FILE = ".simkit.lock"
_ABSENT = object()
# (inputs.json path, the directories its writing created, deepest first) for each fresh run started
# in this process that created its directory: removed again by ``discard_unused_runs``
_created: list[tuple[Path, list[Path]]] = []


class RunDir:
    """A checked run directory; ``start()`` makes it this run's (see the module docstring).

    path: the directory; command: the command or runner that owns it (``"convert"``); resume: continue
    the run recorded there. ``checkpoints`` is where the training loop writes.
    """

    def __init__(self, path: str | Path, command: str, inputs: Mapping[str, Any] | None = None, *,
                 files: Mapping[str, Sequence[Path]] | None = None, resume: bool = False):
        self.path, self.command, self.resume = Path(path), command, bool(resume)
        self.record = _inputs_record(command, dict(inputs or {}), dict(files or {}))
        self.started = False
        self._check()

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End this run's hold on the directory: release the lock (and remove the lock file)."""
        release_lock(self.path)

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    def _check(self) -> None:
        out, path = self.path, self.path / INPUTS_FILE
        check_run_path(out)
        if not self.resume:
            if self.checkpoints.exists() and _recorded_command(out) != self.command:
                raise SimkitError(
                    f"`run_dir` {out} holds {CHECKPOINTS_DIR}/ but no {INPUTS_FILE} or result.json of "
                    f"`simkit {self.command}`, so they may belong to another run; choose another `run_dir`, or delete "
                    f"{self.checkpoints} to start over there")
            return
        if not out.is_dir():
            raise SimkitError(f"`resume`: {out} does not exist; run without `resume` first")
        if not path.is_file():
            raise SimkitError(f"`resume`: {out} has no {INPUTS_FILE}, so it was not made by `simkit {self.command}` "
                              "(or was made by an older simkit); start over without `resume`")
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
            differences = _input_differences(old, self.record)
        except (OSError, ValueError, AttributeError, TypeError):
            raise SimkitError(f"`resume`: cannot read {path}; start over without `resume`") from None
        if differences:
            raise SimkitError(f"`resume`: {out} was made with other inputs ({'; '.join(differences)}); resume "
                              "with the same inputs or start over in a new `run_dir`")
        for checkpoint in sorted(self.checkpoints.glob("*.pt")) if self.checkpoints.is_dir() else []:
            if not checkpoint.name.startswith(".") and not _complete_torch_file(checkpoint):
                raise SimkitError(f"`resume`: checkpoint {checkpoint} is truncated or corrupt (not a complete torch "
                                  "file); delete it and resume again (its stage reruns), or start over without `resume`")

    def start(self) -> RunDir:
        """Make the directory this run's (once; later calls do nothing). Fresh: remove the earlier run's
        ``checkpoints/``, write ``inputs.json`` (rank 0 only). Resume: nothing to write."""
        if self.started:
            return self
        from simkit.distributed import is_main_process
        from simkit.io import write_json

        if not is_main_process():
            self.started = True
            return self
        if self.resume:
            take_lock(self.path, self.command)
            self.started = True
            return self
        made = self._make_and_lock()
        self.started = True
        # the earlier run's checkpoints are moved aside (one rename), inputs.json written, and only then
        # removed: a start that fails puts them back, so the earlier run stays as it was
        aside = self._move_checkpoints_aside()
        try:
            write_json(self.path / INPUTS_FILE, self.record)
        except (OSError, SimkitError) as exc:
            if aside.is_dir():
                aside.rename(self.checkpoints)
            release_lock(self.path)
            _remove_empty(made)
            if isinstance(exc, SimkitError):
                raise
            raise SimkitError(f"cannot write {self.path / INPUTS_FILE} ({exc.strerror}); choose another "
                              "`run_dir`") from None
        shutil.rmtree(aside, ignore_errors=True)
        if made:
            _created.append((self.path / INPUTS_FILE, made))
        return self

    def _make_and_lock(self) -> list[Path]:
        """Create the directory and take its lock (:meth:`start`); the directories this created, deepest
        first. A failure removes them again."""
        made = [p for p in (self.path, *self.path.parents) if not p.exists()]  # deepest first
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _remove_empty(made)
            raise SimkitError(f"cannot create `run_dir` {self.path} ({exc.strerror}); choose another "
                              "`run_dir`") from None
        try:
            take_lock(self.path, self.command)
        except BaseException:
            _remove_empty(made)
            raise
        return made

    def _move_checkpoints_aside(self) -> Path:
        """Rename the earlier run's ``checkpoints/`` (if any) to the path returned (:meth:`start`)."""
        aside = self.path / f".{CHECKPOINTS_DIR}.discarded"
        if self.checkpoints.is_dir():
            try:
                if aside.exists():
                    shutil.rmtree(aside)
                self.checkpoints.rename(aside)
            except OSError as exc:
                raise SimkitError(f"cannot remove {self.checkpoints} of the earlier run ({exc.strerror}); "
                                  "delete it or choose another `run_dir`") from None
        return aside


def check_run_path(path: str | Path, arg: str = "run_dir") -> None:
    """Refuse, touching nothing, a path that cannot become a directory of files: an existing file, a
    path under a file, a name longer than the file system allows. ``arg``: the argument named."""
    out = Path(path)
    full = out.absolute()
    # lengths first: asking whether a too-long name exists is itself an error (ENAMETOOLONG)
    existing = next((p for p in (full, *full.parents) if _exists(p)), Path(full.anchor or "/"))
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        name_max, path_max = 255, 4096
    long = next((part for part in full.parts if len(os.fsencode(part)) > name_max), None)
    if long is not None:
        raise SimkitError(f"`{arg}`: the name {long[:24]}... is {len(os.fsencode(long))} bytes long, too long "
                          f"for the file system (at most {name_max}); choose a shorter `{arg}`")
    if len(os.fsencode(str(full))) + 64 > path_max:  # room for the files written inside
        raise SimkitError(f"`{arg}` {str(out)[:40]}... is too long a path for the file system (at most "
                          f"{path_max} bytes with the files inside); choose a shorter `{arg}`")
    if _exists(out) and not out.is_dir():
        raise SimkitError(f"`{arg}` {out} is an existing file, not a directory; choose another `{arg}`")
    blocked = next((p for p in out.parents if _exists(p) and not p.is_dir()), None)
    if blocked is not None:
        raise SimkitError(f"`{arg}` {out} lies under {blocked}, which is a file; choose another `{arg}`")


def _exists(path: Path) -> bool:
    """``path.exists()``, False where the question itself fails (a name too long, no permission)."""
    try:
        return path.exists()
    except OSError:
        return False


def _remove_empty(made: list[Path]) -> None:
    """Remove the directories in ``made`` (deepest first) that are empty."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            return


def open_run_dir(run_dir: RunDir | str | Path | None, command: str, inputs: Mapping[str, Any], *,
                 resume: bool = False) -> RunDir | None:
    """What a runner was given as ``run_dir``: a RunDir as it is (the CLI made it, with file digests),
    a path checked against ``inputs`` (a Python caller's settings and :func:`fingerprint` values), or
    None (no checkpoints, and then ``resume`` is an error)."""
    if isinstance(run_dir, RunDir):
        return run_dir
    if run_dir is None:
        if resume:
            raise SimkitError("`resume` needs `run_dir`: the directory of the run to continue")
        return None
    return RunDir(run_dir, command, inputs, resume=resume)


def fingerprint(value: Any) -> str:
    """sha256 of what a module, tensor, dataset or JSON-able value holds, for ``inputs``: a module's
    class and state (names, dtypes, shapes, bytes), a tensor's dtype, shape and bytes, an object with
    ``inputs``/``labels`` (a ``simkit.data.Dataset``) by those and its ``test`` split, mappings and sequences item by item."""
    digest = hashlib.sha256()
    _feed(digest, value)
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    import torch  # here, not at the top: the CLI imports this module on every command, --help included

    if isinstance(value, torch.nn.Module):
        digest.update(f"module {type(value).__qualname__}\0".encode())
        _feed(digest, value.state_dict())
    elif isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        digest.update(f"tensor {t.dtype} {tuple(t.shape)}\0".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, Mapping):
        for key in value:
            digest.update(f"key {key}\0".encode())
            _feed(digest, value[key])
    elif isinstance(value, list | tuple):
        digest.update(f"seq {len(value)}\0".encode())
        for item in value:
            _feed(digest, item)
    elif hasattr(value, "inputs") and hasattr(value, "labels"):
        _feed(digest, {"inputs": value.inputs, "labels": value.labels, "test": getattr(value, "test", None)})
    else:
        digest.update(json.dumps(_plain(value), sort_keys=True).encode() + b"\0")


def _complete_torch_file(path: Path) -> bool:
    """True when ``path`` is a whole ``torch.save`` zip archive (its directory readable, data.pkl in it);
    cheap: reads the zip directory only."""
    import zipfile

    try:
        if not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/data.pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def discard_unused_runs() -> None:
    """Remove the run directories that fresh runs of this process created and left holding nothing
    but inputs.json (a run that failed on bad input, or was interrupted before its first checkpoint),
    with the parent directories created for them, and those it claimed and left empty. Anything else in
    them keeps them where they are."""
    for path, made in list(_claimed):
        if made and path.is_dir() and run_dir_listing(path) == [INPUTS_FILE]:  # created by this command
            _unlink(path / INPUTS_FILE)
        _remove_if_empty(path, made)
    while _created:
        path, made = _created.pop()
        try:
            if run_dir_listing(path.parent) != [INPUTS_FILE] or not path.is_file():
                continue
            path.unlink()
            release_lock(path.parent)
            for folder in made:  # deepest first; rmdir never removes a directory that holds anything
                folder.rmdir()
        except OSError:
            continue


def forget_runs() -> None:
    """End of an invocation: the directories it created are no longer candidates for removal; a directory
    it claimed (:func:`claim_run_dir`) and left empty is removed with the parents made for it."""
    _created.clear()
    while _claimed:
        path, made = _claimed.pop()
        _remove_if_empty(path, made)


# run directories claimed at the start of a command → the directories created to claim them (deepest first)
_claimed: list[tuple[Path, list[Path]]] = []


def claim_run_dir(path: str | Path, command: str) -> None:
    """Make run directory ``path`` this command's from its first moment, before any model is loaded: create
    it if missing and take its lock (:func:`take_lock`), so a second run into a busy directory is refused
    at once, naming the holder. Nothing is left behind by a run that ends without writing: the directory
    (and the parents made for it) is removed again when it is still empty (:func:`forget_runs`,
    :func:`discard_unused_runs`)."""
    path = Path(path)
    made = [p for p in (path, *path.parents) if not _exists(p)]  # deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_empty(made)
        raise SimkitError(f"cannot create `run_dir` {path} ({exc.strerror}); choose another `run_dir`") from None
    try:
        take_lock(path, command)
    except BaseException:
        _remove_empty(made)
        raise
    _claimed.append((path, made))


def _remove_if_empty(path: Path, made: list[Path]) -> None:
    """Release ``path``'s lock and remove the directories ``made`` for it when ``path`` holds nothing else."""
    try:
        if not path.is_dir() or run_dir_listing(path):
            return
        release_lock(path)
        _remove_empty(made)
    except OSError:
        return


def run_dir_listing(path: Path) -> list[str]:
    """The names in run directory ``path``, sorted, without the lock file."""
    return sorted(p.name for p in path.iterdir() if p.name != LOCK_FILE)


# ------------------------------------------------------------------------------------------ the lock
# resolved run directory → (open lock file, its holder record) for every lock this process holds
_held: dict[str, tuple[Any, dict[str, Any]]] = {}


def _lock_key(path: Path) -> str:
    return os.path.realpath(path)


def _read_holder(handle: Any) -> dict[str, Any] | None:
    try:
        handle.seek(0)
        value = json.loads(handle.read() or "null")
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "a process that has not yet recorded itself"
    when = holder.get("started")
    shown = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if isinstance(when, int | float) else "?"
    command = f" (`simkit {holder['command']}`)" if holder.get("command") else ""
    return f"process {holder.get('pid', '?')}{command} started {shown}"


def take_lock(path: str | Path, command: str = "") -> None:
    """Make run directory ``path`` (which exists) this process's: an exclusive ``flock`` on
    ``path/.simkit.lock`` holding our process id and start time, kept until :func:`release_lock` or the
    end of the process. Another live holder: a SimkitError naming it. A lock file left by a process
    that died: taken over with a notice on stderr. A lock this process already holds is kept as it is."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform: no lock
        return
    path = Path(path)
    key = _lock_key(path)
    if key in _held:
        return
    lock = path / LOCK_FILE
    for _ in range(50):  # a holder may remove its file between our open and our flock: then retry
        try:
            handle = open(lock, "a+", encoding="utf-8")  # noqa: SIM115 (held open while the run lasts)
        except OSError as exc:
            raise SimkitError(f"cannot create the lock file {lock} ({exc.strerror}); choose another "
                              "`run_dir`") from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(handle)
            handle.close()
            raise SimkitError(f"`run_dir` {path} is in use by another run ({_describe(holder)}); wait for it "
                              "to end, or choose another `run_dir`") from None
        try:
            same = os.fstat(handle.fileno()).st_ino == os.stat(lock).st_ino
        except OSError:
            same = False
        if not same:
            handle.close()
            continue
        old = _read_holder(handle)
        if old and old.get("pid") is not None:
            print(f"notice: taking over the stale lock of {path} left by {_describe(old)}, which no longer "
                  "holds it", file=sys.stderr)
        holder = {"pid": os.getpid(), "started": time.time(), "command": command}
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(holder) + "\n")
            handle.flush()
        except OSError as exc:
            handle.close()
            _unlink(lock)
            raise SimkitError(f"cannot write the lock file {lock} ({exc.strerror}); free some space or "
                              "choose another `run_dir`") from None
        _held[key] = (handle, holder)
        return
    raise SimkitError(f"cannot lock `run_dir` {path}: its lock file keeps changing; choose another `run_dir`")


def release_lock(path: str | Path) -> None:
    """Release this process's lock on run directory ``path`` (if it holds one) and remove the lock file."""
    entry = _held.pop(_lock_key(Path(path)), None)
    if entry is None:
        return
    handle = entry[0]
    _unlink(Path(path) / LOCK_FILE)  # first: whoever waits on the old file sees it gone and retries
    handle.close()  # closing the file releases the flock


@contextlib.contextmanager
def locked(path: str | Path, command: str = "") -> Iterator[None]:
    """Hold run directory ``path``'s lock while the block writes (created when missing): taken here
    unless this process holds it already (a runner's ``RunDir.start``), and then released here."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimkitError(f"cannot create the run directory {path} ({exc.strerror}); choose another "
                          "`run_dir`") from None
    mine = _lock_key(path) not in _held
    take_lock(path, command)
    try:
        yield
    finally:
        if mine:
            release_lock(path)


def release_locks() -> None:
    """Release every run-directory lock this process holds (the end of a command, or of the process)."""
    for key in list(_held):
        release_lock(key)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


atexit.register(release_locks)


def _recorded_command(out: Path) -> str | None:
    """The command that made run directory ``out`` according to its inputs.json ("command") and
    result.json ("kind"); None when neither is readable or they disagree."""
    names = set()
    for file, key in ((INPUTS_FILE, "command"), ("result.json", "kind")):
        if (out / file).exists():
            try:
                names.add(json.loads((out / file).read_text(encoding="utf-8")).get(key))
            except (OSError, ValueError, AttributeError):
                return None
    return names.pop() if len(names) == 1 else None


def _plain(value: Any) -> Any:
    """Exactly what reading inputs.json back gives, so that == compares."""
    from enum import Enum

    from simkit.io import to_jsonable

    value = value.value if isinstance(value, Enum) else value
    return json.loads(json.dumps(to_jsonable(value), allow_nan=False))


def _inputs_record(command: str, inputs: dict[str, Any], files: dict[str, Sequence[Path]]) -> dict[str, Any]:
    """{"command", "options": {name: JSON value}, "files": {name: {path: sha256 or None}}}."""
    digests = {name: {str(p): sha256(Path(p)) for p in paths} for name, paths in files.items() if paths}
    return {"command": command, "options": {name: _plain(v) for name, v in inputs.items()}, "files": digests}


def sha256(path: Path) -> str | None:
    """Hex sha256 of a file's bytes; of a directory's (relative path, file digest) list, hidden names and
    __pycache__ left out; None when nothing is there."""
    if path.is_file():
        return file_sha256(path)
    if not path.is_dir():
        return None
    digest = hashlib.sha256()
    for item in sorted(path.rglob("*")):
        rel = item.relative_to(path)
        if item.is_file() and not any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            digest.update(f"{rel.as_posix()}\0{sha256(item)}\n".encode())
    return digest.hexdigest()


def _input_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'key: old → new' for every differing option, and for every changed file of an unchanged option."""
    def show(value: Any) -> str:
        return "(absent)" if value is _ABSENT else json.dumps(value, ensure_ascii=False)

    def short(digest: Any) -> str:
        return f"sha256 {digest[:12]}" if isinstance(digest, str) else "(missing)"

    out = []
    if old.get("command") != new["command"]:
        out.append(f"command: {show(old.get('command', _ABSENT))} → {show(new['command'])}")
    old_options, new_options = old.get("options", {}), new["options"]
    old_files, new_files = old.get("files", {}), new["files"]
    for name in [*new_options, *(k for k in old_options if k not in new_options)]:
        before, after = old_options.get(name, _ABSENT), new_options.get(name, _ABSENT)
        if before != after:
            out.append(f"{name}: {show(before)} → {show(after)}")
            continue
        was, now = old_files.get(name, {}), new_files.get(name, {})
        for file in [*now, *(f for f in was if f not in now)]:
            if was.get(file) != now.get(file):
                out.append(f"{name} file {json.dumps(file)}: {short(was.get(file))} → {short(now.get(file))}")
    return out
