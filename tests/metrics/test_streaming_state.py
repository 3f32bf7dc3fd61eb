"""Declared streaming state (simkit.metrics.streaming.state): every part lists its states, the accumulator
moves, merges, re-bases, saves and loads parts through them alone, one shifted-sum class serves both shifted
paths, and each stored measure reaches its family through its catalogue row."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

import simkit.metrics.streaming as streaming
from simkit.catalog import MEASURES, METRICS
from simkit.errors import SimkitError
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming import make_accumulator
from simkit.metrics.streaming import state as state_module
from simkit.metrics.streaming.features import FeaturePart
from simkit.metrics.streaming.folds import FoldPart
from simkit.metrics.streaming.state import Rows, ShiftedSums, Sums
from simkit.metrics.streaming.stored import FAMILIES, SHARED_FAMILIES

STREAMING = Path(streaming.__file__).parent
DIMS_A, DIMS_B = [3, 5], [4, 2]


def layers(n: int, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Two models' layers with large means (the shifts matter) and related features."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, 3, generator=g, dtype=torch.float64)
    xa = [base * 2 + 50.0, torch.randn(n, 5, generator=g, dtype=torch.float64) + base[:, :1]]
    xb = [base @ torch.randn(3, 4, generator=g, dtype=torch.float64) - 20.0,
          torch.randn(n, 2, generator=g, dtype=torch.float64)]
    return xa, xb


def fed(settings: CompareSettings, xa, xb, batches: list[int], size: int = 6):
    """An accumulator fed the batches numbered ``batches`` (global index and row offset given)."""
    acc = make_accumulator(settings, DIMS_A, DIMS_B)
    for k in batches:
        rows = slice(k * size, (k + 1) * size)
        acc.update([x[rows] for x in xa], [y[rows] for y in xb], batch_index=k, row_offset=k * size)
    return acc


def kinds(acc) -> list[tuple[str, list[str]]]:
    """Each part's class and its declared states' classes."""
    return [(type(part).__name__, [type(st).__name__ for st in part.states]) for part in acc.parts]


def assert_same_values(got: dict, want: dict) -> None:
    """Same metrics, same keys, values equal to 1e-10."""
    assert list(got) == list(want)
    for m in want:
        assert list(got[m]) == list(want[m]), m
        for key in want[m]:
            np.testing.assert_allclose(got[m][key], want[m][key], rtol=1e-10, atol=1e-12, err_msg=f"{m} {key}")


# ------------------------------------------------------------------------------- declared states

def test_every_part_declares_its_states():
    """minibatch: one ``sum``; features and folds: one ``shifted_sum``; stored: one ``cat``."""
    mixed = CompareSettings(metrics=["linear_cka", "procrustes", "ridge_r2", "mutual_knn"], mode="minibatch",
                            null=0)
    acc = make_accumulator(mixed, DIMS_A, DIMS_B)
    assert kinds(acc) == [("MinibatchPart", ["Sums"]), ("FeaturePart", ["ShiftedSums"]),
                          ("FoldPart", ["ShiftedSums"]), ("StoredPart", ["Rows"])]
    assert [st.shift_count for st in acc.states] == [0, 2, 2, 0]
    assert [st.gathered for st in acc.states] == [False, False, False, True]


def test_no_isinstance_dispatch_in_streaming():
    """No streaming module picks behaviour by the class of a part or a state: the states declare it.
    (isinstance is left only for checking arguments: the settings object, the payloads' shape.)"""
    classes = {"MinibatchPart", "FeaturePart", "FoldPart", "StoredPart", "Part", "Sums", "ShiftedSums", "Rows",
               "State", "ndarray", "Tensor"}
    found = []
    for path in sorted(STREAMING.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                names = {getattr(n, "id", getattr(n, "attr", "")) for n in ast.walk(node.args[1])}
                if names & classes:
                    found.append(f"{path.name}:{node.lineno}")
    assert not found, found


def test_one_shifted_sum_class_serves_both_shifted_paths():
    """The feature and fold paths write no merge, rebase or shifts of their own."""
    for part in (FeaturePart, FoldPart):
        assert not {"merge", "rebase", "shifts", "state", "payload", "load"} & set(vars(part)), part.__name__


def test_compute_dtype_is_gone():
    """It had no caller."""
    from simkit.metrics.streaming import common

    assert not hasattr(common, "compute_dtype")


# ----------------------------------------------------------------------------------- shifted sum

def _sum_about_shift(widths: tuple[int, int]) -> ShiftedSums:
    """A shifted sum of ``Σ (x − c)`` per column of each side (the smallest re-referencing: ``+ n·δ``)."""
    def move(sums: ShiftedSums, dx: torch.Tensor, dy: torch.Tensor) -> None:
        n = sums["n"]
        sums["sx"].add_(n * dx)
        sums["sy"].add_(n * dy)

    sums = ShiftedSums(widths, move)
    sums.add("n", 1)
    sums.add("sx", widths[0])
    sums.add("sy", widths[1])
    return sums


def _feed(sums: ShiftedSums, x: torch.Tensor, y: torch.Tensor) -> None:
    dx, dy = sums.offset("x", x.mean(0)), sums.offset("y", y.mean(0))
    sums["n"].add_(len(x))
    sums["sx"].add_((x - x.mean(0)).sum(0) + len(x) * dx)
    sums["sy"].add_((y - y.mean(0)).sum(0) + len(y) * dy)


def test_shifted_sum_sets_its_shift_from_the_first_batch_and_merges_about_it():
    """Sums about two shifts merge into the sum about the first one's (float64 reference)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20, 3, generator=g, dtype=torch.float64) + 9
    y = torch.randn(20, 2, generator=g, dtype=torch.float64)
    first, second, empty = _sum_about_shift((3, 2)), _sum_about_shift((3, 2)), _sum_about_shift((3, 2))
    assert [t.tolist() for t in empty.shifts()] == [[0.0] * 3, [0.0] * 2]
    _feed(first, x[:7], y[:7])
    _feed(second, x[7:], y[7:])
    torch.testing.assert_close(first.shifts()[0], x[:7].mean(0), rtol=0, atol=0)
    assert not torch.equal(first.shifts()[0], second.shifts()[0])
    first.merge(second)
    torch.testing.assert_close(first["sx"], (x - x[:7].mean(0)).sum(0), rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(first["sy"], (y - y[:7].mean(0)).sum(0), rtol=1e-12, atol=1e-10)
    empty.merge(first)  # an empty sum takes the other's shifts as they are
    torch.testing.assert_close(empty.shifts()[0], x[:7].mean(0), rtol=0, atol=0)
    torch.testing.assert_close(empty["sx"], first["sx"], rtol=0, atol=0)


def test_rebase_checks_the_number_of_shifts():
    """Two shifts per shifted sum, in part order; another count is refused in one line."""
    xa, xb = layers(24)
    acc = fed(CompareSettings(metrics=["linear_cka", "ridge_r2"], mode="exact", null=0), xa, xb, [0, 1])
    assert len(acc.shifts()) == 4
    with pytest.raises(SimkitError, match=r"\(4 tensors\), got 2"):
        acc.rebase(acc.shifts()[:2])


# ------------------------------------------------------------------------- the accumulator's uses

SETTINGS = {
    "minibatch": CompareSettings(metrics=["linear_cka", "unbiased_cka", "mutual_knn"], mode="minibatch", null=3,
                                 knn_k=3),
    "streamed": CompareSettings(metrics=["linear_cka", "unbiased_cka", "procrustes", "cca", "ridge_r2"],
                                mode="exact", null=0, ridge_folds=3),
    "stored": CompareSettings(metrics=list(METRICS), mode="exact", null=3, knn_k=3, ridge_folds=3),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_merge_and_rank_exchange_through_states_match_one_accumulator(name):
    """Two accumulators fed alternate batches, merged, or combined as two ranks are (shifts of rank 0,
    summed states, gathered rows), give one accumulator's values."""
    xa, xb = layers(36)
    settings = SETTINGS[name]
    whole = fed(settings, xa, xb, list(range(6))).compute()
    merged = fed(settings, xa, xb, [0, 2, 4]).merge(fed(settings, xa, xb, [1, 3, 5]))
    if merged.needs_gather:  # merged rows are in merge order; load puts them in global batch order
        merged.load_stored([merged.stored_payload()])
    assert_same_values(merged.compute(), whole)
    ranks = [fed(settings, xa, xb, [0, 2, 4]), fed(settings, xa, xb, [1, 3, 5])]
    shifts = ranks[0].shifts()
    for acc in ranks:
        acc.rebase([t.clone() for t in shifts])
    for mine, theirs in zip(ranks[0].state(), ranks[1].state(), strict=True):
        total = mine + theirs
        mine.copy_(total)
        theirs.copy_(total)
    payloads = [acc.stored_payload() for acc in ranks]
    for acc in ranks:
        acc.load_stored(payloads, "cpu")
        assert_same_values(acc.compute(), whole)


def test_stored_payload_holds_one_entry_per_cat_state():
    """The payload is a list with one ``(indices, chunks A, chunks B)`` per ``cat`` state; loading checks it."""
    xa, xb = layers(24)
    acc = fed(SETTINGS["stored"], xa, xb, [3, 1])
    (payload,) = acc.stored_payload()
    indices, chunks_a, chunks_b = payload
    assert indices == [3, 1] and len(chunks_a) == len(chunks_b) == 2
    assert fed(SETTINGS["streamed"], xa, xb, [0]).stored_payload() == []
    with pytest.raises(SimkitError, match="stored_payload"):
        acc.load_stored([payload])


def test_to_moves_every_declared_state():
    """``to`` moves the sums, the shifted sums and the stored rows alike."""
    xa, xb = layers(24)
    acc = fed(CompareSettings(metrics=["linear_cka", "procrustes", "ridge_r2", "mutual_knn"], mode="minibatch",
                              null=0, knn_k=3), xa, xb, [0, 1])
    acc.to("meta")
    rows = [st for st in acc.states if isinstance(st, Rows)]
    sums = [st for st in acc.states if isinstance(st, Sums)]
    assert rows and sums
    assert all(t.device.type == "meta" for st in sums for t in st.summed())
    assert all(t.device.type == "meta" for st in rows for chunk in st.chunks_a + st.chunks_b for t in chunk)


def test_the_bootstrap_resamples_the_declared_rows():
    """A stored part's interval comes from its ``cat`` state: the same after the rows were merged and
    reloaded in global batch order, and around the value."""
    settings = CompareSettings(metrics=["linear_cka", "rsa"], mode="exact", null=0, ci=0.9, ci_resamples=12)
    xa, xb = layers(36)
    whole = fed(settings, xa, xb, list(range(6)))
    got = whole.compute()
    merged = fed(settings, xa, xb, [5, 1, 3]).merge(fed(settings, xa, xb, [0, 2, 4]))
    merged.load_stored([merged.stored_payload()])
    assert_same_values(merged.compute(), got)
    for m in ("linear_cka", "rsa"):
        assert np.all(got[m]["ci_low"] <= got[m]["value"]) and np.all(got[m]["value"] <= got[m]["ci_high"])
        assert "bootstrap over samples, 12 resamples" in whole.describe()[m]["ci"]


# ------------------------------------------------------------------------- stored families by row

def test_every_measure_names_a_stored_family():
    """Every catalogue row names a family stored.py computes, and every family serves a measure."""
    # "plugin" serves the measures users register (tests/engine/test_plugin_measures.py)
    assert {MEASURES[m].stored_family for m in METRICS} | {"plugin"} == set(FAMILIES)
    assert set(SHARED_FAMILIES) <= set(FAMILIES)


@pytest.mark.parametrize("name", METRICS)
def test_each_stored_measure_is_computed_by_its_rows_family(name, monkeypatch):
    """Routing is the catalogue row's: the family function it names computes it (and the path says so)."""
    family = MEASURES[name].stored_family
    calls: list[list[str]] = []
    original = FAMILIES[family]

    def spy(part, measures, samples):
        calls.append(list(measures))
        return original.compute(part, measures, samples)

    monkeypatch.setitem(FAMILIES, family, original._replace(compute=spy))
    xa, xb = layers(24)
    settings = CompareSettings(metrics=[name], mode="exact", null=2, knn_k=3, ridge_folds=3)
    acc = fed(settings, xa, xb, [0, 1, 2, 3])
    assert kinds(acc) == [("StoredPart", ["Rows"])]
    assert np.isfinite(acc.compute()[name]["value"]).any()
    assert calls == [[name]]
    assert acc.describe()[name]["path"] == f"stored-{family}"


def test_state_module_names_the_three_kinds():
    """``sum``, ``shifted_sum`` and ``cat``."""
    assert {"Sums", "ShiftedSums", "Rows"} <= set(vars(state_module))
