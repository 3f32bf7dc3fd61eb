"""What every command shares: the app, error handling, and the options with one meaning everywhere."""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from typer._click.exceptions import NoArgsIsHelpError, UsageError
from typer.core import TyperArgument, TyperCommand, TyperGroup
from typer.exceptions import Abort

from simkit.errors import SimkitError
from simkit.rundir import check_run_path, discard_unused_runs, forget_runs, release_locks


class _Help:
    """What simkit's commands and its group show differently from typer's defaults, by subclassing
    (``cls=``): no ``<bool>`` beside ``--help``, and ``SPEC ...`` beside a variadic argument."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""  # a flag: nothing to show in the type column
        return option


class _SpecsArgument(TyperArgument):
    """A variadic argument of specs: help shows ``SPEC ...`` as its type."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return "SPEC ..."


class SimkitCommand(_Help, TyperCommand):
    """typer's command class with simkit's help (see :class:`_Help`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperArgument) and param.nargs == -1 and type(param) is TyperArgument:
                param.__class__ = _SpecsArgument


class SimkitGroup(_Help, TyperGroup):
    """typer's group with simkit's errors: a usage error of the command line (an unknown option or
    command, a value of the wrong type or choice, a missing option) is one line ``error: ...`` on
    stderr naming the option and the fix, exit code 2, instead of typer's framed box."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        try:
            code = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                                windows_expand_args=windows_expand_args, **extra)
            code = code if isinstance(code, int) else 0
        except NoArgsIsHelpError as exc:  # `simkit` alone: the overview, as typer shows it
            typer.echo(exc.format_message())
            code = 2
        except UsageError as exc:
            typer.echo(f"error: {usage_message(exc)}", err=True)
            code = 2
        except Abort:
            typer.echo("interrupted", err=True)
            code = 130
        if standalone_mode:
            sys.exit(code)
        return code


def usage_message(exc: UsageError) -> str:
    """One line for a usage error of the command line: what is wrong, and where the options are listed."""
    message = " ".join(line.strip() for line in exc.format_message().splitlines() if line.strip())
    for typer_words, ours in (("Input should be a valid integer, unable to parse string as an integer",
                               "expected a whole number"),
                              ("Input should be a valid number, unable to parse string as a number",
                               "expected a number"),
                              ("Value error, ", "")):
        message = message.replace(typer_words, ours)
    names, ctx = [], exc.ctx
    while ctx is not None and ctx.parent is not None:  # the command's own name (the root may be "python -m")
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    sub = " ".join(reversed(names))
    listed = "the options" if sub else "the commands"
    return f"{message.rstrip('.')}; see `simkit {sub + ' ' if sub else ''}--help` for {listed}"


app = typer.Typer(
    name="simkit",
    help="Representation similarity of neural networks, layer by layer, with HTML reports.\n\n"
    "Exit codes: 0 success, 2 bad input (one line on stderr), 1 internal error.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=SimkitGroup,
)


# The type column of help: flags show nothing (metavar=""), comma-list options ``A,B,...``
FLAG = ""
LIST = "A,B,..."

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
    (``simkit.rundir.discard_unused_runs``). Whatever happens, the run directories the command locked
    are released and, under torchrun, every rank leaves the process group before the command returns
    (``simkit.distributed.shutdown``: a barrier on success, then destroy_process_group)."""

    def decorate(func):
        flags = command_flags(func, arg_flags)

        @functools.wraps(func)
        def wrapper(*a: Any, **kw: Any):
            joined = ok = False
            try:
                if kw.get("device") is not None:  # a device that is not there fails before anything is written
                    from simkit.forward import resolve_device

                    resolve_device(kw["device"])
                if isinstance(kw.get("out"), str | Path):  # --out is checked before anything runs
                    check_run_path(kw["out"])
                if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: join its process group
                    from simkit.distributed import init_if_launched  # (torch: only where it is needed)

                    joined = init_if_launched(str(kw.get("device") or "cpu"))
                result = func(*a, **kw)
                ok = True
                return result
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
                release_locks()  # the run directories this command held are free again
                if joined:  # every rank leaves torchrun's group before the command returns (issue #25)
                    from simkit.distributed import shutdown

                    shutdown(ok)

        kwargs.setdefault("cls", SimkitCommand)
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
    """``split_list`` as floats: ['0.1,1', '10'] -> [0.1, 1.0, 10.0]; SimkitError naming ``option`` if not."""
    out = []
    for part in split_list(values):
        try:
            out.append(float(part))
        except ValueError:
            raise SimkitError(f"{option} expects numbers, got {part!r}") from None
    return out


OutOpt = Annotated[Path, typer.Option("--out", help="Run directory to write (created if missing).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for model init, data and training.")]
NoReportOpt = Annotated[bool, typer.Option("--no-report", help="Skip rendering report.html.", metavar="")]
TrustOpt = Annotated[bool, typer.Option(
    "--trust", help="Allow loading pickled model files (this executes code from the file).", metavar="")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N.")]
DataOpt = Annotated[str, typer.Option(
    "--data", help="Data spec: mnist1d, digits, synthetic:SHAPE, npy:PATH, pt:PATH, imagefolder:DIR, text:FILE.")]
NOpt = Annotated[int | None, typer.Option(
    "--n", "--num-samples", help="Use at most this many samples (--num-samples under torchrun).")]
ResumeOpt = Annotated[bool, typer.Option(
    "--resume", help="Continue an interrupted run from the checkpoints in --out.", metavar="")]


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
    """Print ``message`` to stderr."""
    print(message, file=sys.stderr)
