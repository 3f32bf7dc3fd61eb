"""MkDocs hooks of the documentation site (mkdocs.yml `hooks:`), run at build time.

A page line `<!-- settings-table dotted.path.Class -->` becomes the table of that settings class's declared
fields (name, default, what it accepts, command-line flag, help), read from the declarations themselves
(`simkit.options.declarations`), so the API reference of the settings classes cannot drift from the code.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

_MARKER = re.compile(r"^<!-- settings-table ([\w.]+) -->$", re.MULTILINE)


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(field: Any) -> str:
    from simkit.options import default_of

    value = default_of(field)
    return "`" + (",".join(map(str, value)) if isinstance(value, list | tuple) else repr(value)) + "`"


def settings_table(path: str) -> str:
    """The Markdown table of the settings class at ``path`` (``module.Class``)."""
    from simkit.options import declarations

    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    rows = ["| field | default | accepts | flag | what it does |", "|---|---|---|---|---|"]
    for field_name, (field, declared) in declarations(cls).items():
        flag = (declared.flag or "--" + field_name.replace("_", "-")) if declared.cli else "library only"
        cells = [f"`{field_name}`", _default(field), declared.constraint.describe(), f"`{flag}`"
                 if declared.cli else flag, declared.help]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace every settings-table marker of a page by its generated table."""
    return _MARKER.sub(lambda match: settings_table(match.group(1)), markdown)
