"""Feed every batch's activations to one all-pairs accumulator, combine the ranks, compute.

Rank reduction lives here (the accumulators in ``simkit.metrics.streaming`` know nothing of
processes): the exact feature path's reference shifts are made common (rank 0's, broadcast, then
``rebase``), every float64 sum of ``state()`` is all-reduced, and stored samples are all-gathered in
rank order (``stored_payload`` / ``load_stored``). Each batch is fed with its global index, so the
accumulator's per-batch draws and the order of stored samples do not depend on the number of ranks.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from simkit import distributed
from simkit.engine.groups import check_group_count, read_groups
from simkit.engine.samples import SampleRows
from simkit.errors import SimkitError
from simkit.faults import phase
from simkit.metrics.settings import CompareSettings
from simkit.metrics.shape import cca_refusal
from simkit.metrics.streaming import Accumulator, make_accumulator
from simkit.progress import progress_bar

if TYPE_CHECKING:
    from rich.progress import TaskID

#: one batch of both sides: (global batch index, one (b, p_i) tensor per layer of A, likewise for B)
Activations = tuple[int, Sequence[torch.Tensor], Sequence[torch.Tensor]]


@dataclass
class Measured:
    """What streaming produced: per metric the matrices, plus the sample count and layer widths."""

    values: dict[str, dict[str, np.ndarray]]
    rows: int
    dims_a: list[int]
    dims_b: list[int]
    method: dict[str, Any]
    compute_seconds: float
    warnings: list[str] = field(default_factory=list)
    groups: int | None = None   # the groups permutations were kept within (``settings.groups``)


def reduce_over_ranks(accumulator: Accumulator, device: torch.device | str | None = None) -> None:
    """Combine ``accumulator`` with every other rank's (a no-op in one process); call on all ranks.

    Afterwards every rank holds the accumulator of the whole data set, as if one process had seen
    every batch: shifts aligned on rank 0's, sums all-reduced, stored samples gathered in rank order.
    """
    if not distributed.is_distributed():
        return
    if device is not None:
        accumulator.to(device)
    shifts = accumulator.shifts()
    if shifts:
        state = accumulator.state()
        where = state[0].device if state else shifts[0].device
        shifts = [t.to(where) for t in shifts]
        for t in shifts:
            dist.broadcast(t, src=0)
        accumulator.rebase(shifts)
    for t in accumulator.state():
        distributed.all_reduce_sum(t)
    if accumulator.needs_gather:
        payloads = distributed.all_gather_objects(accumulator.stored_payload())
        accumulator.load_stored(payloads, None if device is None else torch.device(device))


def compute_with_progress(accumulator: Accumulator, progress: bool) -> dict[str, dict[str, np.ndarray]]:
    """``accumulator.compute()`` with one progress bar task per long phase it reports (none when
    ``progress`` is false, or on a rank other than 0). The bar starts at the first report, so a compute
    without a long phase (the minibatch Grams, the feature sums) draws nothing."""
    if not progress:
        return accumulator.compute()
    bars: list[Any] = []
    tasks: dict[str, TaskID] = {}

    def report(phase: str, advance: int, total: int) -> None:
        if not bars:
            bars.append(progress_bar(True))
            bars[0].start()
        if phase not in tasks:
            tasks[phase] = bars[0].add_task(phase, total=total)
        bars[0].advance(tasks[phase], advance)

    try:
        return accumulator.compute(report)
    finally:
        for bar in bars:
            bar.stop()


def refuse_undefined(settings: CompareSettings, dims_a: list[int], dims_b: list[int], rows: int,
                     names_a: Sequence[str] | None, names_b: Sequence[str] | None) -> None:
    """A SimkitError naming the layers and the fixes when a CCA-family measure cannot give a number for
    them at ``rows`` samples (``simkit.metrics.shape.cca_refusal``)."""
    message = cca_refusal(settings.metrics, dims_a, dims_b, rows, settings.cca_eps, names_a, names_b,
                          shape_alpha=settings.shape_alpha)
    if message:
        raise SimkitError(message)


def measure(activations: Iterable[Activations], settings: CompareSettings, device: torch.device, *,
            names_a: Sequence[str] | None = None, names_b: Sequence[str] | None = None,
            progress: bool = False, expected_rows: int | None = None, layout: SampleRows | None = None) -> Measured:
    """:func:`stream_and_compute`, with every warning it raises (a constant layer, a degenerate CCA
    pair, skipped batches) passed on once and kept in ``Measured.warnings`` for the report."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        measured = stream_and_compute(activations, settings, device, names_a=names_a, names_b=names_b,
                                      progress=progress, expected_rows=expected_rows, layout=layout)
    seen: dict[str, type[Warning]] = {}
    for entry in caught:
        seen.setdefault(str(entry.message), entry.category)
    for message in unexplained_nans(measured.values, list(seen), names_a, names_b):
        seen.setdefault(message, RuntimeWarning)
    for message, category in seen.items():
        warnings.warn(message, category, stacklevel=3)
    measured.warnings = list(seen)
    return measured


def unexplained_nans(values: dict[str, dict[str, np.ndarray]], messages: Sequence[str],
                     names_a: Sequence[str] | None, names_b: Sequence[str] | None) -> list[str]:
    """One warning per measure whose values hold NaN that no warning in ``messages`` explained (none names
    the measure and says "undefined"), naming the layer pairs: never a silent NaN, whichever path made it."""
    out = []
    for metric, parts in values.items():
        nan_pairs = np.argwhere(np.isnan(np.asarray(parts["value"], dtype=np.float64)))
        if not len(nan_pairs) or any(metric in m and "undefined" in m for m in messages):
            continue
        pairs = [f"({names_a[i] if names_a else f'A[{i}]'}, {names_b[j] if names_b else f'B[{j}]'})"
                 for i, j in nan_pairs[:5].tolist()]
        more = f" and {len(nan_pairs) - 5} more" if len(nan_pairs) > 5 else ""
        out.append(f"{metric} is undefined for the layer pair(s) {', '.join(pairs)}{more}: a layer has no variance "
                   "under this measure's kernel or distance at these samples; their values are NaN")
    return out


def stream_and_compute(activations: Iterable[Activations], settings: CompareSettings, device: torch.device, *,
                       names_a: Sequence[str] | None = None, names_b: Sequence[str] | None = None,
                       progress: bool = False, expected_rows: int | None = None,
                       layout: SampleRows | None = None) -> Measured:
    """Feed every ``(index, acts_a, acts_b)`` batch to one accumulator, reduce over ranks, compute.

    The accumulator is created from the first batch's widths with ``settings`` (validated); ``names_*`` name the
    layers in warnings and errors. On a rank that got no batch it is created from another rank's widths
    (every rank joins the reductions). ``progress``: a bar per long step after the last batch (the
    neighbour searches, the permutations of a null), as the engine shows the batches.
    ``expected_rows``: the samples the stream will hold, when known: a CCA-family measure that cannot give
    a number for the layers is refused after the first batch (else after the last).
    ``layout``: tokens or positions as samples (``simkit.engine.samples``): the batches' rows are tokens
    (positions), placed at their global rows, and the accumulator keeps every sequence (image) whole.
    """
    accumulator: Accumulator | None = None
    dims_a: list[int] = []
    dims_b: list[int] = []
    rows = 0
    labels = read_groups(settings.groups)

    def build(da: list[int], db: list[int]) -> Accumulator:
        return make_accumulator(settings, da, db, names_a=names_a, names_b=names_b, groups=labels,
                                blocks=None if layout is None else layout.blocks(), expected_n=expected_rows)

    for index, acts_a, acts_b in activations:
        if accumulator is None:
            dims_a = [int(a.shape[1]) for a in acts_a]
            dims_b = [int(b.shape[1]) for b in acts_b]
            if layout is not None:
                expected_rows = layout.total()
            if expected_rows is not None:  # refuse before any further forward pass
                refuse_undefined(settings, dims_a, dims_b, expected_rows, names_a, names_b)
            accumulator = build(dims_a, dims_b)
            phase("streaming")  # a test hook (simkit.faults): nothing unless SIMKIT_KILL_AT names it
        # global batches hold batch_size rows (all but the last), so the batch's first sample is index·batch_size
        offset = index * settings.batch_size if layout is None else layout.offset(index)
        accumulator.update(acts_a, acts_b, batch_index=index, row_offset=offset)
        rows += int(acts_a[0].shape[0])
    if distributed.is_distributed():
        widths = distributed.all_gather_objects((dims_a, dims_b) if accumulator is not None else None)
        if accumulator is None:  # a rank that got no batch still joins the reductions, with empty sums
            dims_a, dims_b = next((d for d in widths if d), ([], []))
            if dims_a:
                accumulator = build(dims_a, dims_b)
        if accumulator is not None:
            reduce_over_ranks(accumulator, device)
        total = torch.tensor([rows], dtype=torch.float64)
        rows = int(distributed.all_reduce_sum(total).item())
    if accumulator is None:
        raise SimkitError("the data yielded no samples; check `data` and `n`")
    refuse_undefined(settings, dims_a, dims_b, rows, names_a, names_b)
    if "unbiased_cka" in settings.metrics and rows < 4:
        raise SimkitError(f"unbiased CKA needs at least 4 samples, got {rows}; raise `n`")
    groups = check_group_count(labels, rows, settings.n is not None)
    start = time.perf_counter()
    phase("computing")
    values = compute_with_progress(accumulator, progress)
    return Measured(values, rows, dims_a, dims_b, accumulator.describe(), time.perf_counter() - start,
                    groups=groups)
