"""The CLI's side of resumable runs: which options are inputs, and which name files on disk.

The run directory itself (``inputs.json``, digests, clearing an earlier run's checkpoints, refusing a
resume with other inputs) is the library's ``simkit.rundir.RunDir``; the CLI builds one from its
options and hands it to the runner, which starts it once everything is validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simkit.rundir import RunDir

# Options that never change a run's results (labels and where things go), so --resume may change them: left out of
# inputs.json.
RESULT_FREE = frozenset({"out", "resume", "no_report", "trust", "device", "progress", "cache_dir", "name_a", "name_b",
                         "names"})


def cli_run_dir(command_name: str, out: Path, resume: bool, options: dict[str, Any],
                files: dict[str, str] | None = None) -> RunDir:
    """The checked (not yet started) RunDir of a command.

    ``options``: the command's options by parameter name with their effective values (defaults filled
    in, comma lists split); names in ``RESULT_FREE`` are dropped. ``files``: option name → what its
    value names on disk — ``"model"`` (a model spec), ``"data"`` (a data spec), ``"plan"``
    (FILE.py:FUNCTION) or ``"path"`` — whose local files and directories are recorded by sha256.
    """
    kept = {name: value for name, value in options.items() if name not in RESULT_FREE}
    paths = {name: _spec_paths(kind, str(kept[name])) for name, kind in (files or {}).items()
             if kept.get(name) is not None}
    return RunDir(out, command_name, kept, files=paths, resume=resume)


def _spec_paths(kind: str, value: str) -> list[Path]:
    if kind == "model":
        from simkit.models.loading import local_paths

        return local_paths(value)
    if kind == "data":
        from simkit.data import local_paths

        return local_paths(value)
    if kind == "plan":
        from simkit.conversion.recipes import plan_file

        return [plan_file(value)[0]]
    return [Path(value).expanduser()]
