"""Docstring examples run: every module of the package whose source holds a ``>>>`` example is doctested, so
an example in the API reference (docs/api/) cannot go stale."""

from __future__ import annotations

import doctest
import importlib

import pytest

from tests.helpers import ROOT

#: modules whose docstrings are known to carry examples (the list below must find at least these)
EXPECTED = {"simkit.metrics.cka", "simkit.stats"}


def modules_with_examples() -> list[str]:
    """Dotted names of the package's modules whose source holds a ``>>>`` line."""
    found = []
    for path in sorted((ROOT / "simkit").rglob("*.py")):
        if any(line.lstrip().startswith(">>>") for line in path.read_text(encoding="utf-8").splitlines()):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def test_the_examples_are_found():
    assert EXPECTED <= set(modules_with_examples())


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    outcome = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert outcome.attempted > 0, name
    assert outcome.failed == 0, f"{outcome.failed} docstring example(s) of {name} failed"
