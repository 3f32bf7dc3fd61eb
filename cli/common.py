"""What every command shares: the app, error handling, and the options with one meaning everywhere."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from simkit.errors import SimkitError

app = typer.Typer(
    name="simkit",
    help="Representation similarity of neural networks, layer by layer, with HTML reports.\n\n"
    "Exit codes: 0 success, 2 bad input (one line on stderr), 1 internal error.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def command(*args: Any, **kwargs: Any):
    """``@app.command`` that joins torchrun's process group when launched by it, and turns a
    SimkitError into one line on stderr and exit code 2."""

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*a: Any, **kw: Any):
            try:
                from simkit.distributed import init_if_launched

                init_if_launched(str(kw.get("device") or "cpu"))  # under torchrun: join its process group
                return func(*a, **kw)
            except SimkitError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(2) from None
            except KeyboardInterrupt:
                typer.echo("interrupted", err=True)
                raise typer.Exit(130) from None

        return app.command(*args, **kwargs)(wrapper)

    return decorate


def split_list(values: list[str] | str | None) -> list[str]:
    """Repeatable options that also take comma lists: ['a,b', 'c'] -> ['a', 'b', 'c']."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def split_floats(values: list[str] | str | None, option: str) -> list[float]:
    out = []
    for part in split_list(values):
        try:
            out.append(float(part))
        except ValueError:
            raise SimkitError(f"{option} expects numbers, got {part!r}") from None
    return out


OutOpt = Annotated[Path, typer.Option("--out", help="Run directory to write (created if missing).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for model init, data and training.")]
NoReportOpt = Annotated[bool, typer.Option("--no-report", help="Skip rendering report.html.")]
TrustOpt = Annotated[bool, typer.Option(
    "--trust", help="Allow loading pickled model files (this executes code from the file).")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N.")]
DataOpt = Annotated[str, typer.Option(
    "--data", help="Data spec: mnist1d, digits, synthetic:SHAPE, npy:PATH, pt:PATH, imagefolder:DIR, text:FILE.")]
NOpt = Annotated[int | None, typer.Option(
    "--n", "--num-samples", help="Use at most this many samples (--num-samples under torchrun).")]
ResumeOpt = Annotated[bool, typer.Option(
    "--resume", help="Continue an interrupted run from the checkpoints in --out.")]


WeightsOpt = Annotated[Path | None, typer.Option("--weights", help="Local weights file for MODEL.")]


def load_cli_model(spec: str, *, seed: int, trust: bool, weights: Path | None):
    """``simkit.models.load_model`` with the CLI's options (a ``--weights`` path or None) → nn.Module."""
    from simkit.models import load_model

    return load_model(spec, seed=seed, trust=trust, weights=str(weights) if weights else None)


INPUTS_FILE = "inputs.json"
# Options that never change a run's results, so --resume may change them: left out of inputs.json.
RESULT_FREE = frozenset({"out", "resume", "no_report", "trust", "device", "progress", "cache_dir"})
_ABSENT = object()


def check_inputs(command_name: str, out: Path, resume: bool, options: dict[str, Any],
                 files: dict[str, str] | None = None) -> None:
    """Tie a run directory to the inputs that made it, so that ``--resume`` never mixes two runs.

    ``options``: the command's options by parameter name with their effective values (defaults filled
    in, comma lists split), names in ``RESULT_FREE`` dropped. ``files``: option name → what its value
    names on disk — ``"model"`` (a model spec), ``"data"`` (a data spec), ``"plan"`` (FILE.py:FUNCTION)
    or ``"path"`` — whose local files and directories are recorded by sha256 of their contents.
    A fresh run writes ``out/inputs.json`` (rank 0 only, atomically); with ``resume`` the inputs are
    compared with that file and any difference, or a missing file, is a one-line SimkitError.
    """
    record = _inputs_record(command_name, options, files or {})
    out = Path(out)
    path = out / INPUTS_FILE
    if not resume:
        from simkit.distributed import is_main_process
        from simkit.io import write_json

        if not is_main_process():
            return
        if out.exists() and not out.is_dir():
            raise SimkitError(f"--out {out} is an existing file, not a directory; choose another --out")
        try:
            write_json(path, record)
        except OSError as exc:
            raise SimkitError(f"cannot write {path} ({exc.strerror}); choose another --out") from None
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
    if kind == "plan":  # FILE.py:FUNCTION, split as simkit.theseus.recipes.load_plan_file does
        return [Path(value.rpartition(":")[0] or value)]
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



def finish(result, out: Path, no_report: bool) -> None:
    """Save a result into its run directory (rank 0 only under torchrun) and say where it went."""
    from simkit.distributed import is_main_process

    if not is_main_process():
        return
    result.save(out, report=not no_report)
    shown = out / ("result.json" if no_report else "report.html")
    typer.echo(f"wrote {shown}", err=True)


def echo_err(message: str) -> None:
    print(message, file=sys.stderr)
