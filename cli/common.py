"""What every command shares: the app, error handling, and the options with one meaning everywhere."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from simkit.cli.inputs import discard_unused_runs, forget_runs
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
    """``@app.command`` that checks ``--device`` first, joins torchrun's process group when launched by
    it, and turns a SimkitError into one line on stderr and exit code 2. A run directory that this invocation created
    and that holds nothing but inputs.json when it fails on bad input (or is interrupted) is removed
    again (``simkit.cli.inputs.discard_unused_runs``)."""

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*a: Any, **kw: Any):
            try:
                from simkit.distributed import init_if_launched

                if kw.get("device") is not None:  # a device that is not there fails before anything is written
                    from simkit.forward import resolve_device

                    resolve_device(kw["device"])
                init_if_launched(str(kw.get("device") or "cpu"))  # under torchrun: join its process group
                return func(*a, **kw)
            except SimkitError as exc:
                discard_unused_runs()
                typer.echo(f"error: {exc}", err=True)
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
