"""simkit report DIR: re-render DIR/report.html from the run directory's files (nothing is recomputed)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from simkit.cli.common import command


@command("report", help="Re-render DIR/report.html from the files of a run directory (no recomputation).")
def report(
    run_dir: Annotated[Path, typer.Argument(metavar="DIR", help="A run directory written by a simkit command.")],
) -> None:
    import simkit
    from simkit.report import render_report

    result = simkit.load(run_dir)  # SimkitError for a missing or incomplete run directory
    path = render_report(result, run_dir / "report.html")
    typer.echo(f"wrote {path}", err=True)
