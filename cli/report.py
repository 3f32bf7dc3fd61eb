"""simkit report DIR: re-render DIR/report.html from the run directory's files (nothing is recomputed);
``--figures png,pdf,svg`` also writes each of the report's figures as DIR/figures/<name>.<format>."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from simkit.cli.common import command
from simkit.errors import SimkitError
from simkit.plotting import FIGURE_FORMATS

FIGURES_FOLDER = "figures"


@command("report", help="Re-render DIR/report.html from the files of a run directory (no recomputation); "
         "--figures also writes every figure as a file.")
def report(
    run_dir: Annotated[Path, typer.Argument(metavar="DIR", help="A run directory written by a simkit command.")],
    figures: Annotated[str | None, typer.Option(
        "--figures", metavar="FORMATS",
        help="Also write each figure of the report as DIR/figures/<name>.<format>; FORMATS: a comma list of "
             f"{', '.join(FIGURE_FORMATS)} (pdf and svg keep text as text).")] = None,
) -> None:
    """`simkit report`: re-render DIR/report.html from a run directory's files (no recomputation) and,
    with --figures, write each figure as DIR/figures/<name>.<format>."""
    import simkit
    from simkit.plotting import parse_formats

    formats = parse_formats(figures, "--figures") if figures is not None else ()  # before anything is written
    _refuse_cache(run_dir)
    result = simkit.load(run_dir)  # SimkitError for a missing, incomplete or malformed run directory
    path, written = _render(result, run_dir, formats)
    typer.echo(f"wrote {path}", err=True)
    if formats:
        typer.echo(f"wrote {len(written)} figure files ({', '.join(formats)}) to {run_dir / FIGURES_FOLDER}", err=True)


def _refuse_cache(run_dir: Path) -> None:
    """A SimkitError saying what to do with an activation cache (``simkit capture``'s folder), which has
    no report of its own."""
    from simkit.engine.sources import is_cache

    if not (run_dir / "result.json").is_file() and is_cache(run_dir):
        raise SimkitError(f"{run_dir} is an activation cache written by `simkit capture`, not a run directory: "
                          f"compare it with another cache (`simkit compare {run_dir} OTHER_CACHE --out RUN`) or "
                          f"study three or more (`simkit compare {run_dir} CACHE2 CACHE3 --out RUN`), "
                          "then `simkit report RUN`")


def _render(result, run_dir: Path, formats: tuple[str, ...]) -> tuple[Path, list[Path]]:
    """Write DIR/report.html and, for each of ``formats``, the figure files; ``(report path, figure
    paths)``. A file of DIR that is not what the command wrote gives a one-line SimkitError."""
    from simkit.plotting import write_figures
    from simkit.report import render_report
    from simkit.report.figures import collect_figures

    try:
        path, kept = collect_figures(lambda: render_report(result, run_dir / "report.html"))
        return path, write_figures(kept, run_dir / FIGURES_FOLDER, formats) if formats else []
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, SimkitError):
            raise
        # everything the report reads comes from DIR's files: one of them is not what the command wrote
        detail = (str(exc).strip().splitlines() or [""])[0][:120]
        raise SimkitError(f"cannot render a report from the files of {run_dir} ({type(exc).__name__}: {detail}); "
                          "they were changed or come from another simkit version: rerun the command that "
                          "wrote them") from None
