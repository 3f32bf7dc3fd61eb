"""Shared by the Network of Theseus examples: per-seed values from a ``convert`` result, claims judged
by :func:`simkit.stats.verdict` on paired per-seed differences, and the results note (commit, CPU,
load, run time, per-seed values, means, 95 % t intervals, a verdict per paper row).

Also the experiments' shared command line (:func:`experiment_parser`) and run (:func:`run_experiment`).
Nothing here re-implements a seed loop or an interval: ``simkit.convert(..., seeds=N)`` runs the
seeds, :mod:`simkit.stats` gives the intervals and verdicts.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

import simkit
from simkit.stats import Interval, paired_difference, t_interval, verdict

#: a note writer: (result, command, load average before, seconds) -> the note's markdown
NoteWriter = Callable[[Any, str, str, float], str]  # Any: a simkit.convert result


def git_state() -> str:
    """``git rev-parse --short HEAD``, plus ``(uncommitted: …)`` naming the changed files when the tree is dirty."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=False).stdout
        except OSError:
            return ""
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    dirty = [line[3:] for line in git("status", "--porcelain").splitlines() if line.strip()]
    if not dirty:
        return head
    shown = ", ".join(dirty[:12]) + (f", … {len(dirty) - 12} more" if len(dirty) > 12 else "")
    return f"{head} (uncommitted: {shown})"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else ``platform.processor()``) and the core count."""
    name = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def load_text() -> str:
    """The load average (1 / 5 / 15 min)."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def arm_values(runs: pd.DataFrame, column: str, **labels: str) -> pd.Series:
    """Per seed (index: seed) the ``column`` of the ``runs`` rows matching ``labels`` (e.g. guide_init="random")."""
    mask = pd.Series(True, index=runs.index)
    for key, value in labels.items():
        mask &= runs[key].astype(str) == str(value)
    part = runs[mask].drop_duplicates("seed").set_index("seed")[column]
    return part.astype(float).sort_index()


@dataclass
class Claim:
    """One paper row: what the paper reports, the claim tested here (``values`` − ``baseline`` paired by
    seed, or ``values`` alone when ``baseline`` is None, against ``size``), in points (× ``scale``).

    ``kind``: ``above`` (the difference is above ``size``), ``below`` (below −``size``), ``within``
    (inside ±``size``: both sides judged by :func:`simkit.stats.verdict`), ``report`` (no claim, the
    interval only). ``requires``: a claim that must be reproduced first (e.g. the guide's margin over
    the target from scratch), else this row is "not testable at this scale"."""

    row: str
    paper: str
    values: pd.Series
    baseline: pd.Series | None = None
    size: float = 0.0
    kind: str = "above"
    scale: float = 100.0
    requires: Claim | None = None

    def interval(self) -> Interval:
        """The mean (or paired difference) with its 95 % t interval, in points."""
        if self.baseline is None:
            return t_interval(self.values.to_numpy()).scaled(self.scale)
        seeds = self.values.index.intersection(self.baseline.index)
        return paired_difference(self.values.loc[seeds].to_numpy(),
                                 self.baseline.loc[seeds].to_numpy()).scaled(self.scale)

    def verdict(self) -> str:
        """reproduced / direction only / not reproduced / too few seeds (``report``: "reported, no claim")."""
        interval, size = self.interval(), self.size * self.scale
        if self.requires is not None and self.requires.verdict() != "reproduced":
            return f"not testable at this scale ({self.requires.row}: {self.requires.verdict()})"
        if self.kind == "report":
            return "reported, no claim"
        if self.kind == "within":
            sides = (verdict(interval, higher=True, size=-size), verdict(interval, higher=False, size=-size))
            if "too few seeds" in sides:
                return "too few seeds"
            if sides == ("reproduced", "reproduced"):
                return "reproduced"
            return "direction only" if all(s in ("reproduced", "direction only") for s in sides) else "not reproduced"
        return verdict(interval, higher=self.kind == "above", size=size)

    def markdown(self) -> str:
        """``| row | paper | ours | verdict |``."""
        interval = self.interval()
        if self.baseline is None:
            ours = (f"{interval.mean:.1f} (95 % CI {interval.low:.1f} to {interval.high:.1f}, {interval.n} seeds)"
                    if interval.n > 1 else f"{interval.mean:.1f} (one seed)")
        else:
            ours = interval.text(1, " pts" if self.scale == 100 else "")  # points of accuracy, else raw units
        return f"| {self.row} | {self.paper} | {ours} | {self.verdict()} |"


def claims_table(claims: Sequence[Claim]) -> list[str]:
    """The verdict table, one line per paper row."""
    lines = ["| paper row / claim tested here | paper | ours (mean or paired difference, 95 % t interval) | verdict |",
             "|---|---|---|---|"]
    return lines + [c.markdown() for c in claims]


def per_seed_table(columns: dict[str, pd.Series], scale: float = 100.0) -> list[str]:
    """Per-seed values of each named arm (rows: seeds), then the mean ± std and the 95 % t interval."""
    names = list(columns)
    seeds = sorted(set().union(*[set(v.index) for v in columns.values()]))
    lines = ["| seed | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for seed in seeds:
        cells = [f"{scale * columns[n].get(seed):.1f}" if seed in columns[n].index else "" for n in names]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    stats = [t_interval(columns[n].to_numpy()).scaled(scale) for n in names]
    lines.append("| mean ± std | " + " | ".join(f"{i.mean:.1f} ± {i.std:.1f}" for i in stats) + " |")
    lines.append("| 95 % t interval | " + " | ".join(f"{i.low:.1f} to {i.high:.1f}" for i in stats) + " |")
    return lines


def frame_markdown(frame: pd.DataFrame) -> str:
    """A data frame as a markdown table (floats to 3 significant digits; no tabulate needed)."""
    def cell(value: object) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|---" * len(frame.columns) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


#: the code this process runs: the commit when it started (an edit during a long run does not change it)
STARTED_AT = git_state()


def header(title: str, command: str, load_before: str, seconds: float) -> list[str]:
    """The note's first lines: commit at the start, CPU, load before and after, run time, command."""
    return [f"# {title}", "", f"- Command: `{command}`", f"- Commit: {STARTED_AT}", f"- CPU: {cpu_model()}",
            f"- Load average (1 / 5 / 15 min) before: {load_before}; after: {load_text()}",
            f"- Run time: {seconds:.0f} s ({seconds / 60:.1f} min), one process, one run", ""]


def experiment_parser(doc: str, out: str, seeds: int) -> argparse.ArgumentParser:
    """The command line every Theseus experiment shares (``--out``, ``--results``, ``--seed``, ``--seeds``,
    ``--n``, ``--threads``, ``--resume``, ``--no-report``); each script adds its budgets."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(out))
    p.add_argument("--results", type=Path, default=None, help="also write the note here")
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--seeds", type=int, default=seeds, help="number of seeds")
    p.add_argument("--n", type=int, default=None, help="cap the conversion's samples (a smoke run)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: another job shares the cores)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no-report", action="store_true")
    return p


def run_experiment(args: argparse.Namespace, inputs: Callable[[], tuple[Any, Any, str, str]],
                   settings: simkit.ConvertSettings, note: NoteWriter) -> None:
    """Run one experiment and write its note to ``OUT/note.md`` (and ``--results``).

    ``inputs()`` gives ``(guide factory, data, guide name, data name)``; it runs inside the timed span."""
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # a script of its own: the whole process may flush
    load_before, started = load_text(), time.perf_counter()
    guide, data, guide_name, data_name = inputs()
    result = simkit.convert(guide, data, settings, run_dir=args.out, resume=args.resume, guide_name=guide_name,
                            data_name=data_name, progress=False)
    simkit.save_run(result, args.out, report=not args.no_report)
    text = note(result, f"python {shlex.join(sys.argv)}", load_before, time.perf_counter() - started)
    for path in [args.out / "note.md"] + ([args.results] if args.results else []):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(text)
