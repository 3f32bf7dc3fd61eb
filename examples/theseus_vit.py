"""Network of Theseus, the DINOv2 → Patch-MLP row at small scale: a ViT converted into a Patch-MLP.

Design (written before the runs):

- Question: does converting a trained ViT into a Patch-MLP (``attention-to-mlp``: every attention
  module becomes a token-wise MLP, the class-token readout becomes the mean of the patch tokens)
  give a better Patch-MLP than the same architecture trained from scratch to convergence?
- Data: MNIST-1D (4000 train / 1000 test, length 40), patches of 4 samples → 10 tokens + a class
  token. convert holds out 10% of the training split (seeded) as validation; the test split chooses
  nothing.
- Guide: ``simkit:vit:dim=64,depth=4,heads=4,patch=4`` (mlp_ratio 2), trained 40 epochs inside the
  run (AdamW 1e-3, cosine, batch 128; the best validation epoch is kept).
- Arms: (1) the guide; (2) converted: progressive schedule, 1 − linear CKA, 5 stages (4 attention
  modules, then the readout) of 200 alignment steps at batch 256, BN-free so no recalibration, then
  5 head-only epochs and 30 epochs of full fine-tuning; (3) Patch-MLP from scratch: the converted
  architecture re-initialised, trained with the fine-tuning recipe (AdamW 1e-3, cosine, batch 128)
  for the longer of arm 2's optimizer steps and 60 epochs (``baseline_epochs``), the best validation
  epoch kept (convert's fair baseline; it flags ``still_improving`` when that epoch lies in the last
  10). Also reported: the linear probe on the aligned features before fine-tuning.
- Score: test accuracy of each arm; the gain = converted − scratch, per seed.
- Budget: 3 seeds (0, 1, 2), each ≤ ~7 min on 2 shared CPU cores (≤ 20 min in all).
- Expected outcome (the paper's claim, at small scale): converted > scratch by a few points; both
  below the ViT guide, since a Patch-MLP is an additive model over patches and cannot compare
  patches with one another.

    .venv/bin/python examples/theseus_vit.py --out runs/theseus_vit \\
        --results examples/results/theseus_vit_3seeds.md

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

GUIDE = "simkit:vit:dim=64,depth=4,heads=4,patch=4"
TITLE = "ViT → Patch-MLP on MNIST-1D (attention-to-mlp)"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/theseus_vit"))
    p.add_argument("--results", type=Path, default=None, help="also write the note here")
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds")
    p.add_argument("--guide", default=GUIDE)
    p.add_argument("--guide-epochs", type=float, default=40)
    p.add_argument("--steps-per-stage", type=int, default=200)
    p.add_argument("--head-epochs", type=float, default=5)
    p.add_argument("--finetune-epochs", type=float, default=30)
    p.add_argument("--n", type=int, default=None, help="cap the samples (a quick check)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no-report", action="store_true")
    return p.parse_args()


def settings(args: argparse.Namespace) -> simkit.ConvertSettings:
    return simkit.ConvertSettings(
        recipe="attention-to-mlp", schedule=["progressive"], metric=["cka"], baselines=["scratch"],
        steps_per_stage=args.steps_per_stage, batch_size=256, lr=1e-3, head_epochs=args.head_epochs,
        finetune_epochs=args.finetune_epochs, train_guide=args.guide_epochs, guide_lr=1e-3, val_fraction=0.1,
        baseline_patience=10, baseline_epochs=60, baseline_max_epochs=200, seed=args.seed, seeds=args.seeds, n=args.n)


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
