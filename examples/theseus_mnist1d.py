"""Network of Theseus on MNIST-1D: a 1-D CNN guide converted into an MLP (``conv-to-mlp``).

The experiment of issue 4: every schedule, the three alignment losses (1 − CKA, 1 − unbiased CKA,
D-MNN), an untrained guide, and the two baselines (MLP from scratch, logit distillation), over several
seeds, reported as mean ± standard deviation of test accuracy.

    .venv/bin/python examples/theseus_mnist1d.py --out runs/theseus_mnist1d            # full budget
    .venv/bin/python examples/theseus_mnist1d.py --seeds 0 --steps-per-stage 150 \\
        --finetune-epochs 15 --arms progressive:cka:trained --out /tmp/theseus_quick     # reduced

Each arm is one ``simkit.convert`` call sharing the seed's guide, trained (in place) by the first arm's
run (``train_guide``); every run directory (result, tables, report.html, checkpoints) is kept under
--out/seed<S>/<arm>, and --resume continues them.
The aggregated table goes to --out/summary.csv and --out/summary.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

import simkit
from simkit.data import load_data
from simkit.models import load_model

ALL_ARMS = ("progressive:cka:trained,progressive:unbiased_cka:trained,progressive:dmnn:trained,"
            "sequential:cka:trained,independent:cka:trained,joint:cka:trained,progressive:cka:random")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/theseus_mnist1d"))
    p.add_argument("--seeds", default="0,1,2", help="comma list of seeds")
    p.add_argument("--arms", default=ALL_ARMS, help="comma list of schedule:metric:guide_init")
    p.add_argument("--baselines", default="scratch,kd", help="comma list of scratch, kd (or none)")
    p.add_argument("--guide", default="simkit:cnn1d:channels=32,layers=3,kernel=5")
    p.add_argument("--guide-epochs", type=float, default=20)
    p.add_argument("--rank", type=int, default=256)
    p.add_argument("--steps-per-stage", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--finetune-epochs", type=float, default=60)
    p.add_argument("--head-epochs", type=float, default=None)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no-report", action="store_true")
    return p.parse_args()


def main() -> None:
    args = parse()
    torch.set_flush_denormal(True)  # a script of its own: the whole process may flush
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    arms = [tuple(a.split(":")) for a in args.arms.split(",") if a.strip()]
    baselines = [] if args.baselines == "none" else [b for b in args.baselines.split(",") if b]
    data = load_data("mnist1d")
    rows = []
    started = time.perf_counter()
    for seed in seeds:
        seed_dir = args.out / f"seed{seed}"
        guide = load_model(args.guide, seed=seed)  # trained by the first arm's run, then shared
        for i, (schedule, metric, init) in enumerate(arms):
            arm_dir = seed_dir / f"{schedule}-{metric}-{init}"
            settings = simkit.ConvertSettings(
                recipe="conv-to-mlp", schedule=[schedule], metric=[metric], guide_init=[init],
                baselines=baselines if i == 0 else [], rank=args.rank, steps_per_stage=args.steps_per_stage,
                batch_size=args.batch_size, finetune_epochs=args.finetune_epochs, head_epochs=args.head_epochs,
                lr=args.lr, train_guide=args.guide_epochs if i == 0 else 0, seed=seed, compare_layers=i == 0)
            result = simkit.convert(guide, data, settings, run_dir=arm_dir, resume=args.resume,
                                    guide_name=args.guide, data_name="mnist1d")
            simkit.save_run(result, arm_dir, report=not args.no_report)
            row = result.tables["runs"].iloc[0].to_dict()
            rows.append(row)
            if i == 0:
                print(f"seed {seed}: guide test accuracy {row['guide_accuracy']:.4f}"
                      + ("" if init == "trained" else f" ({init} guide)"))
            print(f"  {schedule:<12} {metric:<13} {init:<8} probe {row['probe_accuracy']:.4f}  "
                  f"converted {row['converted_accuracy']:.4f}  ({row['seconds']:.0f} s)")
            if i == 0:
                for b in baselines:
                    print(f"  baseline {b:<8} {row[f'{b}_accuracy']:.4f}")
    table = aggregate(pd.DataFrame(rows), baselines)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "summary.csv", index=False)
    text = markdown(table, seeds, args, time.perf_counter() - started)
    (args.out / "summary.md").write_text(text)
    print(text)


def aggregate(runs: pd.DataFrame, baselines: list[str]) -> pd.DataFrame:
    """Mean, standard deviation and count over seeds, per arm and per baseline."""
    out = []
    for (schedule, metric, init), part in runs.groupby(["schedule", "metric", "guide_init"], sort=False):
        for what, column in (("converted", "converted_accuracy"), ("linear probe", "probe_accuracy")):
            values = part[column].astype(float)
            out.append({"method": f"{schedule} · {metric} · {init} guide", "score": what,
                        "mean": values.mean(), "std": values.std(ddof=1) if len(values) > 1 else float("nan"),
                        "seeds": len(values), "seconds": part["seconds"].mean()})
    first = runs.drop_duplicates("seed")
    for b in baselines:
        values = first[f"{b}_accuracy"].dropna().astype(float)
        out.append({"method": {"scratch": "MLP from scratch", "kd": "logit distillation"}[b], "score": "converted",
                    "mean": values.mean(), "std": values.std(ddof=1) if len(values) > 1 else float("nan"),
                    "seeds": len(values), "seconds": float("nan")})
    values = first["guide_accuracy"].astype(float)
    out.append({"method": "guide (CNN)", "score": "trained", "mean": values.mean(),
                "std": values.std(ddof=1) if len(values) > 1 else float("nan"), "seeds": len(values),
                "seconds": float("nan")})
    return pd.DataFrame(out)


def markdown(table: pd.DataFrame, seeds, args, seconds: float) -> str:
    lines = [f"MNIST-1D conv-to-mlp, seeds {seeds}, rank {args.rank}, {args.steps_per_stage} steps/stage, "
             f"batch {args.batch_size}, {args.finetune_epochs} fine-tuning epochs, guide {args.guide_epochs} "
             f"epochs; wall time {seconds:.0f} s", "",
             "| method | score | test accuracy (%) | seeds | s/arm |", "|---|---|---|---|---|"]
    for _, r in table.iterrows():
        spread = "" if r["std"] != r["std"] else f" ± {100 * r['std']:.1f}"
        secs = "" if r["seconds"] != r["seconds"] else f"{r['seconds']:.0f}"
        lines.append(f"| {r['method']} | {r['score']} | {100 * r['mean']:.1f}{spread} | {r['seeds']} | {secs} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
