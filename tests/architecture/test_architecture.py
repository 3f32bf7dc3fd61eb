"""Architecture rules that import-linter cannot state (pyproject's [tool.importlinter] holds the rest):
examples use only the public API, metrics never shard, nothing in the library imports the CLI, and the
public API names exist. Imports are read with ast, so a function-level import counts too."""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import simkit
from tests.helpers import ROOT

EXAMPLE_MODULES = {"simkit", "simkit.models", "simkit.data", "simkit.metrics", "simkit.stats"}
PUBLIC_FUNCTIONS = ("convert", "stitch", "linearize", "graft", "compare", "compare_caches", "study", "capture",
                    "load", "save_run", "render_report", "train_classifier", "evaluate_accuracy")
PUBLIC_CLASSES = ("CompareSettings", "ConvertSettings", "StitchSettings", "LinearizeSettings", "GraftSettings", "RunDir", "TrainConfig")


def module_name(path: Path) -> str:
    """``simkit/metrics/cka.py`` → ``simkit.metrics.cka`` (a package's ``__init__.py`` → the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, at any depth; ``from a import b``
    yields both ``a`` and ``a.b`` (b may be a submodule), relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def test_import_reader_resolves_relative_and_from_imports(tmp_path, monkeypatch):
    package = tmp_path / "simkit" / "metrics"
    package.mkdir(parents=True)
    source = package / "x.py"
    source.write_text("from .. import distributed\nfrom ..forward import eval_mode\n"
                      "def f():\n    import torch.distributed as dist\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    names = {name for _, name in imported(source)}
    assert {"simkit.distributed", "simkit.forward", "torch.distributed"} <= names


def test_examples_use_only_the_public_api():
    examples = python_files(ROOT / "examples")
    assert examples, "no examples found"
    bad = []
    for path in examples:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                # from simkit import models: a module of the public list; from simkit import convert: a public name
                names = [f"{module}.{a.name}" if f"{module}.{a.name}" in EXAMPLE_MODULES else module
                         for a in node.names]
                if module == "simkit":
                    bad += [f"{path.name}:{node.lineno}: simkit.{a.name} is not public" for a in node.names
                            if f"simkit.{a.name}" not in EXAMPLE_MODULES and a.name not in simkit.__all__]
            else:
                continue
            for name in dict.fromkeys(names):
                if name.split(".")[0] != "simkit":
                    continue
                if name not in EXAMPLE_MODULES or "runner" in name or "suite" in name:
                    bad.append(f"{path.name}:{node.lineno}: imports {name}")
    assert not bad, "examples may import only simkit, simkit.models, simkit.data, simkit.metrics, simkit.stats:\n" + "\n".join(bad)


def test_metrics_never_import_distributed():
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}"
           for path in python_files(ROOT / "simkit" / "metrics") for line, name in imported(path)
           if name in ("torch.distributed", "simkit.distributed")
           or name.startswith(("torch.distributed.", "simkit.distributed."))]
    assert not bad, "sharding belongs to the engine, not simkit.metrics:\n" + "\n".join(bad)


def test_library_never_imports_the_cli():
    """import-linter sees the CLI as the top-level ``cli`` (its directory), so it cannot catch an
    import of ``simkit.cli`` from below; this does."""
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}"
           for path in python_files(ROOT / "simkit") for line, name in imported(path)
           if name == "simkit.cli" or name.startswith("simkit.cli.")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
def test_public_functions_exist(name):
    assert name in simkit.__all__
    value = getattr(simkit, name)
    assert callable(value) and not inspect.isclass(value), name


@pytest.mark.parametrize("name", PUBLIC_CLASSES)
def test_public_classes_exist(name):
    assert name in simkit.__all__
    assert inspect.isclass(getattr(simkit, name)), name


#: the longest a function in simkit/ or cli/ may be (lines, decorators and docstring included)
MAX_FUNCTION_LINES = 100


def _functions(path: Path) -> Iterator[tuple[str, int]]:
    """``(qualified name, lines)`` of every function and method in ``path``, counted from its first
    decorator (or its ``def`` line when it has none) to its last line."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([d.lineno for d in node.decorator_list], default=node.lineno)
            yield f"{path.relative_to(ROOT)}:{node.name}", node.end_lineno - first + 1


def test_function_length_counts_from_the_first_decorator(tmp_path, monkeypatch):
    source = tmp_path / "x.py"
    source.write_text("@a\n@b(\n    1,\n)\ndef f():\n    pass\n\n\ndef g():\n    pass\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert dict(_functions(source)) == {"x.py:f": 6, "x.py:g": 2}


def test_no_function_is_longer_than_the_limit():
    long = [(name, lines) for folder in ("simkit", "cli") for path in sorted((ROOT / folder).rglob("*.py"))
            for name, lines in _functions(path) if lines > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into phases): {long}"


def test_compare_keeps_settings_in_one_object():
    """compare, compare_caches and study take a CompareSettings; their signatures keep only what is not a
    setting (models, data, layers, reduction, device, progress, names) plus keyword changes."""
    from simkit.metrics.settings import CompareSettings

    settings = {f for f in CompareSettings.__dataclass_fields__ if f != "validated"}
    for name in ("compare", "compare_caches", "study"):
        parameters = inspect.signature(getattr(simkit, name)).parameters
        assert "settings" in parameters and not settings & set(parameters), name
    assert len(inspect.signature(simkit.compare).parameters) <= 14
