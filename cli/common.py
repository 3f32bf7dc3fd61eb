"""What every command shares: the app, error handling, and the options with one meaning everywhere."""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperOption

from simkit.errors import SimkitError
from simkit.rundir import check_run_path, discard_unused_runs, forget_runs

app = typer.Typer(
    name="simkit",
    help="Representation similarity of neural networks, layer by layer, with HTML reports.\n\n"
    "Exit codes: 0 success, 2 bad input (one line on stderr), 1 internal error.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _flag_type(self: Any, ctx: Any) -> str | None:
    """Help shows no ``<bool>`` type beside an on/off flag (``--trust``, ``--no-report``, ``--help``), and
    ``A,B,...`` instead of ``<list[str]>`` beside a comma-list option."""
    if getattr(self, "is_flag", False) and self.metavar is None:
        return None
    shown = _typer_type(self, ctx)
    return "A,B,..." if shown is not None and "list[" in str(shown) else shown


def _argument_type(self: Any, ctx: Any) -> str | None:
    """Help shows ``SPEC ...`` instead of ``<list[str]>`` beside a variadic argument (``MODELS...``)."""
    shown = _typer_argument_type(self, ctx)
    return "SPEC ..." if shown is not None and "list[" in str(shown) else shown


_typer_type = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]
_typer_argument_type = TyperArgument.display_type_rich
TyperArgument.display_type_rich = _argument_type  # type: ignore[method-assign]


# library argument names that every command spells alike: → the option parameter that takes them
LIBRARY_ALIASES = {"run_dir": "out"}
_ARGUMENT = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


def cli_message(message: str, flags: dict[str, str]) -> str:
    """A library message for the command line: every backticked library argument that ``flags`` knows
    (argument name → flag, e.g. ``batch_size`` → ``--batch-size``) becomes that flag; other
    backticked text (a command, a field name) stays as written."""
    return _ARGUMENT.sub(lambda m: flags.get(m.group(1), m.group(0)), message)


def command_flags(func: Any, arg_flags: dict[str, str] | None = None) -> dict[str, str]:
    """Library argument name → this command's flag: every option of the typer command ``func`` by its
    parameter name (``batch_size`` → ``--batch-size``; an argument by its metavar, ``MODEL_A``), plus
    ``arg_flags`` (and ``LIBRARY_ALIASES``) for library names that differ from the command's
    (``schedules`` → ``schedule``, or a flag such as ``--schedule``)."""
    import inspect
    from typing import get_args, get_origin, get_type_hints

    from typer.models import ArgumentInfo, OptionInfo

    flags: dict[str, str] = {}
    hints = get_type_hints(func, include_extras=True)
    for name, param in inspect.signature(func).parameters.items():
        hint = hints.get(name)
        infos = [a for a in get_args(hint) if isinstance(a, OptionInfo | ArgumentInfo)] \
            if get_origin(hint) is Annotated else []
        info = infos[0] if infos else param.default
        if isinstance(info, ArgumentInfo):
            flags[name] = info.metavar or name.upper()
        else:
            decls = [d.split("/")[0] for d in getattr(info, "param_decls", None) or () if d.startswith("--")]
            own = "--" + name.replace("_", "-")
            flags[name] = own if own in decls or not decls else decls[0]
    for name, flag in {**LIBRARY_ALIASES, **(arg_flags or {})}.items():
        if name not in flags and (flag.startswith("-") or flag in flags):
            flags[name] = flags.get(flag, flag)
    return flags


def command(*args: Any, arg_flags: dict[str, str] | None = None, **kwargs: Any):
    """``@app.command`` that checks ``--device`` first, joins torchrun's process group when launched by
    it, and turns a SimkitError into one line on stderr and exit code 2, its library argument names
    mapped to this command's flags (``cli_message``; ``arg_flags``: library argument → flag or option
    parameter name, where they differ). A run directory that this invocation created and that holds
    nothing but inputs.json when it fails on bad input (or is interrupted) is removed again
    (``simkit.rundir.discard_unused_runs``)."""

    def decorate(func):
        flags = command_flags(func, arg_flags)

        @functools.wraps(func)
        def wrapper(*a: Any, **kw: Any):
            try:
                if kw.get("device") is not None:  # a device that is not there fails before anything is written
                    from simkit.forward import resolve_device

                    resolve_device(kw["device"])
                if isinstance(kw.get("out"), str | Path):  # --out is checked before anything runs
                    check_run_path(kw["out"])
                if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: join its process group
                    from simkit.distributed import init_if_launched  # (torch: only where it is needed)

                    init_if_launched(str(kw.get("device") or "cpu"))
                return func(*a, **kw)
            except SimkitError as exc:
                discard_unused_runs()
                message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())  # one line
                typer.echo(f"error: {cli_message(message, flags)}", err=True)
                raise typer.Exit(2) from None
            except KeyboardInterrupt:
                discard_unused_runs()
                typer.echo("interrupted", err=True)
                raise typer.Exit(130) from None
            finally:
                forget_runs()

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


def finish(result, out: Path, no_report: bool) -> None:
    """Save a result into its run directory (rank 0 only under torchrun) and say where it went."""
    from simkit.distributed import is_main_process
    from simkit.report import save_run

    if not is_main_process():
        return
    save_run(result, out, report=not no_report)
    shown = out / ("result.json" if no_report else "report.html")
    typer.echo(f"wrote {shown}", err=True)


def echo_err(message: str) -> None:
    print(message, file=sys.stderr)
