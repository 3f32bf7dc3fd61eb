"""simkit report DIR: re-render DIR/report.html from the run directory's files (nothing is recomputed)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from simkit.cli.common import command
from simkit.errors import SimkitError


@command("report", help="Re-render DIR/report.html from the files of a run directory (no recomputation).")
def report(
    run_dir: Annotated[Path, typer.Argument(metavar="DIR", help="A run directory written by a simkit command.")],
) -> None:
    import simkit

    try:
        result = simkit.load(run_dir)
    except FileNotFoundError as exc:  # result.json lists a table whose CSV is gone
        missing = Path(exc.filename).name if exc.filename else str(exc)
        raise SimkitError(f"{run_dir} is incomplete: {missing} is missing; "
                          "rerun the command that wrote it") from None
    path = result.report(run_dir / "report.html")
    typer.echo(f"wrote {path}", err=True)
