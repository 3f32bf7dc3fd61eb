"""A wheel built from the repo carries the CLI and the templates inside the simkit namespace."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_contents(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path),
                    str(ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("simkit-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "simkit/cli/main.py" in names and "simkit/cli/compare.py" in names
    assert "simkit/templates/base.html.j2" in names and "simkit/templates/compare.html.j2" in names
    top = {name.split("/")[0] for name in names}
    assert "cli" not in top and "reports" not in top
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "simkit = simkit.cli.main:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_help_is_instant_and_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "simkit.cli.main", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for name in ("compare", "layers", "report", "capture", "graft", "convert", "stitch", "linearize", "napl"):
        assert name in out
