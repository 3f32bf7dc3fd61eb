"""The inputs of a resumable run: ``<out>/inputs.json``, so that ``--resume`` never mixes two runs.

``check_inputs`` (called by every command with ``--resume`` before any work) writes the file on a
fresh run and compares with it on a resume. A fresh run starts over: it removes the ``checkpoints/``
of an earlier run of the same command in ``--out``. The run directories a fresh run created are
registered here, so that the CLI (``simkit.cli.common.command``) can remove them again with
``discard_unused_runs`` when the run fails on bad input before writing anything but inputs.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simkit.errors import SimkitError

INPUTS_FILE = "inputs.json"
CHECKPOINTS_DIR = "checkpoints"
# Options that never change a run's results, so --resume may change them: left out of inputs.json.
RESULT_FREE = frozenset({"out", "resume", "no_report", "trust", "device", "progress", "cache_dir"})
_ABSENT = object()
# (inputs.json path, the directories its writing created, deepest first) for each fresh run of this
# invocation that created its --out
_created: list[tuple[Path, list[Path]]] = []


def check_inputs(command_name: str, out: Path, resume: bool, options: dict[str, Any],
                 files: dict[str, str] | None = None) -> None:
    """Tie a run directory to the inputs that made it, so that ``--resume`` never mixes two runs.

    ``options``: the command's options by parameter name with their effective values (defaults filled
    in, comma lists split), names in ``RESULT_FREE`` dropped. ``files``: option name → what its value
    names on disk — ``"model"`` (a model spec), ``"data"`` (a data spec), ``"plan"`` (FILE.py:FUNCTION)
    or ``"path"`` — whose local files and directories are recorded by sha256 of their contents.
    A fresh run removes ``out/checkpoints`` of an earlier ``command_name`` run (refusing checkpoints
    of unknown origin) and writes ``out/inputs.json`` (rank 0 only, atomically); with ``resume`` the
    inputs are compared with that file and any difference, or a missing file, is a one-line SimkitError.
    """
    record = _inputs_record(command_name, options, files or {})
    out = Path(out)
    path = out / INPUTS_FILE
    if not resume:
        from simkit.distributed import is_main_process
        from simkit.io import write_json

        if out.exists() and not out.is_dir():
            raise SimkitError(f"--out {out} is an existing file, not a directory; choose another --out")
        checkpoints = out / CHECKPOINTS_DIR
        if checkpoints.exists() and _recorded_command(out) != command_name:
            raise SimkitError(f"--out {out} holds {CHECKPOINTS_DIR}/ but no {INPUTS_FILE} or result.json of "
                              f"`simkit {command_name}`, so they may belong to another run; choose another --out, "
                              f"or delete {checkpoints} to start over there")
        if not is_main_process():
            return
        made = [p for p in (out, *out.parents) if not p.exists()]  # deepest first
        if checkpoints.is_dir():  # starting over: an earlier run's checkpoints must never be resumed
            import shutil

            try:
                shutil.rmtree(checkpoints)
            except OSError as exc:
                raise SimkitError(f"cannot remove {checkpoints} of the earlier run ({exc.strerror}); delete it "
                                  "or choose another --out") from None
        try:
            write_json(path, record)
        except OSError as exc:
            raise SimkitError(f"cannot write {path} ({exc.strerror}); choose another --out") from None
        if made:
            _created.append((path, made))
        return
    if not out.is_dir():
        raise SimkitError(f"--resume: {out} does not exist; run without --resume first")
    if not path.is_file():
        raise SimkitError(f"--resume: {out} has no {INPUTS_FILE}, so it was not made by `simkit {command_name}` "
                          "(or was made by an older simkit); start over without --resume")
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        differences = _input_differences(old, record)
    except (OSError, ValueError, AttributeError, TypeError):
        raise SimkitError(f"--resume: cannot read {path}; start over without --resume") from None
    if differences:
        raise SimkitError(f"--resume: {out} was made with other inputs ({'; '.join(differences)}); resume "
                          "with the same inputs or start over in a new --out")


def discard_unused_runs() -> None:
    """Remove the run directories that fresh runs of this invocation created and left holding nothing
    but inputs.json (a run that failed on bad input, or was interrupted before its first checkpoint),
    with the parent directories created for them. Anything else in them keeps them where they are."""
    while _created:
        path, made = _created.pop()
        try:
            if [p.name for p in path.parent.iterdir()] != [INPUTS_FILE] or not path.is_file():
                continue
            path.unlink()
            for folder in made:  # deepest first; rmdir never removes a directory that holds anything
                folder.rmdir()
        except OSError:
            continue


def forget_runs() -> None:
    """End of an invocation: the directories it created are no longer candidates for removal."""
    _created.clear()


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


def _inputs_record(command_name: str, options: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """{"command", "options": {name: JSON value}, "files": {name: {path: sha256 or None}}}."""
    from enum import Enum

    from simkit.io import to_jsonable

    def plain(value: Any) -> Any:  # exactly what reading inputs.json back gives, so == compares
        value = value.value if isinstance(value, Enum) else value
        return json.loads(json.dumps(to_jsonable(value), allow_nan=False))

    kept = {name: plain(value) for name, value in options.items() if name not in RESULT_FREE}
    digests = {}
    for name, kind in files.items():
        if name in kept and kept[name] is not None:
            paths = _spec_paths(kind, str(kept[name]))
            if paths:
                digests[name] = {str(p): _sha256(p) for p in paths}
    return {"command": command_name, "options": kept, "files": digests}


def _spec_paths(kind: str, value: str) -> list[Path]:
    if kind == "model":
        from simkit.models.loading import local_paths

        return local_paths(value)
    if kind == "data":
        from simkit.data import local_paths

        return local_paths(value)
    if kind == "plan":
        from simkit.theseus.recipes import plan_file

        return [plan_file(value)[0]]
    return [Path(value).expanduser()]


def _sha256(path: Path) -> str | None:
    """Hex sha256 of a file's bytes; of a directory's (relative path, file digest) list, hidden names and
    __pycache__ left out; None when nothing is there."""
    import hashlib

    if path.is_file():
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    if not path.is_dir():
        return None
    digest = hashlib.sha256()
    for item in sorted(path.rglob("*")):
        rel = item.relative_to(path)
        if item.is_file() and not any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            digest.update(f"{rel.as_posix()}\0{_sha256(item)}\n".encode())
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
