"""Scale-out figures: torchrun on 2 processes vs 1, and capture + compare-from-cache vs a direct compare.

Each measurement is a whole process (wall and CPU time from os.wait4). On a 2-core machine one process
already uses both cores through torch's threads, so the 2-process run gets 1 thread per rank.

Usage: python benchmarks/bench_scale.py [--n 512] [--results benchmarks/results/bench_scale.txt]
(mutual k-NN at n = 50,000: benchmarks/bench_knn.py)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

BIN = Path(sys.executable).parent
MODELS = ["torchvision:resnet18", "torchvision:resnet34"]


def cpu_name() -> str:
    """The processor's model name from /proc/cpuinfo ("unknown" elsewhere)."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


def timed(cmd: list[str], threads: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child and its children) of one command."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{done.stderr[-2000:]}")
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("results") / "bench_scale.txt")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    common = ["--data", "synthetic:3x64x64", "--num-samples", str(args.n), "--reduce", "mean", "--no-report"]
    simkit = str(BIN / "simkit")
    lines = [f"== {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  n={args.n}  load average "
             f"{os.getloadavg()[0]:.1f} (quiet machine wanted: 2 ranks x 1 thread use both cores)  CPU {cpu_name()}"]

    one = timed([simkit, "compare", *MODELS, *common, "--out", str(work / "one")], threads=2)
    two = timed([str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", "--no-python", simkit, "compare",
                 *MODELS, *common, "--out", str(work / "two")], threads=1)
    lines.append(f"compare 1 process x 2 threads  wall {one[0]:7.1f} s  cpu {one[1]:7.1f} s")
    lines.append(f"compare 2 processes x 1 thread wall {two[0]:7.1f} s  cpu {two[1]:7.1f} s  "
                 f"speed-up {one[0] / two[0]:.2f}")

    cap = [timed([simkit, "capture", model, "--data", "synthetic:3x64x64", "--n", str(args.n), "--reduce", "mean",
                  "--out", str(work / f"cache{i}")], threads=2) for i, model in enumerate(MODELS)]
    cached = timed([simkit, "compare", str(work / "cache0"), str(work / "cache1"), "--no-report",
                    "--out", str(work / "cached")], threads=2)
    lines.append(f"capture A {cap[0][0]:.1f} s + capture B {cap[1][0]:.1f} s + compare caches {cached[0]:.1f} s "
                 f"= {cap[0][0] + cap[1][0] + cached[0]:.1f} s wall, against a direct compare {one[0]:.1f} s; "
                 f"each further compare from the caches {cached[0]:.1f} s")
    text = "\n".join(lines)
    print(text)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with args.results.open("a") as handle:
        handle.write(text + "\n")


if __name__ == "__main__":
    main()
