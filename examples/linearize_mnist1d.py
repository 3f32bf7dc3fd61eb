"""Channel-wise vs layer-wise post-training linearization on MNIST-1D ("ResNets are deeper than you think").

Design (issue #24, experiment 3; fixed before the final run, grid sized by a one-seed smoke run that
looked at NAPL coverage and timing only):

- Question. At matched NAPL (normalised average path length), does a network whose ReLUs become
  linear unit by unit (channel-wise slopes: variable depth) keep more test accuracy than one whose
  ReLUs become linear a whole layer at a time (layer-wise slopes: fixed depth), once both have been
  fine-tuned equally after linearization? Is that gap smaller when the start is a residual network,
  which already mixes paths of several lengths? The same comparison at equal fraction of units linearized.
- Arms. Two starts: ``simkit:cnn1d:channels=16,layers=4`` (plain: conv → BN → ReLU × 4, NAPL 4) and the
  same with ``residual=True`` (blocks 2–4 add their input back, NAPL 2.5). Two granularities on one
  grid of penalty strengths *per unit*: the penalty is ω·Σ over slopes (|1 − α| + ε)^0.5 and a
  layer-wise slope stands for the 16 channels of its site, so channel-wise runs use ω = u and
  layer-wise runs ω = 16·u, u ∈ {0.002, 0.005, 0.01, 0.02, 0.05, 0.08, 0.095, 0.11, 0.13}. The grid is
  dense for u in 0.05–0.13 because there the layer-wise arm steps from NAPL 2 to 1 (plain) and
  from 1.5 to 1 (residual) (the smoke run: plain layer-wise NAPL 3 up to ω = 0.48, 2 at 0.8–1.36,
  1 at 1.36–1.76, 0 at 1.92); the channel-wise arm covers NAPL 3.6 → 0.4 (plain) and 2.2 → 0.3
  (residual) on the same grid. Every matched point prints the ω of the runs behind it (layer-wise ω
  and the channel-wise ω it comes from), so penalty strength can be read beside granularity.
- Data. MNIST-1D (the ``mnist1d`` data spec, its native 4000 / 1000 train / test split; nothing is
  downloaded). NAPL and the fraction linearized are measured on training inputs; accuracy on the test
  split. Nothing is chosen on accuracy (neither on validation nor on test): the grid was chosen for
  NAPL coverage, and every run of the grid is used.
- Budget (the same for both granularities). Each start pre-trains 15 epochs (AdamW, lr 2e-3, batch
  128); every run then post-trains 8 epochs (lr 2e-3, slope lr 3e-2) and recovers 3 epochs
  (``recover``: slopes fixed as post-training left them, penalty dropped, weights fine-tuned with
  cross-entropy, lr 2e-3). One torch thread.
- Seeds. 0–4 (``--seeds 5``): each seed initialises, pre-trains and post-trains its own network. The
  two granularities run as two sweeps per start (their ω grids differ); each pre-trains the same seed
  identically, which the script checks (same per-seed original accuracy), so channel − layer is paired.
- Score. Per seed, every distinct layer-wise NAPL is matched with the channel-wise accuracy at that
  NAPL (``simkit.matched_napl``: the channel-wise runs there, else interpolated between the two around
  it; "nearest" is a hint, not a match); difference = channel − layer, after recovery (headline) and
  before it (reference). The same at equal ``linearized_fraction``. Over seeds: the paired difference's
  mean with its 95 % t interval (``simkit.matched_over_seeds``, ``simkit.stats``).
- Claims and verdict rule (``simkit.stats.verdict``: reproduced when the 95 % interval lies on the
  claimed side of 0, "direction only" when only the mean does, otherwise not reproduced).
  C1 (plain start): channel − layer > 0 at matched NAPL. Headline at NAPL 2, after recovery; also
     printed with its own verdict: every other matched NAPL strictly between 0 and the original's
     (1 and 3), every matched fraction strictly between 0 and 1 (0.25, 0.5, 0.75), and before recovery.
  C2 (residual start): a smaller gap: per seed, gap(plain) − gap(residual) at the same NAPL > 0 (the
     starts are separate networks; seed k of one is paired with seed k of the other). Headline at
     NAPL 2, after recovery; also every other NAPL below 2.5 and fraction in (0, 1) matched in both
     starts, and before recovery.
- Expected (from the smoke run, one seed): C1 yes at NAPL 1 and 2 (+0.2 to +0.4 after recovery), small
  at NAPL 3 (≈ +0.04); C2 yes at NAPL 2 (residual gap ≈ 0), unclear at NAPL 1.
- Budget check: the smoke run (load ≈ 4 on the 2 cores) measured ≈ 0.38 s per epoch (one thread), so
  180 runs × 11 epochs and 20 pre-trainings × 15 epochs ≈ 14 minutes, less on an idle 2-core machine.
  (Recovery is 3 epochs, not the smoke run's 4, and u = 0.065 was dropped, to fit that budget while
  the experiment lock was queued; both decided before any run of the final settings.)

    .venv/bin/python examples/linearize_mnist1d.py --out runs/linearize_mnist1d --results examples/results/linearize_mnist1d.txt
    .venv/bin/python examples/linearize_mnist1d.py --quick --out /tmp/lin_quick    # a smoke run

Each sweep's run directory (``<out>/<start>_<granularity>``, with report.html) is written under --out;
rerunning with the same settings resumes finished runs (other settings are refused: choose another --out).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
from pathlib import Path

import pandas as pd
import torch

import simkit
from simkit.data import load_data
from simkit.models import load_model
from simkit.stats import paired_difference, verdict

NETWORKS = {
    "plain": "simkit:cnn1d:channels=16,layers=4",
    "residual": "simkit:cnn1d:channels=16,layers=4,residual=True",
}
CHANNELS = 16   # channels of every activation site of both starts: one layer-wise slope stands for 16 units
SCALE = {"channel": 1.0, "layer": float(CHANNELS)}   # ω = SCALE × u (u: penalty strength per unit)
UNIT_OMEGAS = "0.002,0.005,0.01,0.02,0.05,0.08,0.095,0.11,0.13"
HEADLINE_NAPL = 2.0   # the NAPL of both headline verdicts (after recovery)
ACCURACY = {"after recovery": "accuracy_recovered", "before recovery": "accuracy"}
AXES = ("napl", "linearized_fraction")
# the code this experiment runs through, named one by one when uncommitted
USED = ("examples/linearize_mnist1d.py", "simkit/linearization/", "simkit/stats.py", "simkit/__init__.py",
        "simkit/training", "simkit/models", "simkit/data.py", "simkit/forward", "simkit/rundir")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/linearize_mnist1d"))
    parser.add_argument("--results", type=Path, default=None, help="also write the printed note to this file")
    parser.add_argument("--train-epochs", type=float, default=15)
    parser.add_argument("--epochs", type=float, default=8, help="post-training epochs per run")
    parser.add_argument("--recover", type=float, default=3, help="recovery epochs per run")
    parser.add_argument("--unit-omegas", default=UNIT_OMEGAS, help="u: channel-wise ω = u, layer-wise ω = 16·u")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--slope-lr", type=float, default=3e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    args = parser.parse_args()
    args.units = [float(u) for u in args.unit_omegas.split(",")]
    args.n = None
    if args.quick:
        args.train_epochs, args.epochs, args.recover, args.seeds, args.n = 2, 4, 1, 2, 2000
        args.units = [0.02, 0.08, 0.13]
    return args


def provenance() -> str:
    """Commit (naming the uncommitted files of the code the run uses), CPU model and cores."""
    status = subprocess.run(["git", "status", "--porcelain", "--", "simkit", "examples/linearize_mnist1d.py"],
                            capture_output=True, text=True, check=False).stdout
    dirty = [line[3:] for line in status.splitlines() if line.strip()]
    named = [p for p in dirty if p.startswith(USED)]
    others = f" and {len(dirty) - len(named)} other files under simkit/" if len(dirty) > len(named) else ""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()
    commit = head + (f" (uncommitted: {', '.join(named) or 'none of its own'}{others})" if dirty else "")
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or platform.machine())
    return f"commit {commit}; CPU {cpu}, {os.cpu_count()} cores"


def run_start(name: str, spec: str, data, args: argparse.Namespace) -> dict:
    """Both granularities' sweeps of one start: runs, aggregate, per-seed original accuracies, original
    NAPL and seconds."""
    t0 = time.perf_counter()
    runs, aggregates, originals = [], [], []
    for granularity, scale in SCALE.items():
        settings = simkit.LinearizeSettings(
            granularity=[granularity], omega=[scale * u for u in args.units], epochs=args.epochs,
            train=args.train_epochs, lr=args.lr, slope_lr=args.slope_lr, batch_size=128, seed=args.seed,
            seeds=args.seeds, cka=False, recover=args.recover)
        run_dir = args.out / f"{name}_{granularity}"
        # each seed builds its own network; an earlier run of the same settings resumes, other settings are refused
        result = simkit.linearize(lambda seed, spec=spec: load_model(spec, seed=seed), data, settings,
                                  run_dir=run_dir, resume=(run_dir / "inputs.json").is_file(), progress=False,
                                  model_name=spec)
        simkit.save_run(result, run_dir)
        print(f"{name} {granularity}: {time.perf_counter() - t0:.0f} s", flush=True)
        runs.append(result.tables["runs"])
        aggregates.append(result.tables["aggregate"])
        originals.append([round(a, 12) for a in result.summary["original_accuracies"]])
        if result.summary["num_units"] != CHANNELS * len(result.summary["sites"]):
            raise SystemExit(f"{spec}: expected {CHANNELS} channels per activation site; fix CHANNELS")
    if originals[0] != originals[1]:
        raise SystemExit(f"{name}: the two sweeps pre-trained different networks ({originals}); the pairing "
                         "of channel- and layer-wise runs by seed would not hold")
    return {"runs": pd.concat(runs, ignore_index=True), "aggregate": pd.concat(aggregates, ignore_index=True),
            "originals": originals[0], "top": float(result.summary["original_napl"]),
            "seconds": time.perf_counter() - t0}


def matched(runs: pd.DataFrame) -> dict[tuple[str, str], tuple[pd.DataFrame, pd.DataFrame]]:
    """(axis, accuracy label) → (per-seed matched rows, over seeds) for both axes, after and before recovery."""
    out = {}
    for axis in AXES:
        for label, value in ACCURACY.items():
            per_seed = simkit.matched_napl(runs, x=axis, value=value)
            out[axis, label] = per_seed, simkit.matched_over_seeds(per_seed, x=axis)
    return out


def interior(frame: pd.DataFrame, axis: str, top: float) -> pd.DataFrame:
    """Rows strictly between "nothing compared" (0 for NAPL, 1 for the fraction) and the original."""
    values = frame[axis]
    return frame[(values > 0) & (values < top)] if axis == "napl" else frame[(values > 0) & (values < 1)]


def ci(mean: float, low: float, high: float, n: int) -> str:
    """A difference in accuracy points with its 95 % interval."""
    if n < 2:
        return f"{100 * mean:+.1f} pt (one seed)"
    return f"{100 * mean:+.1f} pt [{100 * low:+.1f}, {100 * high:+.1f}]"


def aggregate_text(aggregate: pd.DataFrame) -> str:
    rows = [{"run": r["run"], "u": f"{r['omega'] / SCALE[r['granularity']]:g}",
             "NAPL": f"{r['napl_mean']:.2f} ± {r['napl_std']:.2f}",
             "lin. fraction": f"{r['linearized_fraction_mean']:.3f}",
             "mean |1-α|": f"{r['mean_abs_one_minus_alpha_mean']:.3f}",
             "acc before": f"{r['accuracy_mean']:.3f} ± {r['accuracy_std']:.3f}",
             "acc after": f"{r['accuracy_recovered_mean']:.3f} ± {r['accuracy_recovered_std']:.3f}",
             "recovery gain [95 % CI]": ci(r["recovery_gain_mean"], r["recovery_gain_low"], r["recovery_gain_high"],
                                           int(r["seeds"]))}
            for _, r in aggregate.iterrows()]
    return pd.DataFrame(rows).to_string(index=False)


def over_seeds_text(over: pd.DataFrame, axis: str) -> str:
    rows = [{axis: f"{r[axis]:.3g}", "seeds matched": f"{int(r['matched_seeds'])}/{int(r['seeds'])}",
             "layer-wise": f"{r['layer_accuracy_mean']:.3f}", "channel-wise": f"{r['channel_accuracy_mean']:.3f}",
             "channel − layer [95 % CI]": ci(r["difference_mean"], r["difference_low"], r["difference_high"],
                                             int(r["matched_seeds"])),
             "verdict": r["verdict"]} for _, r in over.iterrows()]
    return pd.DataFrame(rows).to_string(index=False) if rows else "(nothing matched)"


def per_seed_text(per_seed: pd.DataFrame, axis: str) -> str:
    rows = [{"seed": int(r["seed"]), axis: f"{r[axis]:.3g}", "layer ω": r["layer_omega"],
             "channel ω": r["channel_omega"], "how": r["how"], "layer": f"{r['layer_accuracy']:.3f}",
             "channel": f"{r['channel_accuracy']:.3f}", "channel − layer": f"{r['difference']:+.3f}"}
            for _, r in per_seed.iterrows()]
    return pd.DataFrame(rows).to_string(index=False) if rows else "(nothing matched)"


def start_text(name: str, aggregate: pd.DataFrame, originals: list, tables: dict, top: float) -> list[str]:
    """The section of one start: per-ω aggregates, matched tables over seeds and per seed."""
    accs = ", ".join(f"{a:.3f}" for a in originals)
    lines = ["", f"== {name} ({NETWORKS[name]}): original NAPL {top:g}, test accuracy per seed {accs}",
             "per granularity × ω (u = ω per unit: channel ω = u, layer ω = 16·u); mean ± std over seeds:",
             aggregate_text(aggregate)]
    for (axis, label), (_, over) in tables.items():
        lines += ["", f"channel − layer at matched {axis}, {label} (mean over seeds, paired 95 % t interval):",
                  over_seeds_text(interior(over, axis, top), axis)]
    for axis in AXES:
        for label in ACCURACY:
            per_seed = tables[axis, label][0]
            lines += ["", f"per seed, matched {axis}, {label} (ω of the runs behind each point):",
                      per_seed_text(interior(per_seed, axis, top), axis)]
    return lines


def claim_1(tables: dict, top: float) -> list[str]:
    """C1: channel − layer > 0 on the plain start, at every interior matched point, after and before recovery."""
    lines = ["C1 (plain start: channel-wise keeps more accuracy than layer-wise at matched NAPL):"]
    for label in ACCURACY:
        for axis in AXES:
            over = interior(tables[axis, label][1], axis, top)
            for _, r in over.iterrows():
                mark = " ← headline" if label == "after recovery" and axis == "napl" and r[axis] == HEADLINE_NAPL else ""
                lines.append(f"   {label}, {axis} {r[axis]:.3g}: channel − layer "
                             f"{ci(r['difference_mean'], r['difference_low'], r['difference_high'], int(r['matched_seeds']))}"
                             f" over {int(r['matched_seeds'])} seeds → {r['verdict']}{mark}")
    return lines


def gap_difference(plain: pd.DataFrame, residual: pd.DataFrame, axis: str, value: float) -> tuple[str, str]:
    """(gap(plain) − gap(residual) at ``value`` of ``axis`` with its interval, verdict), paired by seed
    over the seeds matched (exact or interpolated) in both starts."""
    def gaps(frame: pd.DataFrame) -> pd.Series:
        rows = frame[(frame[axis] == value) & (frame["how"] != "nearest")]
        return rows.set_index("seed")["difference"]

    both = pd.concat([gaps(plain), gaps(residual)], axis=1, keys=["plain", "residual"], join="inner")
    interval = paired_difference(both["plain"], both["residual"])
    text = (f"gap plain {100 * both['plain'].mean():+.1f} pt, residual {100 * both['residual'].mean():+.1f} pt; "
            f"plain − residual {ci(interval.mean, interval.low, interval.high, interval.n)} over {interval.n} seeds")
    return text, verdict(interval, higher=True)


def claim_2(plain: dict, residual: dict, residual_top: float) -> list[str]:
    """C2: gap(plain) − gap(residual) > 0 at every interior value matched in both starts."""
    lines = ["C2 (residual start: a smaller channel − layer gap than the plain start at the same point):"]
    for label in ACCURACY:
        for axis in AXES:
            p, r = plain[axis, label][0], residual[axis, label][0]
            common = sorted(set(interior(p, axis, residual_top)[axis]) & set(interior(r, axis, residual_top)[axis]))
            for value in common:
                text, word = gap_difference(p, r, axis, value)
                mark = " ← headline" if label == "after recovery" and axis == "napl" and value == HEADLINE_NAPL else ""
                lines.append(f"   {label}, {axis} {value:.3g}: {text} → {word}{mark}")
    return lines


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    started, load_before = time.perf_counter(), os.getloadavg()
    data = load_data("mnist1d", n=args.n, seed=args.seed)
    results = {name: run_start(name, spec, data, args) for name, spec in NETWORKS.items()}
    tables = {name: matched(result["runs"]) for name, result in results.items()}
    total, load_after = time.perf_counter() - started, os.getloadavg()
    timing = ", ".join(f"{name} {result['seconds']:.0f} s" for name, result in results.items())
    lines = [f"examples/linearize_mnist1d.py — {args.seeds} seeds ({args.seed}–{args.seed + args.seeds - 1}), "
             f"u = {', '.join(f'{u:g}' for u in args.units)} (channel ω = u, layer ω = {CHANNELS}·u), pre-train "
             f"{args.train_epochs:g} epochs, post-train {args.epochs:g}, recover {args.recover:g} epochs per run, "
             f"lr {args.lr:g}, slope lr {args.slope_lr:g}" + (" [--quick]" if args.quick else ""),
             f"{provenance()}; torch threads {torch.get_num_threads()}",
             f"run time {total:.0f} s ({timing}); load average "
             f"(1 min) {load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end",
             "accuracy on the MNIST-1D test split (1000 samples); differences in accuracy points with the paired "
             "95 % t interval over seeds; verdicts by simkit.stats.verdict."]
    for name, result in results.items():
        lines += start_text(name, result["aggregate"], result["originals"], tables[name], result["top"])
    lines += ["", "== verdicts", *claim_1(tables["plain"], results["plain"]["top"]),
              *claim_2(tables["plain"], tables["residual"], results["residual"]["top"]),
              "", f"run directories (report.html each): {args.out}/<plain|residual>_<channel|layer>"]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.results is not None:
        args.results.write_text(text)


if __name__ == "__main__":
    main()
