"""The engine: stream batches through models (or read activation caches) once, feed every layer
pair's accumulators, reduce over ranks, and assemble one kind of result whichever the entry point.

- ``compare(model_a, model_b, data, ...)`` → ``CompareResult`` (``simkit.engine.comparison``);
- ``compare_caches(path_a, path_b, ...)`` → ``CompareResult`` from two activation caches;
- ``study(paths, ...)`` → ``StudyResult``: a model × model matrix from many caches in one pass
  (``simkit.engine.studies``);
- ``capture(model, data, out, ...)`` writes an activation cache (``simkit.engine.caches``);
- ``compare_arrays(acts_a, acts_b, ...)`` → ``CompareResult`` from activations given as arrays or files,
  ``load_activations(path)``, ``capture_arrays(acts, out)`` (import into a cache) and
  ``hf_hidden_states(output)`` (``simkit.engine.arrays``, the third source).

Parts: ``batches`` (data of any form → global batches strided over ranks), ``sources`` (model taps,
cache readers), ``arrays`` and ``array_files`` (activations as arrays and files), ``measure`` (feeding the accumulator,
rank reduction), ``assemble`` (the one result assembler).
"""

from __future__ import annotations

from simkit.engine.arrays import capture_arrays, compare_arrays, hf_hidden_states, load_activations
from simkit.engine.caches import capture
from simkit.engine.comparison import compare, compare_caches
from simkit.engine.sources import is_cache, iter_cache, read_manifest, select_cached_layers
from simkit.engine.studies import study
from simkit.metrics.settings import DEFAULT_METRICS, CompareSettings, check_metrics

__all__ = ["DEFAULT_METRICS", "CompareSettings", "capture", "capture_arrays", "check_metrics", "compare",
           "compare_arrays", "compare_caches", "hf_hidden_states", "is_cache", "iter_cache", "load_activations",
           "read_manifest", "select_cached_layers", "study"]
