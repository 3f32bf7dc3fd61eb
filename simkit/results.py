"""Results are data: a summary, tidy tables and metadata, saved as ``result.json`` plus CSV files.

Every runner returns one of the result kinds defined here, all listed in :data:`RESULT_KINDS` (the
one table of kinds: ``simkit.load`` and the report layer look a kind up there). A run directory holds
``result.json`` (``kind``, ``summary``, ``meta``, ``extra`` and the list of tables) and one
``<table>.csv`` per table; ``report.html`` is the report layer's (``simkit.report.save_run``).
``simkit.load(dir)`` reads any run directory back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from simkit.catalog import colour_bounds
from simkit.errors import SimkitError
from simkit.faults import phase
from simkit.io import STAGED, file_sha256, stage, stage_csv, write_json

# How a result shows itself in a notebook (``_repr_html_``): result kind → HTML builder. The report layer
# fills it when imported (``simkit.report``, which ``simkit.engine`` and ``simkit.load`` import); results
# stay data and never import it.
HTML_VIEWS: dict[str, Callable[[Any], str]] = {}
# The figures of a result's report (``savefig``): result kind → function returning {file name: draw()}, in
# the report's order; filled by the report layer like HTML_VIEWS.
FIGURE_VIEWS: dict[str, Callable[[Any], dict[str, Callable[[], Any]]]] = {}


@dataclass
class RunResult:
    """Base of every result.

    summary: the run's headline numbers (JSON-able); the contract other tools script against.
    tables: tidy DataFrames, each saved as ``<name>.csv``.
    meta: how the run was made (command, versions, seeds, specs, timings).
    extra: other JSON-able data the report draws (curves, histograms, small images).
    """

    kind: ClassVar[str] = "run"
    main_table: ClassVar[str] = ""
    # table → the columns every run of this kind has (checked when a run directory is read back)
    required_columns: ClassVar[dict[str, tuple[str, ...]]] = {}

    summary: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def _repr_html_(self) -> str | None:
        """Jupyter's rich display: the report's findings, cautions and heatmaps inline (None, i.e. the plain
        repr, only when the report layer was never imported)."""
        view = HTML_VIEWS.get(self.kind)
        return view(self) if view is not None else None

    def figures(self) -> dict[str, Callable[[], Any]]:
        """The report's figures, ``{file name: draw}`` in the report's order (``draw()`` makes the matplotlib
        Figure); the names ``savefig`` and ``simkit report DIR --figures`` give the files."""
        view = FIGURE_VIEWS.get(self.kind)
        if view is None:
            raise SimkitError("the report layer is not loaded: `import simkit.report` (simkit.load and every "
                              "simkit runner load it), then call savefig again")
        return view(self)

    def savefig(self, path: str | Path, formats: str | Sequence[str] | None = None,
                name: str | None = None) -> list[Path]:
        """Write the report's figures as files and return their paths.

        path: a folder (created when missing): every figure as ``<path>/<name>.<format>`` for each of
            ``formats`` (a comma list or sequence from png, pdf, svg; default all three); or a file name
            ending in .png, .pdf or .svg: the figure ``name`` (default: the report's first) in that format.
        Text is at least 9 pt at print size and stays text in pdf and svg; colours are colour-blind safe.
        """
        from simkit.plotting import FIGURE_FORMATS, parse_formats, write_figures

        path = Path(path)
        single = path.suffix.lower().lstrip(".") in FIGURE_FORMATS
        if single and formats is not None:
            raise SimkitError(f"`path` {path} names one file, so its suffix is the format; drop `formats` or "
                              "pass a folder")
        chosen = (path.suffix.lower().lstrip("."),) if single else parse_formats(formats or FIGURE_FORMATS)
        if not single and path.exists() and not path.is_dir():
            raise SimkitError(f"`path` {path} is an existing file; pass a folder or a file ending in "
                              f".{', .'.join(FIGURE_FORMATS)}")
        figures = _chosen_figures(self.figures(), name, single, self.kind)
        if single:
            (draw,) = figures.values()
            return write_figures({path.stem: draw}, path.parent, chosen)
        return write_figures(figures, path, chosen)

    def to_frame(self) -> pd.DataFrame:
        """The main table as a pandas DataFrame (a copy)."""
        name = self.main_table or next(iter(self.tables))
        return self.tables[name].copy()

    def save(self, out: str | Path, render: Callable[[Path], object] | None = None) -> Path:
        """Write the run directory's files as one set: the CSV tables (and the report, when ``render(path)``
        writes it) are staged beside the earlier run's, then the earlier ``result.json`` is removed, the
        staged files renamed into place and the new ``result.json`` written last, naming each table's
        sha256 (``files``). A kill before the commit leaves the earlier run as it was; during it, a
        directory without ``result.json`` (clearly incomplete); :func:`load` refuses a set whose tables do
        not match their ``result.json``. ``simkit.report.save_run(result, out)`` saves and renders.
        """
        out = _run_directory(out)
        staged: dict[Path, Path] = {}
        try:
            for name, frame in self.tables.items():
                staged[out / f"{name}.csv"] = stage_csv(out / f"{name}.csv", frame)
            if render is not None:
                staged[out / "report.html"] = stage(out / "report.html", render)
            record = {**self._record(), "files": {path.name: file_sha256(staged_path)
                                                  for path, staged_path in staged.items() if path.suffix == ".csv"}}
            phase("writing")
            _commit(out, staged, render is not None)
        finally:
            for staged_path in staged.values():  # what a failure left staged (after the commit: nothing)
                staged_path.unlink(missing_ok=True)
        write_json(out / "result.json", record)
        return out

    def _record(self) -> dict[str, Any]:
        """What ``result.json`` holds besides the tables' digests."""
        return {"kind": self.kind, "summary": self.summary, "meta": self.meta, "tables": sorted(self.tables),
                "extra": self.extra, "text_columns": {name: text_columns(frame) for name, frame in self.tables.items()}}

    @classmethod
    def from_dir(cls, run_dir: Path, data: dict[str, Any]) -> RunResult:
        """The result saved in ``run_dir`` from its parsed result.json ``data`` and the CSV tables it lists."""
        missing = [f"{name}.csv" for name in data.get("tables", []) if not (run_dir / f"{name}.csv").is_file()]
        if missing:
            raise SimkitError(f"{run_dir} is incomplete: {', '.join(missing)} is missing; "
                              "rerun the command that wrote it")
        text = data.get("text_columns", {})
        if not isinstance(text, dict) or not all(isinstance(v, list) for v in text.values()):
            raise SimkitError(f"{run_dir / 'result.json'}: text_columns is not a mapping of table names to "
                              "column lists; rerun the command that wrote it")
        if "files" in data:
            _check_files(run_dir, data["files"])
        tables = {name: _read_table(run_dir, name, text.get(name, [])) for name in data.get("tables", [])}
        for name, needed in cls.required_columns.items():
            lacking = [c for c in needed if name in tables and c not in tables[name].columns]
            if lacking:
                raise SimkitError(f"{run_dir / (name + '.csv')} lacks the column(s) {', '.join(lacking)} of a "
                                  f"{cls.kind} run; rerun the command that wrote it")
        for key in ("summary", "meta", "extra"):
            if not isinstance(data.get(key, {}), dict):
                raise SimkitError(f"{run_dir / 'result.json'}: {key!r} is not a JSON object; rerun the command "
                                  "that wrote it")
        return cls(summary=data.get("summary", {}), tables=tables,
                   meta=data.get("meta", {}), extra=data.get("extra", {}))


def _run_directory(out: str | Path) -> Path:
    """``out`` as a directory (created when missing), without the staged files of an interrupted save."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SimkitError(f"`out` {out} is an existing file, not a directory; choose another `out`")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimkitError(f"cannot create the run directory {out} ({exc.strerror}); choose another `out`") from None
    for leftover in [*out.glob(f".*{STAGED}"), *out.glob(".*.tmp")]:  # a killed save's (the lock is ours)
        leftover.unlink(missing_ok=True)
    return out


def _commit(out: Path, staged: dict[Path, Path], with_report: bool) -> None:
    """Replace the earlier run's files by the staged ones: its ``result.json`` first (from then on the
    directory is incomplete until the new one is written), then every staged file renamed into place; an
    earlier report that this run does not replace is removed (it described another run)."""
    (out / "result.json").unlink(missing_ok=True)
    if not with_report:
        (out / "report.html").unlink(missing_ok=True)
    for path, staged_path in staged.items():
        staged_path.replace(path)


def _check_files(run_dir: Path, files: Any) -> None:
    """Each table a ``result.json`` names with its sha256 (``files``) has those bytes; else the directory
    mixes two runs' files."""
    if not isinstance(files, dict):
        raise SimkitError(f"{run_dir / 'result.json'}: 'files' is not a mapping of file names to digests; rerun "
                          "the command that wrote it")
    for name, digest in files.items():
        if file_sha256(run_dir / str(name)) != digest:
            raise SimkitError(f"{run_dir / str(name)} does not match {run_dir / 'result.json'} (another run's, or "
                              "changed since): the directory mixes two runs' files; rerun the command that wrote it")


def _chosen_figures(figures: dict[str, Callable[[], Any]], name: str | None, single: bool,
                    kind: str) -> dict[str, Callable[[], Any]]:
    """``figures`` (all) or the one named ``name`` (``single``: the first when no name is given); a
    SimkitError naming the known figures for an unknown name or a report without figures."""
    if not figures:
        raise SimkitError(f"this {kind} result's report has no figures to save")
    if name is None:
        return dict([next(iter(figures.items()))]) if single else figures
    if name not in figures:
        raise SimkitError(f"`name` {name!r} is not a figure of this {kind} result; its figures: {', '.join(figures)}")
    return {name: figures[name]}


def _read_table(run_dir: Path, name: str, text: list[str]) -> pd.DataFrame:
    """``run_dir/<name>.csv`` as written by ``RunResult.save``; a SimkitError for an unreadable file."""
    path = run_dir / f"{name}.csv"
    try:
        # only an empty field is missing: every table is written by to_csv, which writes NaN as "", and
        # pandas' default NA spellings ("NA", "nan", "None", ...) are valid layer and model names
        return pd.read_csv(path, keep_default_na=False, na_values=[""],
                           converters=dict.fromkeys(text, _as_text))
    except pd.errors.EmptyDataError:
        raise SimkitError(f"{path} is empty; rerun the command that wrote it") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise SimkitError(f"{path} is not a readable CSV table ({first}); rerun the command that wrote it") from None


# ------------------------------------------------------------------------------------ the result kinds


def _metric_rows(frame: pd.DataFrame, metric: str | None, what: str) -> tuple[str, pd.DataFrame]:
    """``(metric, rows of that metric)``; ``metric=None`` means the only one (a SimkitError when several)."""
    known = list(dict.fromkeys(frame["metric"]))
    if metric is None:
        if len(known) != 1:
            raise SimkitError(f"this {what} holds several metrics ({', '.join(known)}); pass one of them as `metric`")
        metric = known[0]
    if metric not in known:
        raise SimkitError(f"metric {metric!r} is not in this {what}; it has: {', '.join(sorted(known))}")
    return metric, frame[frame["metric"] == metric]


@dataclass
class CompareResult(RunResult):
    """Layer × layer similarity of two models.

    tables: ``similarity`` (layer_a, layer_b, metric, value[, null_mean, null_p95]) and ``layers``
    (model, name, type, shape, reduction, dim).
    """

    kind: ClassVar[str] = "compare"
    main_table: ClassVar[str] = "similarity"
    required_columns: ClassVar[dict[str, tuple[str, ...]]] = {"similarity": ("layer_a", "layer_b", "metric", "value"), "layers": ("model", "name")}

    def matrix(self, metric: str | None = None, column: str = "value") -> pd.DataFrame:
        """(L_a, L_b) DataFrame of ``metric`` (default: the only one): rows are A's layers, columns B's,
        in model order."""
        _, rows = _metric_rows(self.tables["similarity"], metric, "result")
        layers = self.tables["layers"]
        order_a = list(layers.loc[layers["model"] == "a", "name"])
        order_b = list(layers.loc[layers["model"] == "b", "name"])
        wide = rows.pivot(index="layer_a", columns="layer_b", values=column)
        return wide.reindex(index=order_a, columns=order_b)

    def plot(self, metric: str | None = None, *, ax: Any = None, annot: bool | None = None, **heatmap: Any):
        """``seaborn.heatmap`` of ``matrix(metric)`` (default: the only metric, else unbiased_cka, else the
        first): rows A's layers, columns B's. ``ax``: draw there; ``annot``: print the values (default:
        when at most 12 × 12); other keywords go to seaborn. Needs seaborn (``pip install seaborn``, or
        the ``notebook`` extra). Returns the matplotlib Figure: shown inline as a notebook cell's value,
        never a pyplot figure (``fig.savefig(path)`` in a script; the backend is left alone)."""
        metric = _plot_metric(self.summary, self.tables["similarity"], metric, "result")
        return heatmap_figure(self.matrix(metric), metric, f"B: {self.summary.get('model_b', 'B')}",
                              f"A: {self.summary.get('model_a', 'A')}", ax=ax, annot=annot, **heatmap)


@dataclass
class StudyResult(RunResult):
    """Model × model similarity. Table ``study``: model_a, model_b, layer_a, layer_b, metric, value."""

    kind: ClassVar[str] = "study"
    main_table: ClassVar[str] = "study"
    required_columns: ClassVar[dict[str, tuple[str, ...]]] = {"study": ("model_a", "model_b", "metric", "value")}

    def matrix(self, metric: str | None = None) -> pd.DataFrame:
        """(M, M) DataFrame of ``metric`` (default: the only one) between the studied models, in order."""
        _, rows = _metric_rows(self.tables["study"], metric, "study")
        order = list(self.summary["models"])
        return rows.pivot(index="model_a", columns="model_b", values="value").reindex(index=order, columns=order)

    def plot(self, metric: str | None = None, *, ax: Any = None, annot: bool | None = None, **heatmap: Any):
        """``seaborn.heatmap`` of the model × model ``matrix(metric)`` (as :meth:`CompareResult.plot`)."""
        metric = _plot_metric(self.summary, self.tables["study"], metric, "study")
        return heatmap_figure(self.matrix(metric), metric, "model B", "model A", ax=ax, annot=annot, **heatmap)


def _plot_metric(summary: dict[str, Any], frame: pd.DataFrame, metric: str | None, what: str) -> str:
    """``metric`` checked; None: the only metric, else unbiased_cka when there, else the first."""
    known = list(dict.fromkeys(frame["metric"]))
    if metric is None:
        metric = known[0] if len(known) == 1 else "unbiased_cka" if "unbiased_cka" in known else known[0]
    return _metric_rows(frame, metric, what)[0]


def heatmap_figure(frame: pd.DataFrame, title: str, xlabel: str, ylabel: str, *, ax: Any = None,
                   annot: bool | None = None, **heatmap: Any):
    """A seaborn heatmap of ``frame`` (R, C) on ``ax`` (default: a new figure sized to the frame, on its own
    Agg canvas: never a pyplot figure, so the user's backend and figures stay as they were, and it shows
    inline in Jupyter as the cell's value); long labels shortened in the middle; bounded measures get
    their range from the catalogue (simkit.catalog). Returns the Figure."""
    try:
        import seaborn as sns
    except ImportError:
        raise SimkitError("plot() draws with seaborn, which is not installed: pip install seaborn "
                          "(or pip install 'simkit[notebook]')") from None
    from simkit.plotting import agg_figure, figure_style, shorten

    if annot is None:
        annot = max(frame.shape) <= 12
    lo, hi = colour_bounds(title)
    if lo is not None:
        heatmap.setdefault("vmin", lo)
        heatmap.setdefault("vmax", hi)
    heatmap.setdefault("xticklabels", [shorten(str(c)) for c in frame.columns])
    heatmap.setdefault("yticklabels", [shorten(str(r)) for r in frame.index])
    with figure_style():
        if ax is None:
            rows, cols = frame.shape
            ax = agg_figure(min(14.0, 2.5 + 0.45 * cols), min(12.0, 2.0 + 0.4 * rows)).add_subplot(1, 1, 1)
        sns.heatmap(frame.astype(float), ax=ax, annot=annot, fmt=".2f", cmap=heatmap.pop("cmap", "viridis"),
                    square=heatmap.pop("square", True), cbar_kws={"label": title}, **heatmap)
        ax.set_title(title)
        ax.set_xlabel(shorten(xlabel, 60))
        ax.set_ylabel(shorten(ylabel, 60))
    return ax.figure


@dataclass
class ConvertResult(RunResult):
    """A conversion run (Network of Theseus).

    summary: guide/converted/scratch/kd ``_accuracy`` (``_perplexity`` for language models) of the first
    (schedule, metric, guide_init, rank) arm, plus schedule, metric, recipe, guide_init, probe score,
    gain_over_scratch, guide_val score and the budgets in optimizer steps (docs/methods/conversion.md).
    tables: ``runs`` (one row per schedule × metric × guide_init × rank), ``stages`` (stage, layer,
    alignment_metric, value, loss, replaced, steps, stopped, rule, final_loss: linear CKA and the
    arm's alignment loss of each layer vs the guide on held-out data after each stage),
    ``stage_summary``, ``baselines``, ``validation`` (validation score per epoch), ``curves`` (loss per
    step, thinned), ``layer_cka`` (converted × guide linear CKA, first arm).
    """

    kind: ClassVar[str] = "convert"
    main_table: ClassVar[str] = "runs"
    required_columns: ClassVar[dict[str, tuple[str, ...]]] = {"runs": ("schedule", "metric", "guide_init")}


@dataclass
class StitchResult(RunResult):
    """Tables: ``stitching`` (one row per seed × layer pair × objective × setting: accuracies, ``penalty``,
    ``penalty_min``, ``chosen_step``), ``training`` (steps, final loss, least-squares residual, chosen
    step and validation score per stitch), ``iris`` (IRI error statistics, distances from their seeds and
    B's labels per seed × layer of A), ``stitching_mean`` (mean, std and 95 % t interval over seeds per
    layer pair × objective × setting) and ``iri_differences`` (IRI − standard penalty paired by seed).
    Summary: a_accuracy, b_accuracy, iri_relative_error_median, mean_penalty_<objective>_<setting>,
    mean_penalty_min_<objective>_<setting>, seeds, iri_minus_standard, penalty_over_seeds.
    Extra: ``iri_histograms`` and ``iri_examples`` per layer of A, ``pairs`` (with relative depths)."""

    kind: ClassVar[str] = "stitch"
    main_table: ClassVar[str] = "stitching"
    required_columns: ClassVar[dict[str, tuple[str, ...]]] = {"stitching": ("layer_a", "layer_b", "objective", "setting", "penalty")}


@dataclass
class LinearizeResult(RunResult):
    """A seeds × ω × granularity linearization sweep.

    tables: ``runs`` (one row per run: granularity, omega, napl, nonlinear_fraction, accuracy, seed, ...,
    run), ``layers`` (run, granularity, omega, seed, layer, channels, slopes, nonlinear_fraction),
    ``distributions`` (run, granularity, omega, seed, length, probability, apl_probability; run
    "original" included), ``cka`` (run, granularity, omega, seed, layer_a, layer_b, linear_cka:
    linearized site b against original site a), ``history`` (run, step, loss), ``matched`` (per seed:
    channel − layer accuracy at each layer-wise NAPL), ``matched_fraction`` (the same at each layer-wise
    linearized fraction), and over seeds ``aggregate``, ``matched_mean``, ``matched_fraction_mean``
    (paired difference with its 95 % t interval ``difference_low``/``difference_high`` and ``verdict``),
    ``layers_mean``, ``distributions_mean``, ``cka_mean`` (means and standard deviations). ``runs`` also
    has ``linearized_fraction`` and ``mean_abs_one_minus_alpha`` and, after recovery (settings
    ``recover`` > 0), ``accuracy_recovered`` (``accuracy`` is the accuracy before recovery).
    summary: original_accuracy, original_napl, runs (the runs table as records), seeds, warnings, and more.
    """

    kind: ClassVar[str] = "linearize"
    main_table: ClassVar[str] = "runs"
    required_columns: ClassVar[dict[str, tuple[str, ...]]] = {"runs": ("granularity", "omega")}


@dataclass
class GraftResult(RunResult):
    """The exact-surgery checks. Tables: ``e1`` (one row per gate), ``e2`` (one row per arm and step:
    loss, α, gradients, ‖R(x)‖, undo distance), ``e2_arms`` (one row per arm), ``e3`` (one row per graft
    depth), ``f3`` (per-step losses of the three F3 runs)."""

    kind: ClassVar[str] = "graft"
    main_table: ClassVar[str] = "e1"
    required_columns: ClassVar[dict[str, tuple[str, ...]]] = {"e1": ("gate", "mismatches")}


@dataclass
class TrendResult(RunResult):
    """Similarity over training steps: a model (``simkit.Monitor``) or a checkpoint series (``simkit trend``)
    against a reference, per layer.

    tables: ``steps`` (step, metric, layer, reference_layer, depth, reference_depth, value, chance[, null_p95],
    beats_chance: one row per measured step × metric × layer pair) and ``convergence`` (metric, layer,
    reference_layer, depth, reference_depth, final_value, stable_step, final_step: the first step from which
    the pair stays within ``delta`` of its final value).
    summary: reference, metrics, layers, reference_layers, steps (how many), first_step, last_step, delta,
    stable_steps (layer → step, the first metric's same-position pairs), convergence_order (bottom-up,
    top-down, together, mixed or unknown), depth_rank_correlation, probe_samples, data, model.
    """

    kind: ClassVar[str] = "trend"
    main_table: ClassVar[str] = "steps"
    required_columns: ClassVar[dict[str, tuple[str, ...]]] = {
        "steps": ("step", "metric", "layer", "reference_layer", "value"),
        "convergence": ("metric", "layer", "stable_step")}


# The one table of result kinds: kind name (result.json "kind", the report template's name) → class.
RESULT_KINDS: dict[str, type[RunResult]] = {cls.kind: cls for cls in (
    CompareResult, StudyResult, ConvertResult, StitchResult, LinearizeResult, GraftResult, TrendResult)}


def text_columns(frame: pd.DataFrame) -> list[str]:
    """Columns holding strings (and missing values) only: read back as text, so that layer names such
    as ``0.1`` and ``0.10`` or ``7`` stay the strings they were."""
    def is_text(column: pd.Series) -> bool:
        if not (pd.api.types.is_object_dtype(column) or pd.api.types.is_string_dtype(column)):
            return False
        values = column.dropna()
        return len(values) > 0 and bool(values.map(lambda v: isinstance(v, str)).all())

    return [str(name) for name in frame.columns if is_text(frame[name])]


def _as_text(value: str) -> str | float:
    return value if value != "" else float("nan")


def load(run_dir: str | Path) -> RunResult:
    """Read a run directory written by any simkit command back into its result class."""
    run_dir = Path(run_dir)
    path = run_dir / "result.json"
    if not path.is_file():
        raise SimkitError(f"{run_dir} is not a simkit run directory (no result.json); "
                          "pass a run directory written by a simkit command or simkit.save_run")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SimkitError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise SimkitError(f"{path} is not UTF-8 text; pass a run directory written by a simkit command") from None
    if not isinstance(data, dict):
        raise SimkitError(f"{path} holds a JSON {type(data).__name__}, not the object a simkit run writes; "
                          "rerun the command that wrote it")
    tables = data.get("tables", [])
    if not isinstance(tables, list) or not all(isinstance(name, str) for name in tables):
        raise SimkitError(f"{path}: 'tables' is not a list of table names; rerun the command that wrote it")
    kind = data.get("kind", "run")
    cls = RESULT_KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise SimkitError(f"{path} has unknown kind {kind!r}; known kinds: {', '.join(sorted(RESULT_KINDS))}")
    return cls.from_dir(run_dir, data)
