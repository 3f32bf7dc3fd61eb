"""Network of Theseus, experiment 2 of issue 23, redesigned by issue 38 (item 6): the order of the four
schedules on MNIST-1D with a guide deep enough for error to pile up over frozen stages.

Design (written before the full run; the sizing paragraph from a smoke run, before any full-run result):

- Question: the paper's mechanism is that a module aligned to the guide's own inputs (independent) or
  frozen after its stage (sequential) meets inputs the guide never gave it once the earlier modules are
  converted, and the error piles up stage after stage; progressive (every converted module keeps training)
  avoids that and beats joint (everything swapped at once). The paper (ImageNet, ResNet-18 → MLP):
  progressive 62.1 > joint 58.0 > independent 45.1 > sequential 30.7. Two claims are tested:
  1. progressive − joint > 0 (paper +4.1), joint given the module updates progressive used;
  2. independent − sequential > 0 (paper +14.4).
- Why the earlier design could not show it (issue 38): 3 slots (little room to pile up), stages of 300
  fixed steps far from converged (300 → 1000 steps per stage was worth +3.8 in the calibration), and joint
  got 900 steps × 3 modules = 2,700 module updates against progressive's 300 × (1 + 2 + 3) = 1,800.
- Guide: ``simkit:cnn1d:channels=8,layers=6,kernel=5`` (6 conv blocks with BatchNorm and ReLU, a linear
  head): 6 conversion slots, each a 320-wide feature map (8 channels × 40 positions), narrow so that the
  alignment stays cheap (see Sizing). Trained per seed inside the run under the plateau rule (AdamW 1e-2,
  constant LR halved on validation plateaus, until no longer still improving, cap 40 epochs), best
  validation epoch kept.
- Target: ``conv-to-mlp`` at rank 64 (each conv → flatten → Linear(320, 64) → Linear(64, 320); BatchNorm
  and ReLU stay; the first slot reads the 40-long input).
- Data: MNIST-1D (4000 train / 1000 test); 10 % of train (400 rows, seeded) is the validation split,
  whose inputs (never labels) join the alignment inputs (``align_val``). The test split chooses nothing.
- Stages: automatic (``steps_per_stage="auto"``, the library's stage control): a stage ends when the EMA
  of its loss (1 − linear CKA, batch 256, AdamW 1e-3, LR halved on EMA plateaus) falls below 0.002 or at
  the cap of 400 steps per stage. The EMA and plateau window is 50 steps (the library's default 100, the
  paper's 500): the EMA starts at the first loss (≈ 0.5), so a window w cannot end a stage before
  ≈ w · ln(0.5 / 0.002) ≈ 5.5 w steps; with 50 a converged stage can end after ≈ 280 steps, and the LR
  anneals within the cap. Progressive, sequential and independent run 6 such stages each.
- Joint's budget: given the module updates progressive used, per seed. A progressive stage s that ran
  n_s steps trained s modules, so progressive made U = Σ_s s · n_s module updates; joint trains all 6
  modules each step and runs U / 6 steps (``steps_per_stage`` = round(U / 36), fixed, no loss stop, in a
  second ``convert`` call on the same seed: same data split, same guide, retrained by the same seeded
  recipe; the note checks the two guides score the same). Joint's forward pass runs all 6 modules every
  step, progressive's stage s runs s of them, so matched module updates are also matched forward compute.
  Every arm's module updates are reported (sequential and independent: one module per step).
- Labelled training, one rule for every arm (``baseline_budget="plateau"``, the library default): head
  alone for 3 epochs, then everything with AdamW 1e-3 (constant, halved after 5 epochs without a better
  validation accuracy) until the best validation epoch is 10 epochs back, never before head + fine-tuning
  = 3 + 12 = 15 labelled epochs (the floor), never past 40 (the cap); best validation epoch kept. No
  baselines (experiment 1 has them).
- Seeds: 5 (0–4), every arm paired by seed (same guide, split and data order).
- Gate (before the claims are judged): the guide must have something to transfer: the 95 % t interval
  of its mean validation accuracy over the seeds lies above 90 %; else "not testable at this scale".
- Verdicts (``theseus_note.Claim``, ``simkit.stats.verdict``, size 0, test accuracy, paired by seed, 95 %
  Student t interval): reproduced when the interval lies above 0, "direction only" when only the mean
  does, else not reproduced.
- Reported without a claim: the measured order and its neighbours' paired differences; the same two
  differences on the linear probe (head trained alone on the aligned features, before fine-tuning: where
  piled-up error shows before fine-tuning can repair it); per-slot held-out CKA with the guide after the
  last stage (independent: each module in isolation and after assembly), the pile-up profile; each
  stage's steps and why it ended; each arm's module updates, labelled epochs and how its training stopped.
- Sizing (smoke run, one torch thread, load ≈ 2 on the 2 cores, before any full run): the 16-channel
  guide (640-wide maps, rank 128), 300-step stage caps, 1 seed: the guide 96.4 % test after 10 epochs;
  alignment steps cost 10 / 23 / 34 / 46 / 65 / 103 ms for progressive's stages 1–6 (it aligns and
  back-propagates s CKA terms of 256 × 640), ≈ 17 ms for sequential, ≈ 14 ms for independent, joint ≈
  100 ms; fine-tuning ≈ 28 ms per step (29 steps per epoch). With a cap of 1000 steps per stage one seed
  would need ≈ 800 s of alignment alone (≈ 70 min for 5 seeds). Shrunk in advance, before any result:
  8 channels (320-wide maps; the Gram products of the CKA terms scale with the width, ≈ ½ the cost),
  rank 64, stage cap 400 with the 50-step window above, labelled floor 15 and cap 40 epochs, guide cap
  40 epochs. Estimate per seed: alignment ≈ 6 × 400 × (25 + 10 + 8) ms + joint ≈ 1,400 × 50 ms ≈ 175 s,
  labelled training ≈ 4 × 25 epochs × 29 × 15 ms ≈ 45 s, the guide twice ≈ 15 s: ≈ 4 min per seed,
  ≈ 20 min for 5 seeds. A second smoke (8 channels, one seed) runs right before the full run in the same
  slot; the full run is stopped if that guide's validation accuracy is below 90 % or a seed takes over
  6 minutes (then the design is shrunk again, and said so here).

    /work/tools/heavy env OMP_NUM_THREADS=1 .venv/bin/python examples/theseus_schedules.py \\
        --out runs/theseus_schedules_e2b --results examples/results/theseus_schedules.md

Defaults: the design above. One run directory per seed and call (``--out/seed<S>-staged``,
``--out/seed<S>-joint``); the note goes to ``--out/note.md`` and ``--results``.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from theseus_note import (
    Claim,
    claims_table,
    experiment_parser,
    frame_markdown,
    header,
    load_text,
    per_seed_table,
)

import simkit
from simkit.data import load_data
from simkit.models import load_model
from simkit.stats import beyond_noise

GUIDE = "simkit:cnn1d:channels={channels},layers=6,kernel=5"
SLOTS = 6
STAGED = ["progressive", "sequential", "independent"]
SCHEDULES = [*STAGED, "joint"]
PAPER = {"progressive": 62.1, "joint": 58.0, "independent": 45.1, "sequential": 30.7}
GUIDE_GATE = 0.90
TITLE = "Network of Theseus, schedule order on MNIST-1D, 6 slots (issue 23 experiment 2, redesigned by issue 38)"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (defaults: the design above)."""
    p = experiment_parser(__doc__, "runs/theseus_schedules_e2b", seeds=5)
    p.add_argument("--guide-epochs", type=float, default=40, help="cap of the guide's plateau training")
    p.add_argument("--channels", type=int, default=8, help="the guide's width (channels of every conv)")
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--plateau-window", type=int, default=50, help="steps of the stage-loss EMA and LR checks")
    p.add_argument("--max-stage-steps", type=int, default=400, help="cap of one automatic stage")
    p.add_argument("--head-epochs", type=float, default=3)
    p.add_argument("--finetune-epochs", type=float, default=12, help="floor: head + these labelled epochs")
    p.add_argument("--max-epochs", type=float, default=40, help="cap of every arm's labelled epochs")
    return p.parse_args(argv)


def base_settings(args: argparse.Namespace, seed: int) -> simkit.ConvertSettings:
    """One seed's conversion settings shared by both calls (the design's recipe, rule and budgets)."""
    return simkit.ConvertSettings(
        recipe="conv-to-mlp", rank=args.rank, schedule=list(STAGED), metric=["linear_cka"], guide_init=["trained"],
        baselines=[], steps_per_stage="auto", max_stage_steps=args.max_stage_steps,
        plateau_window=args.plateau_window, batch_size=256, lr=1e-3,
        head_epochs=args.head_epochs, finetune_epochs=args.finetune_epochs, baseline_max_epochs=args.max_epochs,
        baseline_budget="plateau", train_guide=args.guide_epochs, val_fraction=0.1, align_val=True, seed=seed,
        seeds=1, n=args.n, compare_layers=False)


def stage_modules(schedule: str, stage: str) -> int:
    """Modules one step of ``stage`` trains: progressive stage s trains s, joint all, the others one."""
    if schedule == "progressive":
        return int(stage.removeprefix("stage"))
    return SLOTS if schedule == "joint" else 1


def module_updates(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (seed, schedule) the alignment steps and module updates (Σ steps × modules trained)."""
    frame = summary.assign(updates=[s * stage_modules(sc, st) for s, sc, st in
                                    zip(summary["steps"], summary["schedule"], summary["stage"], strict=True)])
    return frame.groupby(["seed", "schedule"], as_index=False)[["steps", "updates"]].sum()


def joint_settings(base: simkit.ConvertSettings, progressive_updates: int) -> simkit.ConvertSettings:
    """Joint with the module updates of progressive: SLOTS × k steps of SLOTS modules, k = U / SLOTS²."""
    k = max(1, round(progressive_updates / SLOTS ** 2))
    return dataclasses.replace(base, schedule=["joint"], steps_per_stage=k, stop_loss="auto")


def convert_seed(args: argparse.Namespace, seed: int, data: simkit.data.Dataset) -> list[simkit.ConvertResult]:
    """Both calls of one seed: the staged schedules, then joint at progressive's module updates."""
    results = []
    base, guide = base_settings(args, seed), GUIDE.format(channels=args.channels)
    for name in ("staged", "joint"):
        settings = base if name == "staged" else joint_settings(
            base, int(module_updates(results[0].tables["stage_summary"]).query("schedule == 'progressive'")
                      ["updates"].iloc[0]))
        out = args.out / f"seed{seed}-{name}"
        result = simkit.convert(lambda s: load_model(guide, seed=s), data, settings, run_dir=out,
                                resume=args.resume, guide_name=guide, data_name="mnist1d", progress=False)
        simkit.save_run(result, out, report=not args.no_report)
        results.append(result)
        print(f"seed {seed} {name}: done", flush=True)
    return results


def combined(results: list[simkit.ConvertResult], table: str) -> pd.DataFrame:
    """One table of every call, with a ``call`` column (staged or joint) and the call's guide scores."""
    def labels(result: simkit.ConvertResult) -> dict[str, object]:
        call = "joint" if list(result.tables["runs"]["schedule"]) == ["joint"] else "staged"
        return {"call": call, "guide_val": result.summary["guide_val_accuracy"],
                "guide_steps": result.summary["guide_steps"], "guide_stopped": result.extra["guide_stopped"]}
    return pd.concat([r.tables[table].assign(**labels(r)) for r in results], ignore_index=True)


def per_seed(runs: pd.DataFrame, column: str, schedule: str) -> pd.Series:
    """``column`` per seed (index) of one schedule's runs rows."""
    part = runs[runs["schedule"] == schedule].drop_duplicates("seed").set_index("seed")[column]
    return part.astype(float).sort_index()


def gate_lines(runs: pd.DataFrame) -> tuple[Claim, list[str]]:
    """The guide gate (its mean validation accuracy's 95 % interval above 90 %), per seed, with the two
    calls' guides compared (the same seeded recipe must give the same guide)."""
    first = runs.drop_duplicates(["seed", "call"])
    table = first.pivot_table(index="seed", columns="call", values=["guide_val", "guide_accuracy"], aggfunc="first")
    staged = first[first["call"] == "staged"].set_index("seed").sort_index()
    gate = Claim("gate: guide validation accuracy > 90 %", "", staged["guide_val"].astype(float), size=GUIDE_GATE)
    same = bool((table["guide_accuracy"]["staged"] == table["guide_accuracy"]["joint"]).all())
    lines = ["## Gate: the guide has something to transfer", "",
             "| seed | guide validation | guide test (staged call) | guide test (joint call) | guide steps | stopped |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {s} | {100 * row['guide_val']:.1f} | {100 * table.loc[s, ('guide_accuracy', 'staged')]:.1f} | "
              f"{100 * table.loc[s, ('guide_accuracy', 'joint')]:.1f} | {row['guide_steps']:.0f} | "
              f"{row['guide_stopped']} |" for s, row in staged.iterrows()]
    lines += ["", claims_table([gate])[0], claims_table([gate])[1], gate.markdown(), "",
              f"The two calls' guides score {'the same on every seed (the same guide)' if same else 'DIFFERENTLY'}.",
              ""]
    return gate, lines


def order_lines(values: dict[str, pd.Series]) -> list[str]:
    """The measured order by mean and each neighbour pair's paired difference with its 95 % t interval."""
    ranked = sorted(values, key=lambda name: -float(values[name].mean()))
    lines = ["Measured order: " + " > ".join(f"{n} {100 * values[n].mean():.1f}" for n in ranked), "",
             "| neighbours | paired difference (95 % t interval) | beyond noise |", "|---|---|---|"]
    for upper, lower in zip(ranked, ranked[1:], strict=False):
        interval = Claim(f"{upper} − {lower}", "", values[upper], values[lower], kind="report").interval()
        lines.append(f"| {upper} − {lower} | {interval.text(1, ' pts')} | {'yes' if beyond_noise(interval) else 'no'} |")
    return lines


def claims(acc: dict[str, pd.Series], probe: dict[str, pd.Series], gate: Claim) -> list[Claim]:
    """The two claims of the design (test accuracy, size 0) and the same pairs on the probe (reported)."""
    pairs = [("progressive", "joint", " (joint at progressive's module updates)"), ("independent", "sequential", "")]
    rows = [Claim(f"{a} − {b} > 0{note}", f"{PAPER[a]} − {PAPER[b]} = {PAPER[a] - PAPER[b]:+.1f}", acc[a], acc[b],
                  requires=gate) for a, b, note in pairs]
    rows += [Claim(f"probe before fine-tuning: {a} − {b}", "not in the paper", probe[a], probe[b], kind="report")
             for a, b, _ in pairs]
    return rows


def pileup_lines(stages: pd.DataFrame) -> list[str]:
    """Per slot, the held-out linear CKA with the guide after alignment (mean over seeds), per schedule:
    progressive/sequential/joint after their last stage, independent in isolation and once assembled."""
    last = {"progressive": f"stage{SLOTS}", "sequential": f"stage{SLOTS}", "joint": "joint"}
    columns: dict[str, pd.Series] = {}
    for schedule, stage in last.items():
        part = stages[(stages["schedule"] == schedule) & (stages["stage"] == stage)]
        columns[schedule] = part.groupby("layer", sort=False)["value"].mean()
    ind = stages[stages["schedule"] == "independent"]
    isolated = ind[ind["stage"].str.startswith("stage")]
    columns["independent (isolated)"] = isolated.groupby("layer", sort=False)["value"].mean()
    columns["independent (assembled)"] = ind[ind["stage"] == "assembled"].groupby("layer", sort=False)["value"].mean()
    frame = pd.DataFrame(columns).reset_index(names="slot")
    return ["## Pile-up profile: held-out linear CKA with the guide per slot after alignment (mean of seeds)", "",
            frame_markdown(frame), ""]


def budget_lines(runs: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """Alignment steps, module updates, stage stops and labelled training per seed and schedule."""
    updates = module_updates(summary)
    stops = summary.groupby(["seed", "schedule"])["stopped"].apply(
        lambda s: f"{(s == 'stop_loss').sum()}/{len(s)}").rename("stages ended on the loss").reset_index()
    cols = ["seed", "schedule", "labelled_epochs", "best_step", "still_improving", "stopped", "align_seconds"]
    frame = updates.merge(stops, on=["seed", "schedule"]).merge(runs[cols], on=["seed", "schedule"])
    steps = summary.pivot_table(index=["schedule", "seed"], columns="stage", values="steps", aggfunc="first")
    return ["## Budgets per seed and schedule", "",
            "Alignment steps, module updates (Σ steps × modules trained), stages that ended on the loss "
            "threshold, labelled epochs (head + fine-tuning), best fine-tuning step, how it stopped.", "",
            frame_markdown(frame.rename(columns={"steps": "align steps", "updates": "module updates"})), "",
            "Steps per stage:", "", frame_markdown(steps.reset_index()), ""]


def note(results: list[simkit.ConvertResult], command: str, load_before: str, seconds: float) -> str:
    """The results note: header, gate, per-seed accuracies, order, verdicts, pile-up profile, budgets."""
    runs, summary, stages = (combined(results, t) for t in ("runs", "stage_summary", "stages"))
    acc = {s: per_seed(runs, "converted_accuracy", s) for s in SCHEDULES}
    probe = {s: per_seed(runs, "probe_accuracy", s) for s in SCHEDULES}
    gate_claim, gate = gate_lines(runs)
    lines = header(TITLE, command, load_before, seconds) + gate
    lines += ["## Test accuracy per seed (%)", ""] + per_seed_table(acc) + [""] + order_lines(acc)
    lines += ["", "## Linear probe before fine-tuning per seed (%)", ""] + per_seed_table(probe)
    lines += ["", "## Verdicts (paired by seed, 95 % t interval, size 0)", ""] + claims_table(claims(acc, probe, gate_claim))
    lines += [""] + pileup_lines(stages) + budget_lines(runs, summary)
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run every seed (both calls), then write the note to ``--out/note.md`` and ``--results``."""
    args = parse()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # a script of its own: the whole process may flush
    load_before, started = load_text(), time.perf_counter()
    data = load_data("mnist1d")
    results = [r for seed in range(args.seed, args.seed + args.seeds) for r in convert_seed(args, seed, data)]
    text = note(results, f"python {shlex.join(sys.argv)}", load_before, time.perf_counter() - started)
    for path in [args.out / "note.md"] + ([args.results] if args.results else []):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
