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
    """`simkit report`: re-render DIR/report.html from a run directory's files (no recomputation)."""
    import simkit
    from simkit.report import render_report

    result = simkit.load(run_dir)  # SimkitError for a missing, incomplete or malformed run directory
    try:
        path = render_report(result, run_dir / "report.html")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, SimkitError):
            raise
        # everything the report reads comes from DIR's files: one of them is not what the command wrote
        detail = (str(exc).strip().splitlines() or [""])[0][:120]
        raise SimkitError(f"cannot render a report from the files of {run_dir} ({type(exc).__name__}: {detail}); "
                          "they were changed or come from another simkit version: rerun the command that "
                          "wrote them") from None
    typer.echo(f"wrote {path}", err=True)
