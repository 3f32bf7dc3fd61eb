"""The documentation site covers the code: every public name of ``simkit``, ``simkit.metrics`` and every
settings class has its API reference entry, every page is in the site's navigation, and the README stays a
one-screen map into the site whose test command is the one CI runs (``mkdocs build --strict`` in .ci/run
checks links, anchors and the executed tutorials)."""

from __future__ import annotations

import dataclasses
import importlib
import re

import simkit
from simkit.options import Settings
from tests.helpers import ROOT

DOCS = ROOT / "docs"
API = DOCS / "api"
#: public names of ``simkit`` not loaded through ``_LAZY``, and where their reference lives
DIRECT = {"load": "simkit.load", "SimkitError": "simkit.errors.SimkitError", "__version__": "simkit.__version__"}


def nav_pages() -> list[str]:
    """Every page the navigation of mkdocs.yml lists (paths relative to docs/)."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:"):]
    return re.findall(r":\s+(\S+\.(?:md|py))\s*$", nav, flags=re.MULTILINE)


def settings_classes() -> list[str]:
    """``module.Class`` of every settings class of ``simkit.settings`` and the training config."""
    found = []
    for path in sorted((ROOT / "simkit" / "settings").glob("*.py")):
        module = importlib.import_module(f"simkit.settings.{path.stem}")
        for name, value in vars(module).items():
            if (isinstance(value, type) and issubclass(value, Settings) and value is not Settings
                    and dataclasses.is_dataclass(value) and value.__module__ == module.__name__
                    and value.__name__ == name):  # not an alias (MeasureSettings = CompareSettings)
                found.append(f"{module.__name__}.{name}")
    return [*found, "simkit.training.config.TrainConfig"]


def test_every_public_name_of_simkit_has_its_api_entry():
    text = (API / "simkit.md").read_text(encoding="utf-8")
    for name in simkit.__all__:
        target = DIRECT.get(name) or f"{simkit._LAZY[name]}.{name}"
        assert f"::: {target}\n" in text, f"docs/api/simkit.md lacks '::: {target}'"


def test_the_metrics_reference_renders_the_package_and_every_settings_class_has_its_table():
    assert "::: simkit.metrics\n" in (API / "metrics.md").read_text(encoding="utf-8")  # its __all__, whole
    text = (API / "settings.md").read_text(encoding="utf-8")
    for path in settings_classes():
        assert f"<!-- settings-table {path} -->" in text, path
        assert f"::: {path}\n" in text, path


def test_every_page_is_in_the_navigation_and_every_entry_exists():
    listed = nav_pages()
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")} | \
        {str(p.relative_to(DOCS)) for p in (DOCS / "tutorials").glob("*.py")}
    assert sorted(listed) == sorted(on_disk)
    assert len(listed) == len(set(listed))


def test_the_readme_fits_on_a_screen_and_maps_every_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode("utf-8")) <= 10 * 1024
    for page in nav_pages():
        assert f"](docs/{page})" in readme, f"README.md does not link docs/{page}"


def test_the_readme_test_command_is_the_one_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.startswith("python3 -m venv .venv")]
    assert len(ci) == 1 and f"\n    {ci[0]}\n" in readme
    assert "mkdocs build --strict" in ci[0] and ".[test,docs]" in ci[0]
