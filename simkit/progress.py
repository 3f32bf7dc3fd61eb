"""The one progress bar (rich) every long loop shows: on stderr, on the main process only.

It redraws 4 times a second, not rich's default 10: each redraw costs CPU that the models' forward
passes and the metrics compete for (about 1 % of a 2-core machine at 10 Hz on a terminal).
"""

from __future__ import annotations

from typing import Any

from simkit import distributed

REFRESH_PER_SECOND = 4


def progress_bar(enabled: bool, *extra_columns: Any, transient: bool = True):
    """A ``rich.progress.Progress``: description, bar, done/total, ``extra_columns``, time remaining.

    Disabled (draws nothing, not even the blank line a stopped bar leaves) when ``enabled`` is false, on
    a rank other than 0 under torchrun, or when stderr is neither a terminal nor a notebook (a pipe, a
    log file); ``transient``: the bar is erased when the loop ends.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    shown = enabled and distributed.is_main_process() and (console.is_terminal or console.is_jupyter)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *extra_columns,
                    TimeRemainingColumn(), console=console, transient=transient,
                    refresh_per_second=REFRESH_PER_SECOND, disable=not shown)
