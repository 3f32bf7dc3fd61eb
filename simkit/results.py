"""Results are data: a summary, tidy tables and metadata, saved as ``result.json`` plus CSV files.

Every runner returns a subclass of :class:`RunResult`. A run directory holds ``result.json``
(``kind``, ``summary``, ``meta``, ``extra`` and the list of tables), one ``<table>.csv`` per table,
and ``report.html`` rendered from those files only. ``simkit.load(dir)`` reads any of them back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from simkit.errors import SimkitError
from simkit.io import write_csv, write_json

_KINDS: dict[str, type[RunResult]] = {}


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

    summary: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _KINDS[cls.kind] = cls

    def to_frame(self) -> pd.DataFrame:
        """The main table as a pandas DataFrame (a copy)."""
        name = self.main_table or next(iter(self.tables))
        return self.tables[name].copy()

    def save(self, out_dir: str | Path, report: bool = True) -> Path:
        """Write the run directory (atomically, file by file); render ``report.html`` unless told not to."""
        out = Path(out_dir)
        if out.exists() and not out.is_dir():
            raise SimkitError(f"--out {out} is an existing file, not a directory; choose another --out")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SimkitError(f"cannot create the run directory {out} ({exc.strerror}); choose another --out") \
                from None
        for name, frame in self.tables.items():
            write_csv(out / f"{name}.csv", frame)
        write_json(out / "result.json", {
            "kind": self.kind, "summary": self.summary, "meta": self.meta,
            "tables": sorted(self.tables), "extra": self.extra,
            "text_columns": {name: text_columns(frame) for name, frame in self.tables.items()},
        })
        if report:
            self.report(out / "report.html")
        return out

    def report(self, path: str | Path) -> Path:
        """Render the self-contained HTML report to ``path``."""
        from simkit.report import render_report

        return render_report(self, path)

    @classmethod
    def from_dir(cls, run_dir: Path, data: dict[str, Any]) -> RunResult:
        """The result saved in ``run_dir`` from its parsed result.json ``data`` and the CSV tables it lists."""
        missing = [f"{name}.csv" for name in data.get("tables", []) if not (run_dir / f"{name}.csv").is_file()]
        if missing:
            raise SimkitError(f"{run_dir} is incomplete: {', '.join(missing)} is missing; "
                              "rerun the command that wrote it")
        text = data.get("text_columns", {})
        # only an empty field is missing: every table is written by to_csv, which writes NaN as "", and
        # pandas' default NA spellings ("NA", "nan", "None", ...) are valid layer and model names
        tables = {name: pd.read_csv(run_dir / f"{name}.csv", keep_default_na=False, na_values=[""],
                                    converters=dict.fromkeys(text.get(name, []), _as_text))
                  for name in data.get("tables", [])}
        return cls(summary=data.get("summary", {}), tables=tables,
                   meta=data.get("meta", {}), extra=data.get("extra", {}))


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
                          "pass the --out directory of a simkit command")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SimkitError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    _import_result_modules()
    kind = data.get("kind", "run")
    cls = _KINDS.get(kind)
    if cls is None:
        raise SimkitError(f"{path} has unknown kind {kind!r}; known kinds: {', '.join(sorted(_KINDS))}")
    return cls.from_dir(run_dir, data)


# Modules that define result classes; imported lazily so `load` knows every kind.
RESULT_MODULES = (
    "simkit.comparison",
    "simkit.surgery.suite",
    "simkit.theseus.runner",
    "simkit.stitching.runner",
    "simkit.linearize.runner",
    "simkit.study",
)


def _import_result_modules() -> None:
    import importlib

    for name in RESULT_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real missing dependency inside the module
                raise
