"""``simkit graft``: the exact-surgery paper's verification suite (E1, E2, E3, F3) on any model.

:func:`graft` returns a :class:`GraftResult` (kind "graft") with tables ``e1`` (one row per gate),
``e2`` (one row per arm and step: loss, α, gradients, ‖R(x)‖, undo distance |α|·mean‖R(x)‖),
``e2_arms`` (one row per arm: first steps with gradient, final α), ``e3`` (one row per graft depth,
on a deeper copy of the built-in model with ``e3_blocks``; the summary judges its correlation and the
bookkeeping time against depth with 95 % intervals, :func:`simkit.grafting.verdict.e3_statistics`)
and ``f3`` (per-step losses of the three F3 runs). With ``resume`` the E2 arms continue from their
checkpoints in the run directory (bit-identically); E1 and E3 are cheap and recomputed; F3 is about
interruption itself and is always redone.
"""

from __future__ import annotations

import resource
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from simkit.data import Dataset, check_finite
from simkit.errors import SimkitError
from simkit.forward import check_accepts
from simkit.grafting import experiments
from simkit.grafting.tasks import check_rebuildable, deeper_builtin, is_builtin, make_task
from simkit.grafting.verdict import verdict
from simkit.models import load_model
from simkit.provenance import Timer, run_meta, weights_words
from simkit.results import GraftResult
from simkit.rundir import RunDir, fingerprint, open_run_dir
from simkit.settings.graft import BUILTIN, GraftSettings
from simkit.surgery.ops import get_module

MARKOV_DATA = "markov-chain tokens (seeded)"


@contextmanager
def cpu_seconds(into: dict[str, float], name: str) -> Iterator[None]:
    """Adds the CPU seconds (user + system) of this process and of the child processes it waited for
    during the block to ``into[name]``."""
    def now() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    start = now()
    try:
        yield
    finally:
        into[name] = into.get(name, 0.0) + now() - start


def graft(model: nn.Module | None, data: Dataset | None, settings: GraftSettings | None = None, *,
          run_dir: RunDir | str | Path | None = None, resume: bool = False, progress: bool = True) -> GraftResult:
    """Run E1, E2, E3 and F3 for ``model`` on ``data``.

    model: the model to graft (not modified: every experiment works on a fresh copy); None: the
        built-in ``simkit:llama`` (seeded by ``settings.seed``). data: what it trains on; None with the
        built-in model: seeded Markov-chain tokens. run_dir: where checkpoints, E2 rows and F3's worker
        files go (None: F3 uses a temporary directory and nothing can be resumed); a path is checked
        against the settings and fingerprints of ``model`` and ``data``, so ``resume`` refuses other
        inputs. resume: continue the E2 arms from their checkpoints. progress: show progress bars.
    Everything is validated (settings, data against the model, the graft itself in E1) before the
    run directory is started. ``meta.settings``: the settings resolved (``after``, ``branch`` and the
    model's name filled in); ``meta.settings_given``: as given (what the run directory records).
    """
    settings = (settings if settings is not None else GraftSettings()).validate()  # the rules run once per run
    if model is None:
        if settings.model not in (None, BUILTIN):
            raise SimkitError(f"`model` is None, which runs the built-in {BUILTIN}, but `settings.model` names "
                              f"{settings.model!r}; load it with simkit.models.load_model and pass it as `model`")
        model = load_model(BUILTIN, seed=settings.seed)
    builtin = is_builtin(model)
    name = settings.model or (BUILTIN if builtin else type(model).__name__)
    s = replace(settings.resolved(builtin), model=name)
    timer = Timer()
    with timer("setup"):
        get_module(model, s.site()[0])
        if isinstance(data, Dataset):
            check_finite(data)
        check_rebuildable(model)
        task = make_task(s, model, data, progress=progress)
        check_accepts(task.make_model(), task.probe, "the model")
        e3_task = task if s.e3_blocks is None else make_task(s, deeper_builtin(model, s.e3_blocks, s.seed), data,
                                                             progress=progress)
    inputs = {**settings.to_dict(), "model_state": fingerprint(model),
              "data_state": None if data is None else fingerprint(data)}
    run = open_run_dir(run_dir, "graft", inputs, resume=resume)
    cpu: dict[str, float] = {}
    with experiments.torch_threads(s.threads):
        with timer("e1"), cpu_seconds(cpu, "e1"):
            e1 = experiments.run_e1(task, s)  # writes nothing; refuses a graft that cannot be made
        if run is not None:
            run.start()
        with tempfile.TemporaryDirectory(prefix="simkit-graft-") as scratch:
            out = run.path if run is not None else Path(scratch)
            with timer("e2"), cpu_seconds(cpu, "e2"):
                e2, e2_arms, e2_summary = experiments.run_e2(task, s, None if run is None else out, resume)
            with timer("e3"), cpu_seconds(cpu, "e3"):
                e3, e3_summary = experiments.run_e3(e3_task, s)
            with timer("f3"), cpu_seconds(cpu, "f3"):
                f3, f3_summary = experiments.run_f3(task, s, out)
    main = e1[e1["gate"] == s.gate].iloc[0]
    summary: dict[str, Any] = {
        "e1_values_compared": int(main["values_compared"]),
        "e1_mismatches": int(main["mismatches"]),
        "e1_site_mismatches": int(main["site_mismatches"]),
        "e1_precondition_violations": int(main["violations"]),
        "e1_stream_negative_zeros": int(main["stream_negative_zeros"]),
        "e1_stream_nonfinite": int(main["stream_nonfinite"]),
        **e2_summary, **e3_summary, **f3_summary,
        "loss_kind": task.loss_kind,
    }
    e1_note = experiments.e1_shortfall(summary["e1_values_compared"], experiments.probe_rows(task.probe))
    if e1_note:  # the count is e1_values_compared; the note says why it matters (shown in the report)
        summary["e1_note"] = e1_note
    summary.update(verdict(summary, [*e1["mismatches"], *e1["site_mismatches"]]))
    data_name = s.data or (data.spec if data is not None else MARKOV_DATA)
    meta = run_meta(settings=s.to_dict(), settings_given=settings.to_dict(), model=name,
                    weights={"model": weights_words(model)}, data=data_name, seed=s.seed, loss_kind=task.loss_kind,
                    timings=timer.seconds, cpu_seconds=cpu, threads=s.threads, e2_optimizer="sgd",
                    f3_optimizer="adamw")
    tables = {"e1": e1, "e2": e2, "e2_arms": e2_arms, "e3": e3, "f3": f3}
    return GraftResult(summary=summary, tables=tables, meta=meta)

