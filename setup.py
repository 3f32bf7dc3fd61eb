"""Only the package list lives here (everything else is in pyproject.toml): found from the tree, so a new
subpackage cannot drop out of the wheel. ``simkit.cli`` is the top-level ``cli/`` and ``simkit.templates``
is ``reports/templates/`` (``[tool.setuptools] package-dir``)."""

from setuptools import find_packages, setup

# package name → directory, as in pyproject's package-dir
ROOTS = {"simkit": "simkit", "simkit.cli": "cli", "simkit.templates": "reports/templates"}


def packages() -> list[str]:
    """Every package under each root: the root itself and each subdirectory with an __init__.py."""
    found: list[str] = []
    for name, directory in ROOTS.items():
        found += [name, *(f"{name}.{sub}" for sub in find_packages(directory))]
    # a directory under simkit/ that is also a mapped root (none today) would otherwise appear twice
    return sorted(set(found))


setup(packages=packages())
