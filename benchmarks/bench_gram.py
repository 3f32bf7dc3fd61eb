"""Per-batch Gram speed: ``simkit.metrics.gram.linear_gram`` and ``shifted_gram`` against ``x @ x.T``.

The widths are those of ResNet-18/34 layers at 64×64 inputs (stem 65,536; blocks 16,384 … 2,048; head
512), batch 64, float32, 2 threads. Each figure is the best of ``--repeats`` timings of ``--inner`` calls
on the same tensor (so the data is hot in cache; inside a comparison it is not, and the narrow layers take up
to 1.6× longer there).

Usage: python benchmarks/bench_gram.py [--repeats 5] [--inner 20] [--results benchmarks/results/bench_gram.txt]
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import torch

from simkit.metrics.gram import linear_gram, shifted_gram

WIDTHS = (65536, 16384, 8192, 4096, 2048, 512)


def best_ms(fn, repeats: int, inner: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--inner", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results" / "bench_gram.txt")
    args = parser.parse_args()
    torch.set_num_threads(2)
    b = args.batch
    lines = [f"== {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  batch={b} threads=2  "
             f"load average {os.getloadavg()[0]:.1f}"]
    for p in WIDTHS:
        x = torch.randn(b, p)
        out = torch.empty(b, b)
        buf = torch.empty(b * p)
        plain = best_ms(partial(torch.mm, x, x.T, out=out), args.repeats, args.inner)
        ours = best_ms(partial(linear_gram, x, out), args.repeats, args.inner)
        shifted = best_ms(partial(shifted_gram, x, out, buf), args.repeats, args.inner)
        lines.append(f"  p={p:6d}  x@x.T {plain:7.3f} ms   linear_gram {ours:7.3f} ms ({ours / plain:.2f}x)   "
                     f"shifted_gram {shifted:7.3f} ms ({shifted / plain:.2f}x)")
        print(lines[-1], flush=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with args.results.open("a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
