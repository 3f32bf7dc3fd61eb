"""simkit: how similar are two neural networks inside, layer by layer.

The public API (every name loads on first use, so ``import simkit`` and ``simkit --help`` stay fast):

- ``compare(model_a, model_b, data, CompareSettings(...))`` → ``CompareResult``; ``compare_caches(path_a, path_b, ...)``;
  ``study(paths, ...)`` → ``StudyResult``; ``capture(model, data, out, ...)`` writes an activation cache;
- ``compare_arrays(acts_a, acts_b, ...)`` → ``CompareResult`` from activations you already have (mappings of
  arrays, files, caches), ``load_activations(path)``, ``capture_arrays(acts, out)``, ``hf_hidden_states(output)``;
- the research runners, each ``run(modules, data, settings, run_dir=None, resume=False)`` → a result:
  ``convert`` (Network of Theseus, ``ConvertSettings``), ``stitch`` (``StitchSettings``), ``linearize``
  (``LinearizeSettings``), ``graft`` (``GraftSettings``);
- ``train_classifier(model, data, TrainConfig(...))`` and ``evaluate_accuracy(model, x, y)``: the one
  training loop, for the models a study needs;
- ``train_adversarial(model, data, TrainConfig(...), eps=...)`` and ``robust_accuracy(model, x, y, eps=...)``:
  PGD adversarial training through the same loop;
- ``Monitor(model, probe, MonitorSettings(...))``: similarity to a reference while a model trains, in any
  loop (``monitor.step(global_step)``, ``monitor.close()`` → ``TrendResult``); ``trend(checkpoints, data,
  TrendSettings(...))``: the same over a series of checkpoints (``simkit.monitor``; the Lightning callback is
  ``simkit.monitor.lightning.SimilarityCallback``);
- ``register_measure(name, fn, ...)``: a measure of your own in the catalogue (every path, chance level,
  interval, report, study and ``--metric``); installed packages add theirs through the entry-point group
  ``simkit.measures``; ``unregister_measure(name)`` removes one;
- ``load(run_dir)`` reads any run directory back; ``save_run(result, out)`` writes one with its
  report; ``render_report(result, path)`` writes the HTML report alone.

Results are data (``summary``, ``tables``, ``meta``, ``extra``; ``.to_frame()``, ``.save(dir)``); in a
notebook they show the report's findings and heatmaps inline, and compare/study results have
``.matrix(metric)`` and ``.plot(metric)`` (a seaborn heatmap).
Models and data from spec strings: ``simkit.models.load_model``, ``simkit.data.load_data``.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

from simkit.errors import SimkitError
from simkit.results import RunResult
from simkit.results import load as _read_run


def load(run_dir: Any) -> RunResult:
    """Read a run directory written by any simkit command back into its result class (``simkit.results.load``);
    the result shows its findings and heatmaps inline in a notebook."""
    import simkit.report  # noqa: F401  (registers the notebook views)

    return _read_run(run_dir)


# public name → the module that defines it (imported on first use)
_LAZY = {
    "compare": "simkit.engine",
    "CompareSettings": "simkit.engine",
    "compare_caches": "simkit.engine",
    "study": "simkit.engine",
    "capture": "simkit.engine",
    "compare_arrays": "simkit.engine",
    "load_activations": "simkit.engine",
    "capture_arrays": "simkit.engine",
    "hf_hidden_states": "simkit.engine",
    "convert": "simkit.conversion",
    "ConvertSettings": "simkit.conversion",
    "ConvertResult": "simkit.results",
    "stitch": "simkit.stitching",
    "StitchSettings": "simkit.stitching",
    "linearize": "simkit.linearization",
    "LinearizeSettings": "simkit.linearization",
    "matched_napl": "simkit.linearization",
    "matched_over_seeds": "simkit.linearization",
    "graft": "simkit.grafting",
    "GraftSettings": "simkit.grafting",
    "TrainConfig": "simkit.training",
    "train_classifier": "simkit.training",
    "evaluate_accuracy": "simkit.training",
    "train_adversarial": "simkit.training.adversarial",
    "robust_accuracy": "simkit.training.adversarial",
    "save_run": "simkit.report",
    "render_report": "simkit.report",
    "RunDir": "simkit.rundir",
    "Monitor": "simkit.monitor",
    "MonitorSettings": "simkit.monitor",
    "trend": "simkit.monitor",
    "TrendSettings": "simkit.monitor",
    "TrendResult": "simkit.results",
    "register_measure": "simkit.catalog",
    "unregister_measure": "simkit.catalog",
}

__all__ = ["SimkitError", "__version__", "load", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        # whatever hands out results also registers how they show in a notebook (simkit.results.HTML_VIEWS),
        # so simkit.stitch(...) and simkit.graft(...) display in a fresh notebook as simkit.compare(...) does
        if _LAZY[name] != "simkit.catalog":   # a plug-in registers while the catalogue loads: no report yet
            import_module("simkit.report")
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'simkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
