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
