"""Helpers shared by the test modules (import them: ``from tests.helpers import ROOT, invoke``).

Fixtures live in ``tests/conftest.py``; plain functions and constants that a test module must import live
here."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typer.testing import Result

#: the repository root (tests/ is one level below it, whatever folder a test module sits in)
ROOT = Path(__file__).resolve().parents[1]


def invoke(*args: object, env: Mapping[str, str] | None = None) -> Result:
    """Run ``simkit ARGS...`` in process through typer's CliRunner; every argument is passed as ``str(arg)``
    (so paths and numbers may be given as they are). Imported here, not at the top, so that a subprocess
    that only needs ``ROOT`` does not load the CLI."""
    from typer.testing import CliRunner

    from simkit.cli.main import app  # importing simkit.cli.main registers every command on the app

    return CliRunner().invoke(app, [str(a) for a in args], env=env)


# what wall-clock time decides in a result's summary and tables: durations, and graft's timed E3 check (the
# recompute-cost correlation, the bookkeeping fit, their intervals and the verdicts that follow from them)
TIMED_NAMES = ("e3_pass", "all_pass", "verdict")
TIMED_SUFFIXES = ("seconds", "time_s", "_s")
TIMED_PREFIXES = ("e3_cone_cost_correlation", "e3_bookkeeping_")


def is_timing(name: str) -> bool:
    """Whether a summary key or table column is decided by wall-clock time."""
    return name in TIMED_NAMES or name.endswith(TIMED_SUFFIXES) or name.startswith(TIMED_PREFIXES)


def without_timings(value):
    """``value`` (a summary: nested dicts and lists) without what wall-clock time decides (:func:`is_timing`)."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if not is_timing(k)}
    return [without_timings(v) for v in value] if isinstance(value, list) else value
