"""Standard vs invariance-aware stitching between adversarially trained (robust) and standard models.

Design (written before the run; scikit-learn digits 8×8, offline, CPU)

Question. The paper's third finding, as the issue states it: invariance-aware stitching reduces
stitching's exploitation of predictive cues absent from the models' original training data. A
robust model never learned the non-robust (small-perturbation) features of the data: PGD training
removed them from what it fits. Standard stitching only asks whether A's features can drive B
(forward compatibility), so it rates robust and standard models compatible; invariance-aware
stitching also asks whether B is invariant to what A ignores. A standard model's IRIs (inputs it
represents like x) keep most of the seed image and differ from it by non-robust perturbations, which a
robust B does not read as x; a robust model's IRIs carry x's robust, perceptible features.

Models (the ``PoolCNN`` of ``stitching_shortcut.py``; 600 Adam steps, lr 3e-3, weight decay 1e-2):
R and R′ (two inits) trained with L∞ PGD (eps 0.1 on inputs in [0, 1], 5 steps of 2.5·eps/5, no random
start); N and N′ (two inits) trained on clean digits. Robust accuracy: PGD with 10 steps at eps 0.1.

Arms. Pairs R→R′ (robust↔robust), R→N and N→R (robust↔standard), N→N′ (standard↔standard), each
stitched at pool2, fc1_relu and fc2_relu with HLM, SLM, DM and FuLA, standard vs invariance-aware
(library defaults for IRIs; pool1 is left out, its IRIs are copies of the originals). Stitching data: the digits training split; evaluation: the digits
test split (every model is accurate on both).

Score. Penalty = B's accuracy − stitched accuracy on the test split, in points. Spread = standard
deviation over 3 seeds (models, data order, IRIs, stitches reseeded). 100 stitch steps per stitch.

Expected. Standard stitching: every pair within a few points (all compatible). Invariance-aware: R→R′
small; pairs whose front is standard (N→N′, N→R) at least 10 points above R→R′ at the deeper layers
(fc1_relu, fc2_relu) for SLM, DM and FuLA, beyond twice the seed spread; R→N in between.

    .venv/bin/python examples/stitching_robust.py --out runs/stitching_robust

Writes one run directory per seed and pair, the combined report ``<out>/combined/report.html`` and the
text summary ``examples/results/stitching_robust.txt`` (``--results``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pandas as pd
import torch
from stitching_shortcut import COLUMNS, DEEP, OBJECTIVES, PoolCNN, fmt, mean_spread
from torch import nn

import simkit
from simkit.data import Dataset, load_data

PAIRS = (("R", "R2"), ("R", "N"), ("N", "R"), ("N", "N2"))
# pool1 (16×4×4 of an 8×8 input) is nearly injective: its IRIs are copies of the originals and both arms
# coincide there (stitching_shortcut.py shows it), so this example stitches only from pool2 on.
LAYERS = ("pool2", "fc1_relu", "fc2_relu")
EPS, TRAIN_PGD_STEPS, EVAL_PGD_STEPS = 0.1, 5, 10


def train(seed: int, data: Dataset, steps: int, robust: bool, name: str) -> nn.Module:
    torch.manual_seed(seed)
    model = PoolCNN()
    config = simkit.TrainConfig(steps=steps, lr=3e-3, batch_size=128, seed=seed, weight_decay=1e-2,
                                description=f"train {name}")
    if robust:
        simkit.train_adversarial(model, data, config, eps=EPS, steps=TRAIN_PGD_STEPS)
    else:
        simkit.train_classifier(model, data, config)
    return model.eval()


def verdicts(agg: pd.DataFrame) -> list[str]:
    """Claim by claim, from the mean ± spread penalties (points) at the deeper layers."""
    def cell(pair: str, setting: str, objective: str, layer: str) -> tuple[float, float]:
        row = agg.loc[(pair, setting, objective, layer)]
        return float(row["mean"]), float(row["spread"])

    lines, ok1, rows1 = [], True, []
    for objective in OBJECTIVES:
        for layer in DEEP:
            ref, _ = cell("R->R2", "standard", objective, layer)
            for pair in ("R->N", "N->R", "N->N2"):
                m, _ = cell(pair, "standard", objective, layer)
                within = m - ref <= 5
                ok1 &= within
                rows1.append(f"{pair} {objective} {layer}: {m:.1f} vs {ref:.1f} ({'within' if within else 'NOT within'} 5)")
    lines.append("Standard stitching rates every pair as compatible as R->R2 (penalty at most 5 points above it, "
                 f"deeper layers): {'REPRODUCED' if ok1 else 'NOT REPRODUCED'}")
    lines += ["  " + r for r in rows1]
    ok2, rows2 = True, []
    for objective in ("slm", "dm", "fula"):
        for layer in DEEP:
            ref, ref_sd = cell("R->R2", "iri", objective, layer)
            for pair in ("N->R", "N->N2"):
                m, sd = cell(pair, "iri", objective, layer)
                gap = m - ref
                sep = gap >= 10 and gap > 2 * max(sd, ref_sd)
                ok2 &= sep
                rows2.append(f"{pair} {objective} {layer}: {m:.1f} ± {sd:.1f} vs {ref:.1f} ± {ref_sd:.1f}, gap "
                             f"{gap:.1f} ({'separated' if sep else 'NOT separated'})")
            m, sd = cell("R->N", "iri", objective, layer)
            rows2.append(f"R->N {objective} {layer}: {m:.1f} ± {sd:.1f} (expected between R->R2 and N->R)")
    lines.append("Invariance-aware stitching penalises pairs with a standard front (N->R, N->N2) >= 10 points more "
                 "than R->R2, beyond twice the seed spread (SLM/DM/FuLA, deeper layers): "
                 f"{'REPRODUCED' if ok2 else 'NOT REPRODUCED'}")
    lines += ["  " + r for r in rows2]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/stitching_robust"))
    parser.add_argument("--results", type=Path, default=Path("examples/results/stitching_robust.txt"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=600)
    parser.add_argument("--stitch-steps", type=int, default=100)
    parser.add_argument("--cache-dir", type=Path, default=Path("runs/.iri-cache"))
    args = parser.parse_args()
    started = time.perf_counter()
    load_before = os.getloadavg()

    digits = load_data("digits")
    train_part, test = digits.train_test()
    lines: list[str] = []
    frames, iri_frames, warnings_seen, robust_rows = [], [], [], []
    for seed in range(args.seeds):
        models = {"R": train(100 * seed, train_part, args.train_steps, True, f"R seed {seed}"),
                  "R2": train(100 * seed + 1, train_part, args.train_steps, True, f"R2 seed {seed}"),
                  "N": train(100 * seed + 2, train_part, args.train_steps, False, f"N seed {seed}"),
                  "N2": train(100 * seed + 3, train_part, args.train_steps, False, f"N2 seed {seed}")}
        for name, model in models.items():
            clean = simkit.evaluate_accuracy(model, test.inputs, test.labels)
            robust = simkit.robust_accuracy(model, test.inputs, test.labels, eps=EPS, steps=EVAL_PGD_STEPS)
            robust_rows.append({"model": name.rstrip("2"), "seed": seed, "clean": clean, "robust": robust})
            lines.append(f"seed {seed} {name}: clean accuracy {clean:.3f}, PGD-{EVAL_PGD_STEPS} eps {EPS} "
                         f"accuracy {robust:.3f}")
        for front, back in PAIRS:
            label = f"{front}->{back}"
            out = args.out / f"seed{seed}" / label.replace(">", "")
            settings = simkit.StitchSettings(layer_a=list(LAYERS), layer_b=list(LAYERS), objective=list(OBJECTIVES),
                                             iri=True, steps=args.stitch_steps, batch_size=128, lr=1e-3, seed=seed)
            result = simkit.stitch(models[front], models[back], digits, settings, run_dir=out,
                                   resume=(out / "inputs.json").is_file(), cache_dir=args.cache_dir,
                                   names=(f"{front} seed {seed}", f"{back} seed {seed}"))
            simkit.save_run(result, out)
            warnings_seen += [f"seed {seed} {label}: {w}" for w in result.summary["warnings"]]
            frames.append(result.tables["stitching"].assign(models=label, seed=seed))
            iri_frames.append(result.tables["iris"].assign(front=front, seed=seed))
            print(f"seed {seed} {label}: done at {time.perf_counter() - started:.0f} s", flush=True)

    table = pd.concat(frames, ignore_index=True)
    iris = pd.concat(iri_frames, ignore_index=True).drop_duplicates(["front", "seed", "layer_a"])
    agg = mean_spread(table, ["models", "setting", "objective", "layer_a"], "penalty")
    accuracy = pd.DataFrame(robust_rows).groupby("model")[["clean", "robust"]].agg(["mean", "std"])
    with pd.option_context("display.width", 220, "display.max_rows", 500):
        lines += ["", "Accuracy on the digits test split (clean and under PGD), mean and std over both inits and "
                  "3 seeds:", accuracy.round(3).to_string()]
        lines += ["", "Penalty (points, B's accuracy − stitched accuracy on the test split), mean ± spread over "
                  "seeds:", fmt(agg).points.unstack("layer_a")[list(LAYERS)].to_string()]
        conv = iris.groupby(["front", "layer_a"], sort=False).iri_converged_fraction.agg(["min", "mean"])
        lines += ["", "IRI converged fraction (relative error ≤ 0.05) per front model and layer, min / mean over "
                  "seeds:", conv.to_string()]
    lines += ["", *verdicts(agg)]
    if warnings_seen:
        lines += ["", "Warnings:", *warnings_seen]
    elapsed = time.perf_counter() - started
    lines += ["", f"Run time {elapsed:.0f} s on {os.cpu_count()} CPU cores; load average before "
              f"{load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (1 min)."]
    text = "\n".join(lines)
    print(text)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(text + "\n", encoding="utf-8")

    combined = simkit.load(args.out / "seed0" / "R-R2")  # a finished run's meta, reused for the combined report
    combined.tables = {"stitching": table[COLUMNS + ["models", "seed"]], "iris": iris}
    combined.summary = {"iri_converged_fraction": float(iris.iri_converged_fraction.min()),
                        "warnings": warnings_seen, "seeds": args.seeds}
    combined.meta = {**combined.meta, "model_a": "R, N (fronts)", "model_b": "R2, N, R, N2 (backs)",
                     "seed": ", ".join(str(s) for s in range(args.seeds))}
    combined.extra = {**combined.extra, "iri_histograms": {}, "iri_examples": {}}
    simkit.save_run(combined, args.out / "combined")
    print(f"combined report: {args.out / 'combined' / 'report.html'}")


if __name__ == "__main__":
    main()
