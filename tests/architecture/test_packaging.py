"""A wheel built from the repo carries every subpackage, the CLI and the templates inside the simkit
namespace. The expected contents are discovered from the tree (never listed), so a subpackage added
later is checked too."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT

# installed package name → source directory (pyproject's [tool.setuptools] package-dir)
ROOTS = {"simkit": ROOT / "simkit", "simkit/cli": ROOT / "cli", "simkit/templates": ROOT / "reports" / "templates"}
TEMPLATE_SUFFIXES = (".j2", ".css", ".js")


def expected_files() -> set[str]:
    """Every module of every package (a directory with an __init__.py) under simkit/ and cli/, and
    every template file, by its path inside the wheel."""
    expected: set[str] = set()
    for name, directory in ROOTS.items():
        for init in directory.rglob("__init__.py"):
            package = init.parent
            if "__pycache__" in package.parts or not all(
                    (p / "__init__.py").is_file() for p in [package, *package.parents] if p.is_relative_to(directory)):
                continue  # a directory below a non-package is not a subpackage
            expected |= {f"{name}/{m.relative_to(directory).as_posix()}" for m in package.glob("*.py")}
    templates = ROOTS["simkit/templates"]
    expected |= {f"simkit/templates/{f.name}" for f in templates.iterdir() if f.suffix in TEMPLATE_SUFFIXES}
    return expected


def _source_copy(dest: Path) -> Path:
    """The files a build reads, copied: building in the working tree would leave build/ there, whose
    stale files (modules deleted since) a later wheel could pick up."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("simkit", "cli", "reports"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, dest / name)
    return dest


def test_expected_files_are_discovered():
    expected = expected_files()
    assert {"simkit/__init__.py", "simkit/cli/main.py", "simkit/templates/base.html.j2"} <= expected
    assert any(name.startswith("simkit/metrics/") for name in expected)


@pytest.mark.slow
def test_wheel_contents(tmp_path):
    source = _source_copy(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                    str(source)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("simkit-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(expected_files() - names)
    assert not missing, f"the wheel lacks {missing}"
    top = {name.split("/")[0] for name in names}
    assert "cli" not in top and "reports" not in top
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "simkit = simkit.cli.main:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_help_is_instant_and_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "simkit.cli.main", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for name in ("compare", "layers", "report", "capture", "graft", "convert", "stitch", "linearize", "napl"):
        assert name in out
