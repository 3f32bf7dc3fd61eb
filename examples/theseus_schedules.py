"""Network of Theseus, experiment 2 of issue 23: the order of the four schedules on MNIST-1D, at
experiment 1's budget (``examples/theseus_mnist1d.py``).

Design (written before any run; not run yet in this session):

- Question: at experiment 1's budget, in which order do the four schedules (progressive,
  sequential, independent, joint) rank, and which neighbours in that order differ beyond noise?
  The paper (ImageNet, ResNet-18 → MLP): progressive 62.1 > joint 58.0 > independent 45.1 >
  sequential 30.7.
- Data, guide, recipe and budgets: exactly experiment 1's (``theseus_mnist1d.settings``: conv-to-mlp
  rank 256, the BatchNorm CNN guide trained per seed 20 epochs at 1e-2, ``align_val``, 300 alignment
  steps per stage fixed, 5 head + 30 fine-tuning epochs, best validation epoch kept), from the
  trained guide only, no baselines (experiment 1 has them).
- Equal alignment budget: progressive, sequential and independent run 3 × 300 steps (one stage per
  conv); joint runs one stage of 3 × 300 = 900 steps (``convert``'s rule: a fixed ``steps_per_stage``
  times the number of replaced modules), so every schedule gets the same total alignment steps and
  the same labelled-training epochs.
- Seeds: 5 (0–4), one ``simkit.convert(..., seeds=5)`` call (all four schedules per seed, paired by
  seed): neighbours such as progressive vs joint are expected within 3 standard deviations.
- Reported, whatever it is: the measured order by mean test accuracy and, between each pair of
  neighbours in it, the paired per-seed difference with its 95 % t interval ("beyond noise" only when
  the interval excludes 0). Verdicts per paper row (``simkit.stats.verdict``, size 0): progressive −
  joint > 0, joint − independent > 0, independent − sequential > 0; reproduced when the paired
  interval lies above 0, "direction only" when only the mean does.
- Sizing (smoke run of experiment 1, one torch thread): stage steps ≈ 30 / 70 / 110 ms for stages 1 /
  2 / 3 of progressive (less for sequential and independent, which train one module; joint ≈ 110 ms
  per step over 900 steps), fine-tuning ≈ 30 ms per step: ≈ 60 + 40 + 30 + 100 s of alignment and
  4 × 30 s of head and fine-tuning ≈ 6 min per seed, ≈ 30 min for 5 seeds on an idle 2-core machine.

    flock /tmp/exp.lock /tmp/heavy .venv/bin/python examples/theseus_schedules.py \\
        --out runs/theseus_schedules_e2 --results examples/results/theseus_schedules_5seeds.md
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pandas as pd
from theseus_mnist1d import GUIDE, parse, settings
from theseus_note import Claim, arm_values, claims_table, header, per_seed_table, run_experiment

import simkit
from simkit.data import load_data
from simkit.models import load_model
from simkit.stats import beyond_noise

SCHEDULES = ["progressive", "sequential", "independent", "joint"]
PAPER = {"progressive": 62.1, "joint": 58.0, "independent": 45.1, "sequential": 30.7}
OUT = Path("runs/theseus_schedules_e2")
TITLE = "Network of Theseus, schedule order on MNIST-1D (issue 23, experiment 2)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Experiment 1's command line (same budgets), with this experiment's own default --out."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if not any(a == "--out" or a.startswith("--out=") for a in argv):
        args.out = OUT
    return args


def schedule_settings(args: argparse.Namespace) -> simkit.ConvertSettings:
    """Experiment 1's settings with the four schedules, the trained guide only and no baselines."""
    return dataclasses.replace(settings(args), schedule=list(SCHEDULES), guide_init=["trained"], baselines=[])


def order_lines(values: dict[str, pd.Series]) -> list[str]:
    """The measured order by mean and each neighbour pair's paired difference with its 95 % t interval."""
    ranked = sorted(values, key=lambda name: -float(values[name].mean()))
    lines = ["Measured order: " + " > ".join(f"{n} {100 * values[n].mean():.1f}" for n in ranked), "",
             "| neighbours | paired difference (95 % t interval) | beyond noise |", "|---|---|---|"]
    for upper, lower in zip(ranked, ranked[1:], strict=False):
        interval = Claim(f"{upper} − {lower}", "", values[upper], values[lower], kind="report").interval()
        lines.append(f"| {upper} − {lower} | {interval.text(1, ' pts')} | {'yes' if beyond_noise(interval) else 'no'} |")
    return lines


def paper_claims(values: dict[str, pd.Series]) -> list[Claim]:
    """The paper's neighbour pairs (progressive > joint > independent > sequential), each a claim > 0."""
    pairs = [("progressive", "joint"), ("joint", "independent"), ("independent", "sequential")]
    return [Claim(f"{a} − {b} > 0", f"{PAPER[a]} − {PAPER[b]} = {PAPER[a] - PAPER[b]:+.1f}", values[a], values[b])
            for a, b in pairs]


def main() -> None:
    """Run the experiment and write its note."""
    args = parse_args()
    run_experiment(args, lambda: (lambda seed: load_model(GUIDE, seed=seed), load_data("mnist1d"), GUIDE, "mnist1d"),
                   schedule_settings(args), note)


def note(result: simkit.ConvertResult, command: str, load_before: str, seconds: float) -> str:
    """The results note: header, per-seed accuracies, the measured order, verdicts per paper row."""
    runs = result.tables["runs"]
    values = {s: arm_values(runs, "converted_accuracy", schedule=s) for s in SCHEDULES}
    lines = header(TITLE, command, load_before, seconds)
    lines += ["## Test accuracy per seed (%)", ""] + per_seed_table(values) + [""] + order_lines(values)
    lines += ["", "## Verdicts per paper row (paired by seed, 95 % t interval)", ""] + claims_table(paper_claims(values))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
