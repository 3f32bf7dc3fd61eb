"""Cost of each similarity measure in the ResNet-18 vs ResNet-34 setting of issue #2, in one process.

Both models run over the data twice (synthetic 3×SIZE×SIZE, batch 64, stem + every block + head, each
layer reduced to its channel means: with ``--reduce flatten`` the stem alone has 65,536 features per
sample, far beyond what covariance-based measures can hold, see the README table); the second, warm
pass is timed and its activations are kept, and every configuration is then fed the same batches: the
default compare (linear + unbiased CKA, minibatch), each measure alone, and all of them together. For
each: the accumulator's seconds during the pass (``update``), at the end (``compute``), their sum
relative to the two models' forward passes, the path each measure took and the memory it held
(``state_bytes`` / ``stored_bytes`` of ``describe()``). A configuration that draws K ≥ 2 permutations
(``--null K`` or ``--null default``) is run once more without a null: its null's cost per permutation,
``s/perm`` = (seconds with K − seconds without a null) / K, is printed beside ``perms`` = K (what the null adds,
per permutation, to the measure without one, whose path may differ: a null sends the streamed measures
to their stored paths).

Usage: python benchmarks/bench_measures.py [--n 1024] [--size 64] [--null 0|default] [--measures a,b,...]
                                          [--results benchmarks/results/bench_measures.txt]
A quick check that it runs: ``--n 128 --size 32``. Wall seconds on the CPU with 2 threads (set
``--threads``); on a shared machine compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import datetime, timezone
from pathlib import Path

LAYERS = "conv1,bn1,relu,maxpool,layer*.?,avgpool,fc"


def forward_pass(n: int, size: int, batch: int):
    """Activations of every chosen layer of both models per batch, and the seconds of the forwards."""
    import torch
    import torchvision

    from simkit.engine.sources import Tap
    from simkit.layers import resolve_layers

    models = [torchvision.models.resnet18(weights=None).eval(), torchvision.models.resnet34(weights=None).eval()]
    x = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))
    taps = [Tap(m, resolve_layers(m, LAYERS), label, reduce="mean", output_index=None, device=torch.device("cpu"))
            for m, label in zip(models, "ab", strict=True)]
    batches = []
    try:
        start = time.perf_counter()
        for i in range(0, n, batch):
            batches.append([tap.step(x[i:i + batch]) for tap in taps])
        seconds = time.perf_counter() - start
    finally:
        for tap in taps:
            tap.close()
    return batches, seconds


def measure(batches, metrics: list[str], mode: str, null: int | None, batch: int) -> dict:
    """Seconds of update and compute of one accumulator fed every batch, and what describe() says."""
    import warnings

    from simkit.metrics.settings import CompareSettings
    from simkit.metrics.streaming import make_accumulator

    dims_a = [a.shape[1] for a in batches[0][0]]
    dims_b = [b.shape[1] for b in batches[0][1]]
    rows = sum(int(acts_a[0].shape[0]) for acts_a, _ in batches)   # known, as `simkit compare` knows its n
    acc = make_accumulator(CompareSettings(metrics=metrics, mode=mode, null=null), dims_a, dims_b, expected_n=rows)
    start = time.perf_counter()
    for index, (acts_a, acts_b) in enumerate(batches):
        acc.update(acts_a, acts_b, batch_index=index, row_offset=index * batch)
    update = time.perf_counter() - start
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate CCA pairs (head layers) are NaN with a warning
        values = acc.compute()
    final = time.perf_counter() - start
    method = acc.describe()
    nan = sum(int((v["value"] != v["value"]).sum()) for v in values.values())
    held = max(d.get("state_bytes", 0) + d.get("stored_bytes", 0) for d in method.values())
    return {"update": update, "compute": final, "paths": ",".join(sorted({d["path"] for d in method.values()})),
            "bytes": held, "nan": nan, "pairs": len(dims_a) * len(dims_b) * len(metrics),
            "perms": max(int(d.get("null") or 0) for d in method.values())}


def per_permutation(batches, metrics: list[str], mode: str, batch: int, first: dict) -> str:
    """Seconds per permutation of the null of a configuration measured (``first``) with K ≥ 2 permutations:
    the difference to a run without a null, over K; "-" without a null."""
    draws = first["perms"]
    if draws < 2:
        return "-"
    bare = measure(batches, metrics, mode, 0, batch)
    extra = first["update"] + first["compute"] - bare["update"] - bare["compute"]
    return f"{extra / draws:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--size", type=int, default=64, help="image side (issue #2: 64)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--null", default="0", help="permutations for every measure (0 = none; 'default' = "
                        "each measure's default null, as `simkit compare` without --null)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--measures", default="", help="comma-separated (default: all of the catalogue's)")
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results" / "bench_measures.txt")
    args = parser.parse_args()
    args.null = None if args.null == "default" else int(args.null)
    import torch

    torch.set_num_threads(args.threads)
    lines = [f"== {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  resnet18 vs resnet34, n={args.n} "
             f"{args.size}x{args.size} batch {args.batch_size} reduce=mean null={args.null} threads={args.threads} "
             f"load average {os.getloadavg()[0]:.1f}"]

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    forward_pass(args.n, args.size, args.batch_size)  # warm-up: the timed pass is the second, as in bench_compare
    batches, forward = forward_pass(args.n, args.size, args.batch_size)
    la, lb = len(batches[0][0]), len(batches[0][1])
    say(f"forward passes of both models (with capture hooks, second pass): {forward:.2f} s; {la} x {lb} layer pairs")
    from simkit.catalog import METRICS

    chosen = [m for m in args.measures.split(",") if m] or list(METRICS)
    configs = [("default (linear_cka,unbiased_cka)", ["linear_cka", "unbiased_cka"], "minibatch"),
               *((m, [m], "exact") for m in chosen), (f"all {len(chosen)} together", chosen, "exact")]
    say(f"{'measure':36s} {'update s':>9s} {'compute s':>10s} {'x forward':>10s} {'MiB held':>9s} {'NaN':>5s} "
        f"{'perms':>6s} {'s/perm':>8s}  path")
    for label, metrics, mode in configs:
        r = measure(batches, metrics, mode, args.null, args.batch_size)
        total = r["update"] + r["compute"]
        cost = per_permutation(batches, metrics, mode, args.batch_size, r)
        say(f"{label:36s} {r['update']:9.3f} {r['compute']:10.3f} {total / forward:10.3f} "
            f"{r['bytes'] / 2**20:9.1f} {r['nan']:5d} {r['perms']:6d} {cost:>8s}  {r['paths']}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with args.results.open("a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
