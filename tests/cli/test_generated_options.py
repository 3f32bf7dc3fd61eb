"""One generated test over every settings class and every declared option (``simkit.options``).

For each settings class in ``simkit.settings``: the defaults validate; every declared field, given a value
its constraint refuses, raises a SimkitError naming the field (which the command turns into its flag); a
validated object is frozen and validated once. For each command built from a settings class: the CLI's
defaults give exactly the library's defaults, every declared flag shows in ``--help``, and the committed
command-line reference equals the one generated from the declarations.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path

import pytest
import typer

import simkit.settings
from simkit.cli.common import cli_message, command_flags
from simkit.cli.declared import flag_of, settings_from_cli
from simkit.cli.main import app
from simkit.cli.reference import reference_markdown
from simkit.errors import SimkitError
from simkit.options import Settings, declarations, default_of
from tests.helpers import invoke

ROOT = Path(__file__).resolve().parents[2]
#: the fields a settings class needs beyond its defaults to describe a run at all
REQUIRED: dict[str, dict] = {"StitchSettings": {"layers": "auto"}}


def invoke_wide(*args: str):
    return invoke(*args, env={"COLUMNS": "250"})


def settings_classes() -> list[type]:
    for module in pkgutil.iter_modules(simkit.settings.__path__):
        importlib.import_module(f"simkit.settings.{module.name}")
    found, todo = [], list(Settings.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("simkit.settings."):
            found.append(cls)
    return sorted(found, key=lambda c: c.__name__)


def declared_fields() -> list[tuple[type, str]]:
    return [(cls, name) for cls in settings_classes() for name in declarations(cls)]


def settings_commands() -> list[tuple[str, object]]:
    return [(info.name, info.callback) for info in app.registered_commands
            if getattr(info.callback, "__settings_class__", None) is not None]


def minimal(cls: type):
    return cls(**REQUIRED.get(cls.__name__, {}))


def test_every_runner_has_a_settings_class():
    names = {cls.__name__ for cls in settings_classes()}
    assert {"CompareSettings"} <= names
    assert len(settings_commands()) >= 1


@pytest.mark.parametrize("cls", settings_classes(), ids=lambda c: c.__name__)
def test_defaults_validate_frozen_and_once(cls):
    settings = minimal(cls).validate()
    assert settings.is_validated and settings.validate() is settings
    name = next(iter(declarations(cls)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(settings, name, default_of(declarations(cls)[name][0]))
    assert not settings.updated(**{name: getattr(settings, name)}).is_validated or not declarations(cls)


@pytest.mark.parametrize(("cls", "name"), declared_fields(), ids=lambda x: getattr(x, "__name__", x))
def test_an_invalid_value_names_the_field(cls, name):
    _, decl = declarations(cls)[name]
    bad = decl.constraint.invalid()
    with pytest.raises(SimkitError, match=f"`{name}`|{name.replace('_', ' ')}|unknown") as info:
        dataclasses.replace(minimal(cls), **{name: bad}).validate()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("command", "callback"), settings_commands(), ids=lambda x: getattr(x, "__name__", x))
def test_cli_defaults_are_the_library_defaults(command, callback):
    import inspect

    cls = callback.__settings_class__
    params = inspect.signature(callback).parameters
    given = {name: params[name].default for name in declarations(cls) if name in params}
    from_cli = settings_from_cli(cls, {**given, **REQUIRED.get(cls.__name__, {})})
    assert from_cli.to_dict() == minimal(cls).validate().to_dict()


@pytest.mark.parametrize(("command", "callback"), settings_commands(), ids=lambda x: getattr(x, "__name__", x))
def test_every_flag_shows_in_help_and_names_its_errors(command, callback):
    cls = callback.__settings_class__
    text = invoke_wide(command, "--help").output
    flags = command_flags(callback)
    for name, (_, decl) in declarations(cls).items():
        if not decl.cli:
            continue
        flag = flag_of(name, decl).split("/")[0]
        assert flag in text, flag
        assert flag in cli_message(f"`{name}` must be positive, got 0", flags)


def test_cli_reference_is_generated_from_the_declarations():
    committed = (ROOT / "docs" / "cli-reference.md").read_text(encoding="utf-8")
    assert committed == reference_markdown(), "regenerate: python -m simkit.cli.reference > docs/cli-reference.md"


def test_null_help_comes_from_the_catalogue():
    from simkit.catalog import DEFAULT_SAMPLED_NULL, null_help

    text = " ".join(invoke_wide("compare", "--help").output.replace("│", " ").split())
    assert f"{DEFAULT_SAMPLED_NULL} permutations of the stored activations" in null_help()
    assert "10 when every metric is a minibatch CKA" not in text


def test_typer_is_used_through_its_public_api_only():
    for path in (ROOT / "cli").glob("*.py"):
        source = path.read_text(encoding="utf-8")
        assert "typer._" not in source and "__class__ =" not in source, path.name
    assert typer.TyperException  # the public base the group catches


def test_settings_and_the_cli_declarations_import_without_torch():
    """The command line builds its options from the settings classes: they must not import torch."""
    import subprocess
    import sys

    modules = ", ".join(f"simkit.settings.{m.name}" for m in pkgutil.iter_modules(simkit.settings.__path__))
    code = f"import sys, {modules}, simkit.options, simkit.cli.declared; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
