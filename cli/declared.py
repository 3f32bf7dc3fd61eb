"""A command's options generated from its settings class's declarations (``simkit.options``).

``@command(..., settings=CompareSettings)`` (``simkit.cli.common``) replaces the command function's
``settings`` parameter by one typer option per declared field (:func:`settings_parameters`: its flag,
help, type, default and choices, all from the declaration) and, when the command runs, builds the
settings object from what was typed (:func:`settings_from_cli`) and validates it once. So an option of a
runner is declared once, on its settings field, and the command line, ``--help``, the README's options
tables and the generated option test all read that declaration.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from simkit.options import (
    Auto,
    Declaration,
    Flag,
    Names,
    Numbers,
    Optional,
    cli_default_text,
    declarations,
    default_of,
)

FLAG = ""  # the type column of a flag: nothing
LIST = "A,B,..."  # the type column of a comma-list option


def flag_of(name: str, decl: Declaration) -> str:
    """The option's flag: the declared one, else ``--`` + the field name with dashes."""
    return decl.flag or "--" + name.replace("_", "-")


def _is_list(decl: Declaration) -> bool:
    return isinstance(decl.constraint, Names | Numbers)


def _cli_annotation(decl: Declaration, default: Any) -> Any:
    """The type typer parses: a list option is repeatable (comma lists allowed) and None when not given."""
    kind = decl.constraint.cli_type()
    if _is_list(decl):
        return list[str] | None
    if default is None and not isinstance(decl.constraint, Optional | Auto):
        return kind | None
    return kind


def _show_default(decl: Declaration, default: Any) -> str | bool:
    if decl.show_default is not None:
        return decl.show_default
    if default is None:
        return False
    if isinstance(decl.constraint, Flag):
        return False
    return cli_default_text(default) if _is_list(decl) else True


def _help(text: str, shown: str | bool) -> str:
    """The help, with a default as the user types it (``[default: a,b]``) where typer would show it in
    parentheses."""
    return f"{text} \\[default: {shown}]" if isinstance(shown, str) else text  # escaped: rich reads [..] as markup


def _metavar(decl: Declaration) -> str | None:
    if decl.metavar is not None:
        return decl.metavar
    return FLAG if isinstance(decl.constraint, Flag) else LIST if _is_list(decl) else None


def settings_parameters(cls: type, skip: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """One keyword-only typer parameter per declared field of ``cls`` that has a flag (``cli=True``),
    except ``skip``."""
    params = []
    for name, (f, decl) in declarations(cls).items():
        if not decl.cli or name in skip:
            continue
        default = default_of(f)
        shown = _show_default(decl, default)
        info = typer.Option(flag_of(name, decl), *decl.aliases, help=_help(decl.help, shown),
                            metavar=_metavar(decl), show_default=shown is True)
        cli_default = None if _is_list(decl) else cli_default_text(default) if isinstance(decl.constraint, Auto) \
            else default
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=cli_default,
                                        annotation=Annotated[_cli_annotation(decl, default), info]))
    return params


def settings_from_cli(cls: type, values: dict[str, Any]) -> Any:
    """The validated settings ``cls`` from the command line's values of its options (a list option not
    given takes its declared default; ``none`` alone is the empty list where the declaration allows it)."""
    kwargs = {}
    for name, (f, decl) in declarations(cls).items():
        if name not in values:
            continue
        value = values[name]
        if _is_list(decl):
            value = _list_value(value, decl, default_of(f))
        kwargs[name] = value
    return cls(**kwargs).validate()


def _list_value(value: list[str] | None, decl: Declaration, default: Any) -> Any:
    parts = [part.strip() for item in value or [] for part in item.split(",") if part.strip()]
    if not parts:
        return default
    if isinstance(decl.constraint, Names) and decl.constraint.empty and [p.lower() for p in parts] == ["none"]:
        return []
    return ",".join(parts) if isinstance(decl.constraint, Numbers) else parts  # one number alone stays one
