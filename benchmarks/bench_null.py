"""What the default permutation null costs, and how much of minibatch linear CKA is estimator bias.

Design (issue #14, decided before running):
- Question 1: does a null cost <= 5 % of a `simkit compare` run, so that it can be on by default?
  Arms: the quick start (torchvision ResNet-18 vs ResNet-34, random init, synthetic:3x64x64, n = 1024,
  minibatch, b = 64, linear_cka + unbiased_cka) with null = 0 and null = 10, interleaved, `--reps` times;
  exact mode with null = 0 and null = 5 at n = 256. Score: CPU seconds of the comparison in this process
  (user + system, one thread), which the other jobs on a shared machine disturb far less than wall time.
  Expected: minibatch null ~1 % (it permutes b x b Grams, no extra forward pass); exact null tens of %
  (it switches exact CKA from streamed feature sums to stored activations).
- Question 2: how far is minibatch linear_cka (biased HSIC per batch) from the full-data and unbiased
  values? Arms at n = 256: b = 32, 64, 128 and exact mode. Score: mean over all layer pairs.
  Expected: linear_cka falls as b grows and stays above exact; unbiased_cka barely moves.
- Seeds: the models are seeded (A 0, B 1), the data seed 0, the null seed 0; the numbers are
  deterministic, only the timings vary (hence the repetitions).

    python benchmarks/bench_null.py --out benchmarks/results/null_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import torch

import simkit
from simkit.data import load_data
from simkit.models import load_model

METRICS = ["linear_cka", "unbiased_cka"]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(a, b, x, **options) -> dict:
    """One comparison: CPU and wall seconds, per metric the mean value (and null mean, pairs above p95)."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    result = simkit.compare(a, b, x, metrics=METRICS, progress=False, **options)
    row = {**options, "cpu_s": round(cpu_seconds() - cpu, 2), "wall_s": round(time.perf_counter() - wall, 2),
           "load": round(os.getloadavg()[0], 2)}
    table = result.tables["similarity"]
    for metric in METRICS:
        rows = table[table["metric"] == metric]
        row[metric] = round(float(rows["value"].mean()), 4)
        if "null_mean" in rows:
            row[f"{metric}_null_mean"] = round(float(rows["null_mean"].mean()), 4)
            row[f"{metric}_above_p95"] = f"{int((rows['value'] > rows['null_p95']).sum())}/{len(rows)}"
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1024, help="samples for the null-cost arms")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/null_cost.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    a, b = load_model("torchvision:resnet18"), load_model("torchvision:resnet34", seed=1)
    big, small = load_data("synthetic:3x64x64", n=args.n), load_data("synthetic:3x64x64", n=256)
    out = {"setting": "torchvision:resnet18 vs torchvision:resnet34, random init, synthetic:3x64x64, 1 thread",
           "load_start": os.getloadavg(), "null_cost": [], "bias": []}
    run(a, b, small, n=64, null=0)  # warm-up
    for _ in range(args.reps):
        for null in (0, 10):
            out["null_cost"].append(run(a, b, big, mode="minibatch", batch_size=64, null=null))
    for null in (0, 5):
        out["null_cost"].append(run(a, b, small, mode="exact", null=null))
    for batch_size in (32, 64, 128):
        out["bias"].append(run(a, b, small, mode="minibatch", batch_size=batch_size, null=0))
    out["load_end"] = os.getloadavg()
    minibatch = [r for r in out["null_cost"] if r["mode"] == "minibatch"]
    base = sum(r["cpu_s"] for r in minibatch if r["null"] == 0) / args.reps
    with_null = sum(r["cpu_s"] for r in minibatch if r["null"] == 10) / args.reps
    out["minibatch_null10_extra_cpu_percent"] = round(100 * (with_null / base - 1), 1)
    exact = {r["null"]: r["cpu_s"] for r in out["null_cost"] if r["mode"] == "exact"}
    out["exact_null5_extra_cpu_percent"] = round(100 * (exact[5] / exact[0] - 1), 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"minibatch null 10: {out['minibatch_null10_extra_cpu_percent']:+.1f} % CPU; "
          f"exact null 5: {out['exact_null5_extra_cpu_percent']:+.1f} % CPU; wrote {args.out}")


if __name__ == "__main__":
    main()
