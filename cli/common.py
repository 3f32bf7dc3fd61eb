"""What every command shares: the app, error handling, and the options with one meaning everywhere."""

from __future__ import annotations

import functools
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from typer.core import TyperCommand, TyperGroup

from simkit.errors import SimkitError
from simkit.rundir import check_run_path, claim_run_dir, discard_unused_runs, forget_runs, release_locks
from simkit.settings.compare import DTYPES


class _Help:
    """What simkit's commands and its group show differently from typer's defaults, by subclassing
    (``cls=``, click's public methods only): no ``<bool>`` beside ``--help``."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""  # a flag: nothing to show in the type column
        return option


def argument_usage(param: Any) -> str:
    """An argument as click writes it in the usage line: ``MODEL_A``, ``[MODEL]``, ``MODELS...`` (typer
    writes ``{model_a}``)."""
    name = (param.name or "").upper()
    name = name if param.required else f"[{name}]"
    return name + ("..." if param.nargs != 1 else "")


class SimkitCommand(_Help, TyperCommand):
    """typer's command class with simkit's help (see :class:`_Help`) and usage line (:func:`argument_usage`)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        arguments = [argument_usage(p) for p in self.get_params(ctx) if p.param_type_name == "argument"]
        return [self.options_metavar or "[OPTIONS]", *arguments]


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
        except typer.TyperException as exc:
            if getattr(exc, "exit_code", 1) != 2:  # not the command line's fault
                raise
            if type(exc).__name__ == "NoArgsIsHelpError":  # `simkit` alone: the overview, as typer shows it
                typer.echo(exc.format_message())
            else:  # a usage error of the command line
                typer.echo(f"error: {usage_message(exc)}", err=True)
            code = 2
        except typer.Abort:
            typer.echo("interrupted", err=True)
            code = 130
        if standalone_mode:
            sys.exit(code)
        return code


def usage_message(exc: Any) -> str:
    """One line for a usage error of the command line: what is wrong, and where the options are listed."""
    message = " ".join(line.strip() for line in exc.format_message().splitlines() if line.strip())
    for typer_words, ours in (("Input should be a valid integer, unable to parse string as an integer",
                               "expected a whole number"),
                              ("Input should be a valid number, unable to parse string as a number",
                               "expected a number"),
                              ("Value error, ", "")):
        message = message.replace(typer_words, ours)
    names, ctx = [], getattr(exc, "ctx", None)
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
_REPEATED = re.compile(r"(--[A-Za-z0-9][A-Za-z0-9-]*) \(\1\)")


def cli_message(message: str, flags: dict[str, str]) -> str:
    """A library message for the command line: every backticked library argument that ``flags`` knows
    (argument name → flag, e.g. ``batch_size`` → ``--batch-size``) becomes that flag; other
    backticked text (a command, a field name) stays as written; a flag the library already named beside
    its argument (``raise `n` (--n)``) is said once."""
    return _REPEATED.sub(r"\1", _ARGUMENT.sub(lambda m: flags.get(m.group(1), m.group(0)), message))


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
            named = getattr(info, "param_decls", None) or ()
            if isinstance(getattr(info, "default", None), str):  # Annotated: typer keeps the first name as default
                named = (info.default, *named)
            decls = [d.split("/")[0] for d in named if d.startswith("--")]
            own = "--" + name.replace("_", "-")
            flags[name] = own if own in decls or not decls else decls[0]
    for name, flag in {**LIBRARY_ALIASES, **(arg_flags or {})}.items():
        if name not in flags and (flag.startswith("-") or flag in flags):
            flags[name] = flags.get(flag, flag)
    return flags


def one_line(message: str) -> str:
    """``message`` on one line: its lines stripped and joined by spaces."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


class WarningChannel:
    """The one way warnings reach a command's user: every Python warning raised while the command runs
    (recorded, so Python prints no file path or source line) and every warning the library kept in a
    result's ``summary["warnings"]``, each once, on one line, its library argument names turned into the
    command's flags (:func:`cli_message`). :func:`finish` stores them in the run's ``summary["warnings"]``;
    the command prints them when it succeeds, one ``warning: ...`` line each on stderr."""

    def __init__(self, flags: dict[str, str]) -> None:
        self.flags = flags
        self.lines: list[str] = []
        self.caught: list[warnings.WarningMessage] = []
        self.printed = 0

    def add(self, message: str) -> None:
        """Keep ``message`` (one line, flags for library names) unless it is already kept."""
        line = cli_message(one_line(message), self.flags)
        if line and line not in self.lines:
            self.lines.append(line)

    def drain(self) -> None:
        """Keep the Python warnings recorded so far."""
        while self.caught:
            self.add(str(self.caught.pop(0).message))

    def into(self, summary: dict[str, Any]) -> None:
        """The run's warnings (its summary's own first, then those recorded) into ``summary["warnings"]``."""
        for message in summary.get("warnings") or []:
            self.add(str(message))
        self.drain()
        if self.lines or "warnings" in summary:
            summary["warnings"] = list(self.lines)

    def print(self) -> None:
        """One ``warning: ...`` line on stderr per warning not printed yet (on the main process only)."""
        self.drain()
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from simkit.distributed import is_main_process

            if not is_main_process():
                return
        for line in self.lines[self.printed:]:
            typer.echo(f"warning: {line}", err=True)
        self.printed = len(self.lines)


_CHANNELS: list[WarningChannel] = []  # the channel of the command running now


@contextmanager
def warning_channel(flags: dict[str, str]) -> Iterator[WarningChannel]:
    """Record every Python warning raised inside into a new :class:`WarningChannel` (the one
    :func:`finish` and :func:`current_warnings` use while it is open)."""
    channel = WarningChannel(flags)
    with warnings.catch_warnings(record=True) as caught:
        channel.caught = caught
        _CHANNELS.append(channel)
        try:
            yield channel
        finally:
            _CHANNELS.remove(channel)


def current_warnings() -> WarningChannel | None:
    """The warning channel of the command running now (None outside a command)."""
    return _CHANNELS[-1] if _CHANNELS else None


def _declare_settings(wrapper: Any, func: Any, settings: type) -> None:
    """The command's signature as typer reads it: ``func``'s parameters without ``settings``, then one
    option per declared field of the settings class (``simkit.cli.declared``)."""
    import inspect

    from simkit.cli.declared import settings_parameters

    own = [p for name, p in inspect.signature(func, eval_str=True).parameters.items() if name != "settings"]
    generated = settings_parameters(settings, skip=tuple(p.name for p in own))
    params = own + generated
    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    wrapper.__settings_class__ = settings
    wrapper.__generated_options__ = frozenset(p.name for p in generated)


def _with_settings(wrapper: Any, kw: dict[str, Any]) -> dict[str, Any]:
    """The command's keyword arguments with its generated settings options replaced by ``settings=``
    (validated); a parameter of the command itself that names a settings field (an argument such as
    graft's MODEL) goes both to the settings and to the command."""
    from simkit.cli.declared import settings_from_cli
    from simkit.options import declarations

    settings = wrapper.__settings_class__
    values = {k: v for k, v in kw.items() if k in declarations(settings)}
    rest = {k: v for k, v in kw.items() if k not in wrapper.__generated_options__}
    return {**rest, "settings": settings_from_cli(settings, values)}


def command(*args: Any, arg_flags: dict[str, str] | None = None, settings: type | None = None, **kwargs: Any):
    """``@app.command`` that checks ``--device`` first, joins torchrun's process group when launched by
    it, and turns a SimkitError into one line on stderr and exit code 2, its library argument names
    mapped to this command's flags (``cli_message``; ``arg_flags``: library argument → flag or option
    parameter name, where they differ). A run directory that this invocation created and that holds
    nothing but inputs.json when it fails on bad input (or is interrupted) is removed again
    (``simkit.rundir.discard_unused_runs``). Whatever happens, the run directories the command locked
    are released and, under torchrun, every rank leaves the process group before the command returns
    (``simkit.distributed.shutdown``: a barrier on success, then destroy_process_group). Warnings go
    through one :class:`WarningChannel`: recorded while the command runs, stored in its result's summary
    by :func:`finish`, printed once each as ``warning: ...`` when it succeeds. ``settings``: the command's
    settings class, whose declared options replace the function's ``settings`` parameter
    (``simkit.cli.declared``); the function receives the validated object."""

    name = str(args[0]) if args else ""

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*a: Any, **kw: Any):
            joined = ok = False
            try:
                if kw.get("device") is not None:  # a device that is not there fails before anything is written
                    from simkit.forward import resolve_device

                    resolve_device(kw["device"])
                if isinstance(kw.get("out"), str | Path):  # --out is checked and claimed before anything runs
                    check_run_path(kw["out"])
                    if os.environ.get("RANK", "0") == "0" and not (kw.get("resume") and not Path(kw["out"]).exists()):
                        claim_run_dir(kw["out"], name)  # rank 0 holds it; a resume of nothing is refused later
                if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: join its process group
                    from simkit.distributed import init_if_launched  # (torch: only where it is needed)

                    joined = init_if_launched(str(kw.get("device") or "cpu"))
                with warning_channel(flags) as channel:
                    if settings is not None:  # the declared options → one validated settings object
                        kw = _with_settings(wrapper, kw)
                    result = func(*a, **kw)
                channel.print()
                ok = True
                return result
            except SimkitError as exc:
                discard_unused_runs()
                typer.echo(f"error: {cli_message(one_line(str(exc)), flags)}", err=True)
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

        if settings is not None:
            _declare_settings(wrapper, func, settings)
        flags = command_flags(wrapper, arg_flags)
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
SeedOpt = Annotated[int, typer.Option(
    "--seed", help="Seed for model init and training (not the data: --data-seed).")]
DataSeedOpt = Annotated[int, typer.Option(
    "--data-seed", help="Seed for the data: synthetic: samples, imagefolder's shuffle, the held-out split of "
    "data without one. Apart from --seed, so changing only --seed keeps the data.")]
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


DtypeOpt = Annotated[Literal[DTYPES] | None, typer.Option(  # type: ignore[valid-type]
    "--dtype", help="Load the models in this dtype (default: the dtype of their files); activations are still "
    "summed in float64. float16 may overflow (a one-line error names the layer): prefer bfloat16.",
    show_default=False)]
WeightsOpt = Annotated[Path | None, typer.Option("--weights", help="Local weights file for MODEL.")]


def load_cli_model(spec: str, *, seed: int, trust: bool, weights: Path | None, dtype: str | None = None):
    """``simkit.models.load_model`` with the CLI's options (a ``--weights`` path or None, ``--dtype``) → nn.Module."""
    from simkit.models import load_model

    return load_model(spec, seed=seed, trust=trust, weights=str(weights) if weights else None, dtype=dtype)


def finish(result, out: Path, no_report: bool) -> None:
    """Save a result into its run directory (rank 0 only under torchrun), its warnings (the command's
    :class:`WarningChannel`) in its summary; print them, say where it went, then (compare, study) one
    line of what it found (``simkit.report.headline``) on stdout."""
    from simkit.distributed import is_main_process
    from simkit.report import save_run
    from simkit.report.headline import result_headline

    if not is_main_process():
        return
    channel = current_warnings()
    if channel is not None:
        channel.into(result.summary)
    save_run(result, out, report=not no_report)
    if channel is not None:
        channel.print()
    shown = out / ("result.json" if no_report else "report.html")
    typer.echo(f"wrote {shown}", err=True)
    found = result_headline(result)
    if found is not None:
        typer.echo(f"finding: {found}; details in {shown}")

