"""The one progress bar (rich) every long loop shows: on stderr, on the main process only.

It redraws 4 times a second, not rich's default 10: each redraw costs CPU that the models' forward
passes and the metrics compete for (about 1 % of a 2-core machine at 10 Hz on a terminal).

A run of many phases (``convert``'s arms and baselines, ``stitch``'s pairs, arms and objectives) adds
an overall bar beneath its loops' bars: :func:`overall_progress` opens it for a known number of phases,
:func:`phase` names each phase as it starts ("stage 2 of 3 · arm 1 of 3"). While it is open, every
:func:`progress_bar` draws inside it (rich shows one live display at a time), and each loop's progress
moves the overall bar within its phase, so its time left is the run's: the seconds so far times the
share of the run still to do over the share done.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from simkit import distributed

REFRESH_PER_SECOND = 4
_ACTIVE: list[Overall] = []   # the open overall bar (at most one), which every progress_bar joins


def make_console() -> Console:
    """The console progress draws on: stderr."""
    return Console(stderr=True)


def _shown(enabled: bool, console: Any) -> bool:
    """Whether a bar is drawn: asked for, on rank 0, and stderr is a terminal or a notebook."""
    return enabled and distributed.is_main_process() and (console.is_terminal or console.is_jupyter)


def progress_bar(enabled: bool, *extra_columns: Any, transient: bool = True):
    """A ``rich.progress.Progress``: description, bar, done/total, ``extra_columns``, time remaining.

    Disabled (draws nothing, not even the blank line a stopped bar leaves) when ``enabled`` is false, on
    a rank other than 0 under torchrun, or when stderr is neither a terminal nor a notebook (a pipe, a
    log file); ``transient``: the bar is erased when the loop ends. Inside :func:`overall_progress` the
    bar is drawn above the overall bar (a finished bar that is not transient stays printed above both).
    """
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *extra_columns,
               TimeRemainingColumn())
    if enabled and _ACTIVE:
        return _ACTIVE[-1].nested(columns, transient)
    console = make_console()
    return Progress(*columns, console=console, transient=transient, refresh_per_second=REFRESH_PER_SECOND,
                    disable=not _shown(enabled, console))


def time_left(elapsed: float | None, completed: float, total: float | None) -> float | None:
    """Seconds still to go when ``completed`` of ``total`` took ``elapsed`` seconds, at the same average
    pace; None before anything is done."""
    if not elapsed or total is None or completed <= 0:
        return None
    return elapsed * max(total - completed, 0.0) / completed


class Overall:
    """The overall bar of a run of ``phases`` phases (see :func:`overall_progress`).

    ``history``: every description it showed, in order. A phase may name its parts, ``{description of a
    loop's bar: label}``: when a bar of that description starts, the phase is at that part (its label
    first in the description), and the phase's share of the run is split evenly between its parts; a
    part that draws no bar (resumed, cached) is passed over.
    """

    def __init__(self, phases: int, console: Any, label: str = "overall") -> None:
        self.total, self.label = max(int(phases), 1), label
        self.history: list[str] = []
        self.index, self.part, self.fraction = -1, 0, 0.0
        self.parts: dict[str, str] = {}
        self.phase_label = ""
        self.bars: list[_Nested] = []
        self.display = _OverallProgress(self, TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                        TimeElapsedColumn(), _TimeLeftColumn(), console=console, transient=True,
                                        refresh_per_second=REFRESH_PER_SECOND)
        self.task = self.display.add_task(label, total=self.total)

    @property
    def completed(self) -> float:
        """Phases done, with the current phase's share done (its parts and its loop's bar)."""
        if self.index < 0:
            return 0.0
        within = (self.part + min(max(self.fraction, 0.0), 1.0)) / max(len(self.parts), 1)
        return self.index + min(within, 1.0)

    def phase(self, label: str, parts: Mapping[str, str] | None = None) -> None:
        """The next phase starts: the previous one counts as done; ``parts`` as in the class docstring."""
        self.index += 1
        self.total = max(self.total, self.index + 1)   # more phases than announced: the bar stretches
        self.phase_label, self.parts, self.part, self.fraction = label, dict(parts or {}), 0, 0.0
        self._show(label)

    def bar_started(self, description: str) -> None:
        """A loop's bar named ``description`` started: the phase moves to that part when it is one."""
        self.fraction = 0.0
        if description in self.parts:
            self.part = list(self.parts).index(description)
            self._show(f"{self.parts[description]} · {self.phase_label}")
        else:
            self._show(self.history[-1] if self.history else self.label)

    def bar_moved(self, fraction: float) -> None:
        """The current loop's bar is at ``fraction`` of its total."""
        self.fraction = fraction
        self._show(self.history[-1] if self.history else self.label)

    def _show(self, description: str) -> None:
        if not self.history or self.history[-1] != description:
            self.history.append(description)
        self.display.update(self.task, description=f"{self.label}: {description}", completed=self.completed,
                            total=self.total)

    def nested(self, columns: tuple[Any, ...], transient: bool) -> _Nested:
        """A loop's bar drawn inside this display."""
        return _Nested(self, columns, transient)

    def attach(self, bar: _Nested) -> None:
        """Draw ``bar`` above the overall bar."""
        if bar not in self.bars:
            self.bars.append(bar)

    def detach(self, bar: _Nested) -> None:
        """Stop drawing ``bar``."""
        if bar in self.bars:
            self.bars.remove(bar)


class _OverallProgress(Progress):
    """The overall display: the loops' bars (``Overall.bars``), then the overall bar."""

    def __init__(self, overall: Overall, *columns: Any, **kwargs: Any) -> None:
        self.overall = overall   # before rich's __init__, which renders once
        super().__init__(*columns, **kwargs)

    def get_renderables(self):
        """The loops' bars, then the overall bar."""
        for bar in list(self.overall.bars):
            yield bar.make_tasks_table(bar.tasks)
        yield self.make_tasks_table(self.tasks)


class _Nested(Progress):
    """A loop's bar inside an overall display: starting and stopping it attaches and detaches it (it has
    no live display of its own); its progress moves the overall bar."""

    def __init__(self, overall: Overall, columns: tuple[Any, ...], transient: bool) -> None:
        super().__init__(*columns, console=overall.display.console, transient=transient,
                         refresh_per_second=REFRESH_PER_SECOND)
        self.overall, self.keep = overall, not transient

    def start(self) -> None:
        """Drawn from now on, inside the overall display."""
        self.overall.attach(self)

    def stop(self) -> None:
        """No longer drawn; a bar that is not transient is printed above the display as it ended."""
        if self in self.overall.bars:
            self.overall.detach(self)
            if self.keep and self.tasks:
                self.console.print(self.make_tasks_table(self.tasks))

    def add_task(self, description: str, *args: Any, **kwargs: Any):
        """rich's ``add_task``; the overall bar learns which part of its phase this is."""
        task = super().add_task(description, *args, **kwargs)
        self.overall.bar_started(description)
        self._moved(task)
        return task

    def update(self, task_id: Any, *args: Any, **kwargs: Any) -> None:
        """rich's ``update``; the overall bar follows."""
        super().update(task_id, *args, **kwargs)
        self._moved(task_id)

    def advance(self, task_id: Any, advance: float = 1) -> None:
        """rich's ``advance``; the overall bar follows."""
        super().advance(task_id, advance)
        self._moved(task_id)

    def _moved(self, task_id: Any) -> None:
        task = self._tasks[task_id]
        self.overall.bar_moved(task.completed / task.total if task.total else 0.0)


class _TimeLeftColumn(ProgressColumn):
    """The overall bar's time left (:func:`time_left`: the average pace of the run so far)."""

    def render(self, task: Any):
        """``0:12:34 left``, or ``-:--:-- left`` before anything is done."""
        left = time_left(task.elapsed, task.completed, task.total)
        shown = "-:--:--" if left is None else str(datetime.timedelta(seconds=int(round(left))))
        return Text(f"{shown} left", style="progress.remaining")


@contextmanager
def overall_progress(phases: int, enabled: bool = True, label: str = "overall") -> Iterator[Overall | None]:
    """An overall bar for a run of ``phases`` phases (named as they start by :func:`phase`), shown when
    a progress bar would be (:func:`progress_bar`), with the loops' bars drawn above it; yields the
    :class:`Overall`, or None when nothing is drawn (or another overall bar is already open)."""
    console = make_console()
    if _ACTIVE or not _shown(enabled, console):
        yield None
        return
    overall = Overall(phases, console, label)
    _ACTIVE.append(overall)
    try:
        with overall.display:
            yield overall
    finally:
        _ACTIVE.remove(overall)


def phase(label: str, parts: Mapping[str, str] | None = None) -> None:
    """The next phase of the open overall bar starts (nothing happens without one); ``parts``:
    ``{description of a loop's bar: label}`` of the phase (see :class:`Overall`)."""
    if _ACTIVE:
        _ACTIVE[-1].phase(label, parts)


def seed_position(seed: int, seeds: Sequence[int]) -> str:
    """`` · seed 2 of 3`` (``seed``'s place among the run's ``seeds``) for a phase label of the overall bar
    when several seeds run, else nothing."""
    return f" · seed {list(seeds).index(seed) + 1} of {len(seeds)}" if len(seeds) > 1 else ""
