"""Network of Theseus, the ResNet-50 → ResNet-18 row at small scale: a deep residual CNN converted
into a shallow one (``deep-to-shallow``).

Design (written before the runs):

- Question: is a shallow residual CNN converted from a deep one (each group of consecutive guide
  blocks replaced by one fresh block and aligned to the group's representation) better than the
  same shallow CNN trained from scratch to convergence?
- Data: MNIST-1D (4000 train / 1000 test, length 40). convert holds out 10% of the training split
  (seeded) as validation; the test split chooses nothing.
- Guide: ``simkit:cnn1d:channels=32,layers=8,kernel=3,residual=true`` (BatchNorm; blocks 1–7 are
  residual, 3-sample kernels as in ResNets, receptive field 17 samples), trained 30 epochs inside the
  run (AdamW 1e-3, cosine, batch 128; the best validation epoch is kept).
- Target: ``group=4``: blocks 0–3 → one fresh copy of block 0 (aligned on the group's output: block
  0 changes the width), blocks 4–7 → one fresh residual block (aligned on output − input, the sum of
  the group's residual branches). 8 → 2 conv layers, receptive field 5: a 4:1 depth cut (ResNet-50 →
  ResNet-18 is 16 → 8 blocks, but 50 → 18 layers), chosen so the shallow net is clearly weaker in
  depth than its guide.
- Arms: (1) the guide; (2) converted: progressive, 1 − linear CKA, 2 stages of 200 alignment steps
  at batch 256, BatchNorm recalibrated after each stage, 5 head-only epochs, 30 fine-tuning epochs;
  (3) the shallow CNN from scratch: the re-initialised target trained with the fine-tuning recipe
  (AdamW 1e-3, cosine, batch 128) for the longer of arm 2's optimizer steps and 200 epochs
  (``baseline_epochs``), the best validation epoch kept; convert flags ``still_improving`` when that
  epoch lies in the last 10. (A first run with convert's default 60 epochs flagged seed 0 as still
  improving, hence 200.) Also reported: the linear probe after alignment.
- Score: test accuracy of each arm; the gain = converted − scratch, per seed.
- Budget: 3 seeds (0, 1, 2), each ≤ ~5 min on 2 shared CPU cores (≤ 20 min in all).
- Expected outcome (the paper's claim, at small scale): converted ≥ scratch (a small gain), both
  below the deep guide.

    .venv/bin/python examples/theseus_deep_to_shallow.py --out runs/theseus_deep_to_shallow \\
        --results examples/results/theseus_deep_to_shallow_3seeds.md

One ``simkit.convert`` call runs every seed (``seeds``; run directory --out with report.html; --resume
continues it). The note (the aggregate table: mean, std, 95 % t interval per arm and the difference
from scratch paired by seed) goes to --out/summary.md (and to --results when given).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch

import simkit
from simkit.data import load_data
from simkit.models import load_model

GUIDE = "simkit:cnn1d:channels=32,layers=8,kernel=3,residual=true"
TITLE = "Deep → shallow residual CNN on MNIST-1D (deep-to-shallow)"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/theseus_deep_to_shallow"))
    p.add_argument("--results", type=Path, default=None, help="also write the note here")
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds")
    p.add_argument("--guide", default=GUIDE)
    p.add_argument("--group", type=int, default=4, help="guide blocks per target block")
    p.add_argument("--guide-epochs", type=float, default=30)
    p.add_argument("--steps-per-stage", type=int, default=200)
    p.add_argument("--head-epochs", type=float, default=5)
    p.add_argument("--finetune-epochs", type=float, default=30)
    p.add_argument("--n", type=int, default=None, help="cap the samples (a quick check)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no-report", action="store_true")
    return p.parse_args()


def settings(args: argparse.Namespace) -> simkit.ConvertSettings:
    return simkit.ConvertSettings(
        recipe="deep-to-shallow", group=args.group, schedule=["progressive"], metric=["cka"],
        baselines=["scratch"], steps_per_stage=args.steps_per_stage, batch_size=256, lr=1e-3,
        head_epochs=args.head_epochs, finetune_epochs=args.finetune_epochs, train_guide=args.guide_epochs,
        guide_lr=1e-3, val_fraction=0.1, baseline_patience=10, baseline_epochs=200, baseline_max_epochs=200, seed=args.seed, seeds=args.seeds, n=args.n)


def main() -> None:
    args = parse()
    torch.set_flush_denormal(True)  # a script of its own: the whole process may flush
    data = load_data("mnist1d")
    started = time.perf_counter()
    result = simkit.convert(lambda seed: load_model(args.guide, seed=seed), data, settings(args), run_dir=args.out,
                            resume=args.resume, guide_name=args.guide, data_name="mnist1d", progress=False)
    simkit.save_run(result, args.out, report=not args.no_report)
    text = (f"# {TITLE}\n\nCommand: `python {shlex.join(sys.argv)}`; wall time "
            f"{time.perf_counter() - started:.0f} s.\n\n" + result.tables["aggregate"].to_string() + "\n")
    for path in [args.out / "summary.md"] + ([args.results] if args.results else []):
        path.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
