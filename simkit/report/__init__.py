"""Result -> one self-contained HTML file (figures inline, no network).

Reports render data; they never compute. Each result kind has a module ``simkit.report.<kind>`` with
``context(result) -> dict`` and a template ``<kind>.html.j2`` in ``reports/templates`` (installed as
``simkit/templates``) that extends ``base.html.j2``. Jinja autoescaping is on: everything displayed
is escaped unless a figure helper marks its own markup safe.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from simkit.io import write_text

if TYPE_CHECKING:
    from simkit.results import RunResult


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The one Jinja environment, loading templates from the installed ``simkit.templates``."""
    folder = resources.files("simkit.templates")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = format_number
    return env


def format_number(value, digits: int = 4) -> str:
    """Numbers for tables: NaN as 'n/a', floats to ``digits`` significant digits."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if value != value:
            return "n/a"
        return f"{value:.{digits}g}"
    return str(value)


def render_html(result: RunResult) -> str:
    """The report's HTML text for ``result``."""
    builder = importlib.import_module(f"simkit.report.{result.kind}")
    context = builder.context(result)
    template = environment().get_template(f"{result.kind}.html.j2")
    return template.render(result=result, summary=result.summary, meta=result.meta, **context)


def render_report(result: RunResult, path: str | Path) -> Path:
    """Render ``result`` to ``path`` (written atomically) and return the path."""
    return write_text(path, render_html(result))
