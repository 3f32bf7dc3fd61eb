"""Progress of the work after the last batch (issue #14): neighbour searches and permutation nulls report
their steps to the engine's bar; a library call with progress=False creates no bar at all."""

from __future__ import annotations

import torch

import simkit.engine.measure as measure_module
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming import make_accumulator


def fed(metrics, null, n=60, batch=20):
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(n, 5, generator=g), torch.randn(n, 3, generator=g)]
    b = [torch.randn(n, 4, generator=g)]
    acc = make_accumulator(CompareSettings(metrics=metrics, mode="exact", null=null, knn_k=3), [5, 3], [4])
    for s in range(0, n, batch):
        acc.update([x[s:s + batch] for x in a], [y[s:s + batch] for y in b])
    return acc


def test_stored_phases_report_every_unit_of_their_total():
    acc = fed(["mutual_knn", "jaccard_knn", "linear_cka", "procrustes", "ridge_r2", "rsa"], null=4)
    seen: dict[str, list[int]] = {}
    declared: dict[str, int] = {}

    def report(phase: str, advance: int, total: int) -> None:
        seen.setdefault(phase, []).append(advance)
        assert declared.setdefault(phase, total) == total  # one total per phase
        assert sum(seen[phase]) <= total

    silent = acc.compute()
    loud = acc.compute(report)
    for m in silent:  # reporting changes no number
        for key in silent[m]:
            torch.testing.assert_close(torch.as_tensor(loud[m][key]), torch.as_tensor(silent[m][key]), equal_nan=True)
    totals = {"neighbour search (60 samples, 3 layers)": 3 * 60, "k-NN null (4 permutations)": 4,
              "linear_cka null (4 permutations, Gram rows)": 60, "procrustes null (4 permutations)": 4,
              "ridge_r2 null (4 permutations)": 4 * 2, "rsa null (4 permutations)": 4}  # ridge: per A layer (2)
    assert {phase: sum(steps) for phase, steps in seen.items()} == totals == declared


def test_measure_builds_a_bar_only_when_asked(monkeypatch):
    made = []

    class Bar:
        def __init__(self, enabled):
            made.append(enabled)
            self.done: dict[int, int] = {}

        def add_task(self, phase, total):
            self.done[len(self.done)] = 0
            return len(self.done) - 1

        def advance(self, task, advance):
            self.done[task] += advance

        def start(self):
            self.running = True

        def stop(self):
            self.running = False

    monkeypatch.setattr(measure_module, "progress_bar", Bar)
    acc = fed(["mutual_knn"], null=2)
    measure_module.compute_with_progress(acc, False)
    assert made == []
    measure_module.compute_with_progress(acc, True)
    assert made == [True]
    measure_module.compute_with_progress(fed(["linear_cka"], null=0), True)  # no long phase: no bar
    assert made == [True]
