"""Result -> one self-contained HTML file (figures inline, no network).

Reports render data; they never compute. :data:`REPORT_KINDS` is the one table of what renders each
result kind: its context builder ``context(result) -> dict`` (``simkit.report.<kind>``) and its
template ``<kind>.html.j2`` in ``reports/templates`` (installed as ``simkit/templates``), which
extends ``base.html.j2``. A context may give ``findings`` (sentences computed from the summary: what is
similar, what passed, the gain) and ``cautions`` (what to distrust); the base template shows both first. Jinja autoescaping is on: everything displayed
is escaped unless a figure helper marks its own markup safe.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from simkit.errors import SimkitError
from simkit.faults import phase
from simkit.io import atomic_write
from simkit.plotting import figure_style
from simkit.report import compare, convert, graft, linearize, stitch, study, trend
from simkit.report.figures import collect_figures, format_number, meta_html
from simkit.results import FIGURE_VIEWS, HTML_VIEWS, RunResult
from simkit.rundir import locked

# result kind → (context builder, template); every kind of simkit.results.RESULT_KINDS has a row
# (tests/report/test_report.py checks that)
REPORT_KINDS: dict[str, tuple[Callable[[Any], dict[str, Any]], str]] = {
    "compare": (compare.context, "compare.html.j2"),
    "study": (study.context, "study.html.j2"),
    "convert": (convert.context, "convert.html.j2"),
    "stitch": (stitch.context, "stitch.html.j2"),
    "linearize": (linearize.context, "linearize.html.j2"),
    "graft": (graft.context, "graft.html.j2"),
    "trend": (trend.context, "trend.html.j2"),
}


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
    env.filters["meta_html"] = meta_html  # "How this run was made": readable values, never Python reprs
    return env


def render_html(result: RunResult) -> str:
    """The report's HTML text for ``result``."""
    if result.kind not in REPORT_KINDS:
        raise SimkitError(f"no report for result kind {result.kind!r}; known: {', '.join(sorted(REPORT_KINDS))}")
    build, template_name = REPORT_KINDS[result.kind]
    with figure_style():  # the figures' colour-blind-safe palette, for this build only (never global)
        context = {"findings": [], "cautions": [], **build(result)}
    template = environment().get_template(template_name)
    return template.render(result=result, summary=result.summary, meta=result.meta, **context)


_NOTEBOOK = """<div class="simkit-result" style="max-width: 1100px">
<style>.simkit-result .findings {background: #f3f7ff; border-left: 4px solid #1f77b4; padding: 0.4em 0.9em}
.simkit-result .cautions {background: #fff8e6; border-left: 4px solid #d9822b; padding: 0.4em 0.9em}
.simkit-result .heatmaps {display: flex; flex-wrap: wrap; gap: 0.5em 2em} .simkit-result .muted {color: #667085}</style>
<p><strong>{{ kind }}</strong> · {{ title }}</p>
{% if findings %}<div class="findings">{% for s in findings %}<p>{{ s }}</p>{% endfor %}</div>{% endif %}
{% if cautions %}<div class="cautions"><strong>Read with care</strong><ul>{% for c in cautions %}<li>{{ c }}</li>{% endfor %}</ul></div>{% endif %}
{% if heatmaps %}<div class="heatmaps">{% for h in heatmaps %}<div>{{ h.svg }}</div>{% endfor %}</div>{% endif %}
<p class="muted">simkit.save_run(result, DIR) writes the full report; result.plot(metric) a seaborn heatmap.</p>
</div>"""


def notebook_html(result: RunResult) -> str:
    """What ``result._repr_html_()`` shows in Jupyter: the report's findings and cautions, then its
    heatmaps (compare, study); the full report is ``save_run``'s."""
    build, _ = REPORT_KINDS[result.kind]
    with figure_style():
        context = {"findings": [], "cautions": [], "heatmaps": [], **build(result)}
    summary = result.summary
    title = (f"{summary.get('model_a')} vs {summary.get('model_b')} on {summary.get('data')}" if result.kind == "compare"
             else f"{len(summary.get('models', []))} models on {summary.get('data')}" if result.kind == "study"
             else ", ".join(f"{k} = {format_number(v)}" for k, v in list(summary.items())[:4]))
    return environment().from_string(_NOTEBOOK).render(
        kind=type(result).__name__, title=title, findings=context["findings"], cautions=context["cautions"],
        heatmaps=context["heatmaps"])


HTML_VIEWS.update(dict.fromkeys(REPORT_KINDS, notebook_html))


def report_figures(result: RunResult) -> dict[str, Callable[[], Any]]:
    """The figures of ``result``'s report, ``{file name: draw}`` (``result.savefig``, ``simkit report --figures``)."""
    return collect_figures(lambda: render_html(result), encode=False)[1]


FIGURE_VIEWS.update(dict.fromkeys(REPORT_KINDS, report_figures))


def render_report(result: RunResult, path: str | Path) -> Path:
    """Render ``result`` to ``path`` (written atomically) and return the path."""
    return atomic_write(path, lambda tmp: write_report(result, tmp))


def write_report(result: RunResult, path: Path) -> None:
    """Render ``result`` into the file ``path`` (plain write: the caller stages or renames it)."""
    html = render_html(result)
    phase("rendering")
    path.write_text(html, encoding="utf-8")


def save_run(result: RunResult, out: str | Path, report: bool = True) -> Path:
    """Write the run directory ``out``: the result's data files and ``report.html`` (unless told not to) as
    one set (``RunResult.save``: staged, then committed with ``result.json`` last), holding the directory's
    lock (``simkit.rundir.locked``: another run writing there is refused)."""
    with locked(out, result.kind):
        return result.save(out, render=(lambda path: write_report(result, path)) if report else None)
