"""The command-line reference (``docs/cli-reference.md``), generated from the commands' declarations.

Every option of every command, its default and its help, read from the typer app (whose runner options
are generated from the settings classes' declarations), so the reference cannot drift from the code:
``tests/cli/test_generated_options.py`` checks the committed file against :func:`reference_markdown`.
Regenerate with ``python -m simkit.cli.reference > docs/cli-reference.md``.
"""

from __future__ import annotations

import re
from typing import Any

import typer

HEADER = ("# Command-line reference\n\n"
          "Generated from the option declarations (`python -m simkit.cli.reference > docs/cli-reference.md`); "
          "a test keeps it equal to the code. Exit codes: 0 success, 2 bad input (one line on stderr), "
          "1 internal error.\n")
_DEFAULT = re.compile(r"\s*\\?\[default: ([^\]]*)\]$")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(param: Any) -> str:
    """The default as help shows it (a ``[default: …]`` in the help text wins)."""
    written = _DEFAULT.search(param.help or "")
    if written:
        return written.group(1)
    if param.required:
        return "required"
    if param.is_flag if hasattr(param, "is_flag") else False:
        return "off" if not param.default else "on"
    if param.default is None or param.show_default is False:
        return ""
    if isinstance(param.default, list | tuple):
        return ",".join(str(v) for v in param.default)
    return str(param.default)


def _row(param: Any) -> str:
    names = " / ".join(f"`{name}`" for name in [*param.opts, *param.secondary_opts]) \
        if param.param_type_name == "option" else f"`{(param.name or '').upper()}`"
    help_text = _DEFAULT.sub("", param.help or "")
    return f"| {names} | {_cell(_default(param))} | {_cell(help_text)} |"


def command_markdown(name: str, command: Any) -> str:
    """One command's section: its help, then a table of its arguments and options."""
    rows = [_row(p) for p in command.params if p.name != "help"]
    return "\n".join([f"## `simkit {name}`", "", _cell(command.help or ""), "",
                      "| option | default | what it does |", "|---|---|---|", *rows, ""])


def reference_markdown() -> str:
    """The whole reference: every command of ``simkit`` in alphabetical order."""
    from simkit.cli.main import app

    group = typer.main.get_command(app)
    commands = group.commands  # type: ignore[attr-defined]
    return "\n".join([HEADER, *(command_markdown(name, commands[name]) for name in sorted(commands))])


if __name__ == "__main__":
    print(reference_markdown(), end="")
